"""The gateway's passive timings against vLLM's own, per server, from the /metrics snapshots
benches/vllm-fleet.sh takes around each arm (DIR/<arm>-<run>/: vllm-N.before and vllm-N.after
from server N, gateway.after from the gateway, which starts fresh for every arm).

Per server, over every arm and run: the mean TTFT and the mean time per output token as the
gateway timed them from its side of the wire (`gen_ai_server_time_to_first_token_seconds`,
`gen_ai_server_time_per_output_token_seconds` for backend `vllm-N`), and as vLLM's own
histograms say over the same requests (`vllm:time_to_first_token_seconds`,
`vllm:request_time_per_output_token_seconds`, the difference between the two snapshots).
Means, from each histogram's sum and count, so no bucket bounds blur them.

Usage: passive_vs_vllm.py DIR"""
import collections
import pathlib
import re
import sys

SAMPLE = re.compile(r'^([a-zA-Z_:]+)(?:\{([^}]*)\})?\s+([0-9.eE+-]+|NaN)$')


def sums(path, metric, labels=None):
    """(sum, count) of a histogram in a Prometheus text file, over the series whose labels
    include `labels`."""
    total = {"sum": 0.0, "count": 0.0}
    if not path.exists():
        return total["sum"], total["count"]
    for line in path.read_text().splitlines():
        m = SAMPLE.match(line)
        if not m:
            continue
        name, series, value = m.groups()
        for part in ("sum", "count"):
            if name == f"{metric}_{part}" and all(
                f'{k}="{v}"' in (series or "") for k, v in (labels or {}).items()
            ):
                total[part] += float(value)
    return total["sum"], total["count"]


def main(root):
    # server -> [gateway ttft sum, count, tpot sum, count, vllm ttft sum, count, tpot sum, count]
    acc = collections.defaultdict(lambda: [0.0] * 8)
    for arm in sorted(p for p in root.iterdir() if p.is_dir()):
        for before in arm.glob("vllm-*.before"):
            server = before.stem
            after = before.with_suffix(".after")
            gateway = arm / "gateway.after"
            row = acc[server]
            for i, (path, metric, labels) in enumerate([
                (gateway, "gen_ai_server_time_to_first_token_seconds", {"backend": server}),
                (gateway, "gen_ai_server_time_per_output_token_seconds", {"backend": server}),
            ]):
                s, c = sums(path, metric, labels)
                row[2 * i] += s
                row[2 * i + 1] += c
            for i, metric in enumerate(["vllm:time_to_first_token_seconds",
                                        "vllm:request_time_per_output_token_seconds"]):
                s1, c1 = sums(after, metric)
                s0, c0 = sums(before, metric)
                row[4 + 2 * i] += s1 - s0
                row[4 + 2 * i + 1] += c1 - c0

    def mean_ms(s, c):
        return f"{1e3 * s / c:.1f}" if c else "—"

    print("Per server, every arm and run: mean TTFT and mean time per output token, as the "
          "gateway timed them passively and as vLLM's own histograms say (ms).\n")
    print("| server | requests (gateway / vLLM) | TTFT gateway | TTFT vLLM | TPOT gateway | TPOT vLLM |")
    print("|---|---|---|---|---|---|")
    for server, r in sorted(acc.items()):
        print(f"| {server} | {r[1]:.0f} / {r[5]:.0f} | {mean_ms(r[0], r[1])} | {mean_ms(r[4], r[5])} "
              f"| {mean_ms(r[2], r[3])} | {mean_ms(r[6], r[7])} |")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
