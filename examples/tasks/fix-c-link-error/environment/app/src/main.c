#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "strutil.h"
#include "mathutil.h"

static int usage(void)
{
    fprintf(stderr, "usage: strtool reverse STR | upper STR | gcd A B | lcm A B\n");
    return 2;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "reverse") == 0) {
        puts(str_reverse(argv[2]));
    } else if (argc == 3 && strcmp(argv[1], "upper") == 0) {
        puts(str_upper(argv[2]));
    } else if (argc == 4 && strcmp(argv[1], "gcd") == 0) {
        printf("%ld\n", gcd(atol(argv[2]), atol(argv[3])));
    } else if (argc == 4 && strcmp(argv[1], "lcm") == 0) {
        printf("%ld\n", lcm(atol(argv[2]), atol(argv[3])));
    } else {
        return usage();
    }
    return 0;
}
