#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
p = "units.py"
s = open(p).read()
s = s.replace('"mi": 1.609, "ft": 0.3048, "in": 0.254}', '"mi": 1609.344, "ft": 0.3048, "in": 0.0254}')
s = s.replace("return value - 32 * 5 / 9", "return (value - 32) * 5 / 9")
s = s.replace('"oz": 0.45359237 * 16}', '"oz": 0.45359237 / 16}')
s = s.replace("return value - 273\n", "return value - 273.15\n")
s = s.replace("return value + 273\n", "return value + 273.15\n")
s = s.replace("return value * table[from_unit] * table[to_unit]", "return value * table[from_unit] / table[to_unit]")
open(p, "w").write(s)
PY
python3 -c 'from units import convert; print(convert(5, "km", "mi"), convert(212, "F", "C"))'
