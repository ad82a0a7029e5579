#include <stdio.h>
#include "vec.h"

static int failures = 0;
#define CHECK(cond) do { if (!(cond)) { printf("FAIL: %s (line %d)\n", #cond, __LINE__); failures++; } } while (0)

int main(void)
{
    vec v;
    vec_init(&v);
    CHECK(v.len == 0);
    for (int i = 1; i <= 100; i++)
        CHECK(vec_push(&v, i) == 0);
    CHECK(v.len == 100);
    CHECK(vec_sum(&v) == 5050);
    CHECK(vec_max(&v) == 100);
    vec_push(&v, -7);
    CHECK(vec_max(&v) == 100);
    CHECK(vec_sum(&v) == 5043);
    vec_free(&v);
    CHECK(v.len == 0 && v.data == NULL);
    if (failures) {
        printf("%d check(s) failed\n", failures);
        return 1;
    }
    printf("all tests passed\n");
    return 0;
}
