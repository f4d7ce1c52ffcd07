#!/usr/bin/env python3
"""How full one backend ran, and which streams fell under a speed target, from a gateway log.

A goodput figure moves by a tenth between two runs of one build; these two counts separate
builds in one run (docs/benchmarks/routing.md, "The shared device at 3 req/s: the ladder holds
it, the loss came after"): the share of its time a backend decoded at each number of the
phase's streams, and the streams under the target per route.

Usage: benches/decode_levels.py MIN_TPS CLASS BACKEND PREFIX GATEWAY_LOG...
  PREFIX: the request ids of one phase (`s1-r3000` is goodput.sh's 3 req/s phase of run 1).
Reads the request lines (`tpsgate::request`) of status 200 whose id starts with PREFIX; a
stream's speed is its tokens after the first over its time after the first token, and it
decodes from its first token to its end. Streams of every class count toward the levels;
those of CLASS toward the speed counts. A line without a first token (not streamed) is left
out, and counted as such.
"""

import collections
import datetime
import re
import sys

FIELD = re.compile(r'(\w+)=("[^"]*"|\S+)')


def requests(path, prefix):
    """The phase's answered requests of the log at `path`: (end, fields), fields unquoted."""
    for line in open(path):
        if "request_id=" not in line:
            continue
        fields = {k: v.strip('"') for k, v in FIELD.findall(line)}
        if not fields.get("request_id", "").startswith(prefix) or fields.get("status") != "200":
            continue
        end = datetime.datetime.fromisoformat(line.split()[0].rstrip("Z")).timestamp()
        yield end, fields


def summary(path, min_tps, class_name, backend, prefix):
    """One line: streams served and under `min_tps` (per route), and the time share per level."""
    served = collections.Counter()
    slow = collections.Counter()
    edges = []
    unstreamed = 0
    for end, f in requests(path, prefix):
        if not {"ttft_ms", "total_ms", "output_tokens"} <= f.keys():
            unstreamed += 1
            continue
        ttft_s = float(f["ttft_ms"]) / 1e3
        decode_s = float(f["total_ms"]) / 1e3 - ttft_s
        if f.get("backend") == backend:
            edges += [(end - decode_s, 1), (end, -1)]
        if f.get("class") != class_name:
            continue
        route = f.get("route", "-")
        served[route] += 1
        tokens = int(f["output_tokens"])
        if decode_s <= 0 or (tokens - 1) / decode_s < min_tps:
            slow[route] += 1
    time_at = collections.Counter()
    level, last = 0, None
    for at, step in sorted(edges):
        if last is not None:
            time_at[level] += at - last
        level, last = level + step, at
    total = sum(time_at.values()) or 1.0
    levels = " ".join(
        f"{n}:{time_at[n] / total:.0%}" for n in sorted(time_at) if time_at[n] / total >= 0.01
    )
    routes = " ".join(f"{r} {slow[r]}/{served[r]}" for r in sorted(served))
    return (
        f"{path}: {sum(slow.values())} of {sum(served.values())} under {min_tps:g} tok/s "
        f"({routes}); {backend} decoding {levels}"
        + (f"; {unstreamed} not streamed, left out" if unstreamed else "")
    )


def main():
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    try:
        min_tps = float(sys.argv[1])
    except ValueError:
        sys.exit(f"MIN_TPS must be a number of tokens a second, not {sys.argv[1]!r}\n{__doc__}")
    class_name, backend, prefix = sys.argv[2:5]
    for path in sys.argv[5:]:
        print(summary(path, min_tps, class_name, backend, prefix))


if __name__ == "__main__":
    main()
