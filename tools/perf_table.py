#!/usr/bin/env python3
"""Renders peers.py JSON lines (runs on one GPU) as a markdown table with ours/peer ratios.

    tools/perf_table.py FILE.jsonl [--peers sdpa_flash,sdpa_cudnn] [--goal-peer sdpa_cudnn]
Rows are (mode, head dim, mask, seqlen); a ratio is ours' TFLOP/s over the peer's in the same file.
A file with several runs (gpu_check.sh's PEER_REPEAT appends them) shows each provider's median
reading per point, and the ratio of the medians. Last, the forward points against issue 5's goal
(ours / cuDNN of the medians at least 1.10 from 2048 keys, 1.0 below), the missed ones with their
ratio to four places and every reading.
"""
import argparse
import json
import statistics

# The FA grid's shape (peers.py's fa suite): every point has 16k tokens (batch 16384 / seqlen) and
# model dim 2048 (heads 2048 / head_dim). bench_points.py builds its points from it, energy_fit.py its
# FLOPs per call.
FA_TOKENS, FA_MODEL_DIM = 16384, 2048


def read_readings(path):
    """Every reading of a peers.py JSON lines file: {(mode, head dim, causal, seqlen): {provider:
    [TFLOP/s, ...]}}, and the file's ceiling record (None where it has none). bench_points.py's
    switch columns and GEMM rows are left out."""
    rows, ceiling = {}, None
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("kind") == "ceiling":
                ceiling = rec
                continue
            if rec.get("env") or rec.get("suite") == "gemm":  # bench_points.py: a switch's column, a GEMM
                continue
            key = (rec["mode"], rec["D"], rec["causal"], rec["Sq"])
            if rec.get("tflops"):
                rows.setdefault(key, {}).setdefault(rec["provider"], []).append(rec["tflops"])
    return rows, ceiling


def medians(readings):
    """read_readings' rows with each provider's median reading per point."""
    return {key: {p: statistics.median(r) for p, r in vals.items()} for key, vals in readings.items()}


def add_goal_arguments(ap):
    """Issue 5's goal for forward points, ours / the goal peer: --goal from --goal-from keys, --goal-below under."""
    ap.add_argument("--goal", type=float, default=1.10, help="the ratio to reach from --goal-from keys")
    ap.add_argument("--goal-from", type=int, default=2048)
    ap.add_argument("--goal-below", type=float, default=1.0, help="the ratio to reach below --goal-from")


def goal_at(args, seqlen):
    """The ratio a forward point of seqlen keys must reach (add_goal_arguments' options)."""
    return args.goal if seqlen >= args.goal_from else args.goal_below


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--peers", default="sdpa_flash,sdpa_cudnn")
    ap.add_argument("--goal-peer", default="sdpa_cudnn", help="the peer of the goal lines (empty: none)")
    add_goal_arguments(ap)
    args = ap.parse_args()
    peers = args.peers.split(",")
    rows, ceiling = read_readings(args.file)
    if ceiling:
        print(f"Device {ceiling['device']}, torch {ceiling['torch']}, cuDNN {ceiling['cudnn']}; "
              f"bf16 GEMM ceiling {ceiling['bf16_gemm_tflops']} TFLOP/s, copy {ceiling['copy_gbps']} GB/s.\n")
    runs = max((len(r) for vals in rows.values() for r in vals.values()), default=0)
    if runs > 1:
        print(f"Medians of up to {runs} readings per provider and point.\n")
    readings = rows
    rows = medians(rows)
    names = {"sdpa_flash": "FA2", "sdpa_cudnn": "cuDNN"}
    head = ["mode", "d", "mask", "seqlen"] + [names.get(p, p) for p in peers] + ["ours"] + \
           [f"ours/{names.get(p, p)}" for p in peers]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for (mode, d, causal, s), vals in sorted(rows.items(), key=lambda kv: (kv[0][0] != "fwd", kv[0][1], kv[0][2], kv[0][3])):
        ours = vals.get("ours")
        cells = [mode, str(d), "causal" if causal else "full", str(s)]
        cells += [f"{vals.get(p):.0f}" if vals.get(p) else "-" for p in peers]
        cells.append(f"{ours:.0f}" if ours else "-")
        cells += [f"{ours / vals[p]:.2f}" if ours and vals.get(p) else "-" for p in peers]
        print("| " + " | ".join(cells) + " |")
    if args.goal_peer:
        print_goal(args, rows, readings, names.get(args.goal_peer, args.goal_peer))


def print_goal(args, rows, readings, peer_name):
    """The forward points measured against both, and those below the goal."""
    points = [(key, vals["ours"] / vals[args.goal_peer]) for key, vals in sorted(rows.items())
              if key[0] == "fwd" and vals.get("ours") and vals.get(args.goal_peer)]
    missed = [(key, ratio) for key, ratio in points if ratio < goal_at(args, key[3])]
    print(f"\nGoal, forward ours/{peer_name}: {args.goal:.2f} from {args.goal_from} keys, {args.goal_below:.2f} below; "
          f"{len(points) - len(missed)} of {len(points)} points meet it.")
    for (mode, d, causal, s), ratio in missed:
        raw = readings[(mode, d, causal, s)]
        listed = lambda p: "/".join(f"{x:.0f}" for x in raw[p])
        print(f"- below: {mode} d{d} {'causal' if causal else 'full'} {s}: {ratio:.4f} "
              f"({peer_name} {listed(args.goal_peer)}, ours {listed('ours')})")


if __name__ == "__main__":
    main()
