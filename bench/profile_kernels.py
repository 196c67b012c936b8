"""Group ncu's per-kernel times (`--metrics gpu__time_duration.sum --csv`)
of the last of `steps` steps (at least 3: the last two must repeat), by kernel name, for one or more
profiles side by side.

Usage: python3 bench/profile_kernels.py STEPS NAME=FILE.csv [NAME=FILE.csv ...]
Prints, per profile, a table: kernel, calls, total us, share; and a total line.
"""
import csv
import sys
from collections import OrderedDict


def kernels(path):
    rows = []
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "ns")
        v = float(r["Metric Value"].replace(",", ""))
        scale = {"ns": 1e-3, "nsecond": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
        rows.append((r["Kernel Name"], v * scale.get(unit, 1e-3)))
    return rows


def last_step(rows, steps):
    """The kernels of the last step: the longest tail that the kernels
    before it repeat (the first step may launch one-time work of its own)."""
    names = [n for n, _ in rows]
    for p in range(len(rows) // 2, 0, -1):
        if names[-p:] == names[-2 * p:-p]:
            return rows[-p:]
    sys.exit(f"profile_kernels: no two equal steps at the end of {len(rows)} kernels"
             f" (run {steps} steps or more)")


def short(name):
    name = name.split("(")[0]
    return name if len(name) <= 70 else name[:67] + "..."


def main():
    steps = int(sys.argv[1])
    for spec in sys.argv[2:]:
        label, path = spec.split("=", 1)
        rows = last_step(kernels(path), steps)
        groups = OrderedDict()
        for name, us in rows:
            n, t = groups.get(short(name), (0, 0.0))
            groups[short(name)] = (n + 1, t + us)
        total = sum(t for _, t in groups.values())
        print(f"\n## {label}: {len(rows)} kernels, {total:.1f} us")
        print(f"| kernel | calls | us | share |\n|---|---|---|---|")
        for name, (n, t) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
            print(f"| `{name}` | {n} | {t:.1f} | {100 * t / total:.1f}% |")
        print(f"| total | {len(rows)} | {total:.1f} | 100% |")


main()
