/* rollavg K  --  rolling average over a window of K values.
 *
 * Reads up to MAX_VALUES integers from standard input (whitespace separated;
 * reading stops at end of input or at the first token that is not an
 * integer; values after the first MAX_VALUES are ignored).  For every window
 * of K consecutive values it prints one line
 *
 *     <end>: <mean>
 *
 * where <end> is the 1-based position of the last value in the window and
 * <mean> the mean of the K values with two decimals.  Exit status: 0 on
 * success, 1 (with a message on stderr) if there are fewer than K values,
 * 2 on bad usage (missing K or K < 1).
 */
#include <stdio.h>
#include <stdlib.h>

#define MAX_VALUES 1000

int main(int argc, char **argv)
{
    int vals[MAX_VALUES];
    int n = 0;
    long k;

    if (argc != 2 || (k = strtol(argv[1], NULL, 10)) < 1) {
        fprintf(stderr, "usage: rollavg K\n");
        return 2;
    }
    while (n <= MAX_VALUES && scanf("%d", &vals[n]) == 1)
        n++;
    if (n < k) {
        fprintf(stderr, "need at least %ld values, got %d\n", k, n);
        return 1;
    }
    for (int i = k; i < n; i++) {
        long sum = 0;
        for (int j = i - k; j < i; j++)
            sum += vals[j];
        printf("%d: %.2f\n", i + 1, (double)sum / k);
    }
    return 0;
}
