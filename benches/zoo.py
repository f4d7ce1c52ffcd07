"""A zoo of fleets drawn from a seed, for benches/zoo.sh: 2 to 6 simulated backends, each a
batching, saturating, serial or hosted engine, with step costs, batch limits, prefill rates,
first-token offsets, tokens per chunk, per-request speed spread and timing jitter drawn from
ranges that cover the engines in docs/benchmarks/ and more; sometimes two of them on one device.
For each fleet an SLO between comfortable and marginal, and three arrival rates: light, about
the fleet's capacity at that SLO, and twice it.

Usage: python3 benches/zoo.py SEED DIR
Writes DIR/fleet.yaml (`tpsgate sim --config`), DIR/gateway.yaml (`tpsgate serve --config`,
policy headroom with `on_miss: queue`; zoo.sh swaps both) and DIR/fleet.json (what was drawn,
the SLO and the rates)."""
import json
import math
import os
import random
import sys

SIM_PORT = 9141  # backends on 9141.. (at most 6)
GATEWAY = "127.0.0.1:8191"
ADMIN = "127.0.0.1:9291"
MODEL = "zoo-model"
PROMPT_TOKENS = 256
OUTPUT_TOKENS = 128


def engine(rng, kind):
    """One engine of `kind`, and its gateway-side concurrency limit (hosted APIs have one)."""
    e = {
        "mode": "batching",
        "step_base_ms": round(rng.uniform(6, 30), 2),
        "step_per_seq_ms": round(rng.uniform(0.3, 3.0), 3),
        "prefill_tokens_per_s": round(rng.choice([2000, 5000, 10000, 20000, 50000]) * rng.uniform(0.7, 1.3)),
        "speed_spread_pct": round(rng.choice([0, 0, 10, 20, 30, 40]), 1),
        "jitter_pct": round(rng.uniform(5, 40), 1),
        "prefill_stall_ms": round(rng.choice([0, 0, 5, 10, 20]), 1),
    }
    limit = None
    if kind == "batching":
        e["max_batch"] = rng.choice([32, 64, 128, 256])
    elif kind == "saturating":
        e["max_batch"] = rng.choice([2, 4, 6, 8])
    elif kind == "serial":
        e.update(mode="serial", step_per_seq_ms=0, prefill_tokens_per_s=round(rng.uniform(1000, 5000)))
    elif kind == "hosted":
        e.update(step_per_seq_ms=0.002, max_batch=1024, prefill_tokens_per_s=50000,
                 extra_ttft_ms=round(rng.uniform(200, 800)))
        limit = rng.choice([8, 16, 32])
    stream = {"tokens_per_chunk": rng.choice([1, 1, 1, 2, 3, 4]) if kind == "hosted" else rng.choice([1, 1, 1, 2])}
    return e, stream, limit


def speed(e, n):
    """Per-user tok/s at `n` decoding together (ignoring prefill stalls)."""
    return 1000.0 / (e["step_base_ms"] + e["step_per_seq_ms"] * n)


def capacity(e, limit, slo_tps, slo_ttft_s):
    """Requests a second this engine completes within the SLO at best, roughly: the most that
    may decode together at the SLO's speed, over a request's time there."""
    if e.get("extra_ttft_ms", 0) / 1000 + PROMPT_TOKENS / e["prefill_tokens_per_s"] > slo_ttft_s:
        return 0.0
    if e["mode"] == "serial":
        n = 1
    else:
        n = e.get("max_batch", 256)
        if e["step_per_seq_ms"] > 0:
            n = min(n, math.floor((1000 / slo_tps - e["step_base_ms"]) / e["step_per_seq_ms"]))
        if limit:
            n = min(n, limit)
    if n < 1 or speed(e, n) < slo_tps:
        return 0.0
    duration = PROMPT_TOKENS / e["prefill_tokens_per_s"] + OUTPUT_TOKENS / speed(e, n)
    return n / duration


def draw(seed):
    rng = random.Random(seed)
    kinds = [rng.choice(["batching", "saturating", "serial", "hosted"]) for _ in range(rng.randint(2, 6))]
    if all(k == "hosted" for k in kinds):
        kinds[0] = "batching"
    backends = []
    for i, kind in enumerate(kinds):
        e, stream, limit = engine(rng, kind)
        backends.append({"name": f"{kind}-{i}", "kind": kind, "engine": e, "stream": stream, "limit": limit})
    # Two local engines on one device, sometimes.
    local = [b for b in backends if b["kind"] != "hosted"]
    if len(local) >= 2 and rng.random() < 0.25:
        for b in rng.sample(local, 2):
            b["device"] = "gpu0"
    # The SLO's speed: between comfortable (half the fastest single-user speed) and marginal
    # (nine tenths of it); its first token 0.5 to 2 s.
    fastest = max(speed(b["engine"], 1) for b in backends)
    slo_tps = round(fastest * rng.uniform(0.5, 0.9), 1)
    slo_ttft_ms = rng.choice([500, 1000, 1000, 2000])
    cap = sum(capacity(b["engine"], b["limit"], slo_tps, slo_ttft_ms / 1000) for b in backends)
    cap = max(cap, 0.5)
    rates = [round(cap * f, 2) for f in (0.3, 1.0, 2.0)]
    return {"seed": seed, "backends": backends, "slo_tps": slo_tps, "slo_ttft_ms": slo_ttft_ms,
            "capacity_rps": round(cap, 2), "rates": rates}


def yaml_map(d, indent):
    pad = " " * indent
    return "".join(f"{pad}{k}: {v}\n" for k, v in d.items())


def write(fleet, where):
    os.makedirs(where, exist_ok=True)
    sim = f"# Zoo fleet, seed {fleet['seed']} (benches/zoo.py).\nbackends:\n"
    gateway = (f"# Gateway for zoo fleet seed {fleet['seed']} (benches/zoo.py).\n"
               f"listen:\n  address: {GATEWAY}\nadmin:\n  listen: {ADMIN}\nbackends:\n")
    for i, b in enumerate(fleet["backends"]):
        port = SIM_PORT + i
        sim += f"  - name: {b['name']}\n    listen: 127.0.0.1:{port}\n    models: [{MODEL}]\n"
        if "device" in b:
            sim += f"    device: {b['device']}\n"
        sim += "    engine:\n" + yaml_map(b["engine"], 6)
        sim += "    stream:\n" + yaml_map(b["stream"], 6)
        gateway += (f"  - name: {b['name']}\n    url: http://127.0.0.1:{port}\n    dialect: openai\n"
                    f"    models: {{{MODEL}: {MODEL}}}\n")
        if b["limit"]:
            gateway += f"    max_concurrency: {b['limit']}\n"
        if "device" in b:
            gateway += f"    device: {b['device']}\n"
    gateway += (f"classes:\n  - name: interactive\n    min_tps: {fleet['slo_tps']}\n"
                f"    max_ttft_ms: {fleet['slo_ttft_ms']}\n    on_miss: queue\n"
                f"routing:\n  policy: headroom\n")
    open(f"{where}/fleet.yaml", "w").write(sim)
    open(f"{where}/gateway.yaml", "w").write(gateway)
    open(f"{where}/fleet.json", "w").write(json.dumps(fleet, indent=1))


if __name__ == "__main__":
    seed, where = int(sys.argv[1]), sys.argv[2]
    fleet = draw(seed)
    write(fleet, where)
    print(json.dumps({k: fleet[k] for k in ("seed", "slo_tps", "slo_ttft_ms", "capacity_rps", "rates")}
                     | {"kinds": [b["kind"] for b in fleet["backends"]]}))
