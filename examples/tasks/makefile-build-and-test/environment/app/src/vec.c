#include <stdlib.h>
#include "vec.h"

void vec_init(vec *v)
{
    v->data = NULL;
    v->len = 0;
    v->cap = 0;
}

int vec_push(vec *v, int x)
{
    if (v->len == v->cap) {
        size_t ncap = v->cap ? v->cap * 2 : 4;
        int *p = realloc(v->data, ncap * sizeof *p);
        if (!p)
            return -1;
        v->data = p;
        v->cap = ncap;
    }
    v->data[v->len++] = x;
    return 0;
}

long vec_sum(const vec *v)
{
    long s = 0;
    for (size_t i = 0; i < v->len; i++)
        s += v->data[i];
    return s;
}

int vec_max(const vec *v)
{
    int m = v->data[0];
    for (size_t i = 1; i < v->len; i++)
        if (v->data[i] > m)
            m = v->data[i];
    return m;
}

void vec_free(vec *v)
{
    free(v->data);
    vec_init(v);
}
