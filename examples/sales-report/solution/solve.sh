#!/bin/bash
set -e
python3 - <<'PY'
import csv, json
from collections import Counter, defaultdict
from decimal import Decimal

revenue = defaultdict(Decimal)
units = Counter()
skipped = 0
with open("/app/data/sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        if not row["units"].isdigit():
            skipped += 1
            continue
        n = int(row["units"])
        revenue[row["region"]] += n * Decimal(row["unit_price"])
        units[row["product"]] += n
report = {
    "total_revenue": float(round(sum(revenue.values()), 2)),
    "revenue_by_region": {r: float(round(v, 2)) for r, v in sorted(revenue.items())},
    "top_product": units.most_common(1)[0][0],
    "skipped_rows": skipped,
}
with open("/app/report.json", "w") as f:
    json.dump(report, f, indent=2)
PY
