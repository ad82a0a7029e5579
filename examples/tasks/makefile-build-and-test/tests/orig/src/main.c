#include <stdio.h>
#include <stdlib.h>
#include "vec.h"

/* vecdemo N1 N2 ... : prints "count=<n> sum=<s> max=<m>" */
int main(int argc, char **argv)
{
    vec v;
    vec_init(&v);
    for (int i = 1; i < argc; i++)
        vec_push(&v, atoi(argv[i]));
    if (v.len == 0) {
        printf("count=0\n");
        return 0;
    }
    printf("count=%zu sum=%ld max=%d\n", v.len, vec_sum(&v), vec_max(&v));
    vec_free(&v);
    return 0;
}
