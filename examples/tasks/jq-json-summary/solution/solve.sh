#!/bin/bash
set -euo pipefail
cat > /app/summarize.sh <<'SH'
#!/bin/bash
set -euo pipefail
jq '
  [ .[] | select(.status == "paid") ]
  | group_by(.customer.email | ascii_downcase)
  | map({
      customer: (.[0].customer.email | ascii_downcase),
      orders: length,
      items: ([.[].items[].qty] | add // 0),
      total_cents: ([.[].items[] | .qty * .price_cents] | add // 0)
    })
  | sort_by(-.total_cents, .customer)
' "$1"
SH
chmod +x /app/summarize.sh
/app/summarize.sh /app/data/orders.json
