#!/bin/bash
set -euo pipefail
cat > /app/count_signups.sh <<'SH'
#!/bin/bash
set -euo pipefail
export LC_ALL=C
tr -d '\r' < "$1" \
  | sed -e 's/^[[:blank:]]*//' -e 's/[[:blank:]]*$//' \
  | { grep -v -e '^$' -e '^#' || true; } \
  | tr '[:upper:]' '[:lower:]' \
  | sort | uniq -c \
  | awk '{print $1, $2}' \
  | sort -k1,1nr -k2,2
SH
chmod +x /app/count_signups.sh
/app/count_signups.sh /app/data/signups.txt
