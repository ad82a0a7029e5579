#!/bin/bash
set -euo pipefail
cat > /app/aggregate.sh <<'SH'
#!/bin/bash
# Usage: aggregate.sh FILE.csv  -> per-region summary on stdout
set -euo pipefail
echo "region,orders,units,revenue"
awk -F',' '
  NR == 1 { next }
  /^[[:space:]]*$/ { next }
  {
    r = tolower($2); gsub(/^[[:space:]]+|[[:space:]]+$/, "", r)
    split($5, p, "."); cents = p[1] * 100 + substr(p[2] "00", 1, 2)
    orders[r]++; units[r] += $4; rev[r] += $4 * cents
  }
  END { for (r in orders) printf "%s,%d,%d,%d.%02d\t%d\n", r, orders[r], units[r], int(rev[r] / 100), rev[r] % 100, rev[r] }
' "$1" | sort -t "$(printf '\t')" -k2,2nr -k1,1 | cut -f1
SH
chmod +x /app/aggregate.sh
/app/aggregate.sh /app/data/sales.csv > /app/report.csv
cat /app/report.csv
