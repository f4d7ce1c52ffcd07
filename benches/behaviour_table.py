"""Before and after from benches/behaviour-ab.sh's logs: every table row each benchmark printed,
cell by cell (tables numbered in the order the benchmark printed them), the median over runs of
each build with the runs in brackets.
Usage: python3 benches/behaviour_table.py [DIR=target/behaviour-ab]"""
import collections
import glob
import os
import re
import statistics
import sys

where = sys.argv[1] if len(sys.argv) > 1 else "target/behaviour-ab"
number = re.compile(r"^-?[\d.]+")
# (benchmark, table, row label) -> column -> arm -> [values]
cells = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
heads = {}
for path in sorted(glob.glob(f"{where}/*.log")):
    name, arm, _run = os.path.basename(path)[:-4].rsplit("-", 2)
    table = 0
    head = None
    for line in open(path):
        line = line.strip()
        if not line.startswith("|"):
            if head is not None:
                table += 1
            head = None
            continue
        row = [c.strip() for c in line.strip("|").split("|")]
        if set(line) <= set("|-: "):
            continue
        if head is None:
            head = row
            continue
        label = tuple(c for c in row if not number.match(c))[:2]
        key = (name, table, " / ".join(label))
        heads[key] = head
        # A header may repeat a name (attainment and batch tokens per rate): keep the position.
        for at, (col, cell) in enumerate(zip(head, row)):
            m = number.match(cell)
            if m and col:
                cells[key][(at, col)][arm].append(float(m.group()))


def show(values):
    if not values:
        return "–"
    return f"{statistics.median(values):g} ({', '.join(f'{v:g}' for v in values)})"


print("| benchmark | table | row | column | before | after |")
print("|---|---|---|---|---|---|")
for (name, table, label), columns in cells.items():
    for (_at, col), arms in columns.items():
        print(f"| {name} | {table + 1} | {label} | {col} | {show(arms['before'])} | {show(arms['after'])} |")
