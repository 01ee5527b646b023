import sys

sys.path.insert(0, "/app")
import stats  # noqa: E402

failures = []


def check(name, cond):
    if not cond:
        failures.append(name)


check("odd sorted", stats.median([1, 2, 3]) == 2)
check("odd unsorted", stats.median([9, 1, 5]) == 5)
check("even", stats.median([4, 1, 3, 2]) == 2.5)
check("single", stats.median([7]) == 7)
check("floats", abs(stats.median([0.5, 0.25]) - 0.375) < 1e-12)
try:
    stats.median([])
    failures.append("empty raises")
except ValueError:
    pass
check("mean unchanged", stats.mean([1, 2, 3, 6]) == 3)
check("spread unchanged", stats.spread([3, 9, 4]) == 6)
print("failures:", failures)
sys.exit(1 if failures else 0)
