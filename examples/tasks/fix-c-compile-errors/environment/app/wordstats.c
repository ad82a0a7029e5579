/* wordstats: read text on stdin and print line/word/byte counts and the
 * longest word (the first one if several have the same length). */
#include <stdio.h>
#include <ctype.h>

#define MAX_WORD 256

struct stats {
    long lines;
    long words;
    long chars;
    char longest[MAX_WORD];
};

static void finish_word(struct stats *st, const char *word, size_t len)
{
    if (len == 0)
        return;
    st->words++;
    if (len > strlen(st->longest)) {
        memcpy(st->longest, word, len);
        st->longest[len] = '\0';
    }
}

int main(void)
{
    struct stats st = {0};
    char word[MAX_WORD];
    size_t wlen = 0;
    int c;

    while ((c = getchar()) != EOF) {
        st.chars++;
        if (c == '\n')
            st.lines++
        if (isspace(c)) {
            finish_word(&st, word, wlen);
            wlen = 0;
        } else if (wlen < MAX_WORD - 1) {
            word[wlen++] = (char)c;
        }
    }
    finish_word(st, word, wlen);

    printf("lines=%ld words=%ld chars=%ld longest=%s\n",
           st.lines, st.word, st.chars, st.longest);
    return 0;
}
