#!/bin/bash
set -euo pipefail
cat > /app/report.sql <<'SQL'
WITH per_order AS (
  SELECT o.id, o.customer_id,
         COALESCE((SELECT SUM(i.quantity * i.unit_price_cents)
                   FROM order_items i WHERE i.order_id = o.id), 0) AS cents
  FROM orders o
  WHERE o.status = 'completed'
    AND o.ordered_at >= '2024-01-01' AND o.ordered_at < '2025-01-01'
)
SELECT c.name AS customer_name,
       COALESCE(c.country, 'unknown') AS country,
       COUNT(*) AS orders,
       printf('%d.%02d', SUM(p.cents) / 100, SUM(p.cents) % 100) AS total
FROM per_order p JOIN customers c ON c.id = p.customer_id
GROUP BY c.id
HAVING COUNT(*) >= 2
ORDER BY SUM(p.cents) DESC, c.name ASC;
SQL
sqlite3 -csv -header /app/shop.db < /app/report.sql > /app/report.csv
head -5 /app/report.csv
