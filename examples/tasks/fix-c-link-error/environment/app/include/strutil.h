#ifndef STRUTIL_H
#define STRUTIL_H
#include <stddef.h>
/* Reverse s in place and return it. */
char *str_reverse(char *s);
/* Upper-case ASCII letters of s in place and return it. */
char *str_upper(char *s);
#endif
