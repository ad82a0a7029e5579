#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
p = "wordstats.c"
s = open(p).read()
s = s.replace("#include <ctype.h>\n", "#include <ctype.h>\n#include <string.h>\n")
s = s.replace("st.lines++\n", "st.lines++;\n")
s = s.replace("finish_word(st, word, wlen);", "finish_word(&st, word, wlen);")
s = s.replace("st.lines, st.word, st.chars", "st.lines, st.words, st.chars")
open(p, "w").write(s)
PY
gcc -Wall -Werror -std=c11 -o wordstats wordstats.c
