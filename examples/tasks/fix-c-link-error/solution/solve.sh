#!/bin/bash
set -euo pipefail
cd /app
# The definition did not match the declared name, and mathutil.o was never linked.
sed -i 's/^char \*reverse_string(char \*s)/char *str_reverse(char *s)/' src/strutil.c
sed -i 's|^OBJS = src/main.o src/strutil.o$|OBJS = src/main.o src/strutil.o src/mathutil.o|' Makefile
make clean
make
