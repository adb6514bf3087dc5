#!/usr/bin/env python3
"""Renders peers.py JSON lines (one run on one GPU) as a markdown table with ours/peer ratios.

    tools/perf_table.py FILE.jsonl [--peers sdpa_flash,sdpa_cudnn]
Rows are (mode, head dim, mask, seqlen); a ratio is ours' TFLOP/s over the peer's in the same run.
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--peers", default="sdpa_flash,sdpa_cudnn")
    args = ap.parse_args()
    peers = args.peers.split(",")
    rows, ceiling = {}, None
    with open(args.file) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("kind") == "ceiling":
                ceiling = rec
                continue
            if rec.get("env") or rec.get("suite") == "gemm":  # bench_points.py: a switch's column, a GEMM
                continue
            key = (rec["mode"], rec["D"], rec["causal"], rec["Sq"])
            rows.setdefault(key, {})[rec["provider"]] = rec.get("tflops")
    if ceiling:
        print(f"Device {ceiling['device']}, torch {ceiling['torch']}, cuDNN {ceiling['cudnn']}; "
              f"bf16 GEMM ceiling {ceiling['bf16_gemm_tflops']} TFLOP/s, copy {ceiling['copy_gbps']} GB/s.\n")
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


if __name__ == "__main__":
    main()
