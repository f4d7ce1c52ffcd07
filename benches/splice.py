"""Replaces the text between `<!-- NAME:start -->` and `<!-- NAME:end -->` in whichever
benchmarks page holds them (BENCHMARKS.md or docs/benchmarks/*.md) with the contents of a file.
Usage: python3 benches/splice.py NAME FILE
With SPLICE=0 in the environment it changes nothing (an A/B run, whose table is not the
recorded one)."""
import glob
import os
import sys

if os.environ.get("SPLICE", "1") == "0":
    print("SPLICE=0: no page updated", file=sys.stderr)
    sys.exit(0)

name, path = sys.argv[1], sys.argv[2]
table = open(path).read()
start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
for page in ["BENCHMARKS.md", *sorted(glob.glob("docs/benchmarks/*.md"))]:
    text = open(page).read()
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        open(page, "w").write(head + start + "\n" + table + end + tail)
        print(f"{page} updated", file=sys.stderr)
        break
else:
    print(f"no page holds the {name} markers", file=sys.stderr)
