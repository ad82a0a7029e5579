#include "mathutil.h"

long gcd(long a, long b)
{
    if (a < 0) a = -a;
    if (b < 0) b = -b;
    while (b != 0) {
        long t = a % b;
        a = b;
        b = t;
    }
    return a;
}

long lcm(long a, long b)
{
    if (a == 0 || b == 0)
        return 0;
    long g = gcd(a, b);
    long r = a / g * b;
    return r < 0 ? -r : r;
}
