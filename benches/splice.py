"""Replaces the text between `<!-- NAME:start -->` and `<!-- NAME:end -->` in BENCHMARKS.md with
the contents of a file. Usage: python3 benches/splice.py NAME FILE"""
import sys

name, path = sys.argv[1], sys.argv[2]
table = open(path).read()
start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
text = open("BENCHMARKS.md").read()
if start in text and end in text:
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    open("BENCHMARKS.md", "w").write(head + start + "\n" + table + end + tail)
    print("BENCHMARKS.md updated", file=sys.stderr)
