#ifndef VEC_H
#define VEC_H
#include <stddef.h>

/* A growable array of ints. */
typedef struct {
    int *data;
    size_t len;
    size_t cap;
} vec;

void vec_init(vec *v);
int vec_push(vec *v, int x);      /* 0 on success, -1 on allocation failure */
long vec_sum(const vec *v);
int vec_max(const vec *v);        /* undefined for empty vectors */
void vec_free(vec *v);
#endif
