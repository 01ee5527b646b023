import json
import sys

try:
    with open("/app/report.json") as f:
        report = json.load(f)
except (OSError, ValueError) as e:
    print("FAIL: cannot read /app/report.json:", e)
    sys.exit(1)

expected = {
    "total_revenue": 394.97,
    "revenue_by_region": {"north": 47.5, "south": 30.0, "east": 217.48, "west": 99.99},
    "top_product": "widget",
    "skipped_rows": 2,
}
ok = True
for key, want in expected.items():
    got = report.get(key)
    if isinstance(want, dict):
        good = (
            isinstance(got, dict)
            and set(got) == set(want)
            and all(abs(got[k] - v) < 0.005 for k, v in want.items())
        )
    elif isinstance(want, float):
        good = isinstance(got, int | float) and abs(got - want) < 0.005
    else:
        good = got == want
    print(("PASS" if good else "FAIL"), key, got)
    ok &= good
sys.exit(0 if ok else 1)
