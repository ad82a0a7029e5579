#ifndef MATHUTIL_H
#define MATHUTIL_H
/* Greatest common divisor of |a| and |b| (gcd(0, 0) == 0). */
long gcd(long a, long b);
/* Least common multiple of |a| and |b| (0 if either is 0). */
long lcm(long a, long b);
#endif
