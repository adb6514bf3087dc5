#!/usr/bin/env python3
"""peers.py's FA grid for one head dim, run by peers.py's own code in its own order, with every
timed call kept: why a point reads low in the grid but not in tools/bench_points.py.

peers.py's grids read ours at fp16 d256 causal 16k 567-649 TFLOP/s right after cuDNN and 709-773
when it ran first or after FA2, while bench_points in the same provider order read it 1.19-1.26x
cuDNN, and its low readings did not follow the sampled clock (docs/hopper.md, sessions 110, 111
and 115). peers.py keeps only each do_bench median, so whether ours is slow all through its turn
(a state the kernel meets) or at its start (a transient it inherits) was never seen.

This wraps triton's do_bench to keep each timed call (return_mode "all") while peers.bench_one
gets the median it always gets, then runs the whole grid row of --head-dim (every length, full and
causal, forward and backward, the providers in the given order, as `peers.py --suite fa` runs
them), --passes times, then --tail sequences at --point (e.g. `sdpa_cudnn,ours,ours` or `sdpa_cudnn,sleep2,ours`).
Each bench prints one JSON line: the median peers.py would report, the spread of the timed calls,
the mean of the first and last --edge calls, nvidia-smi's mean SM clock, board power (averaged over
~1 s by the driver) and instantaneous power over the bench, and the share of its samples in which
each clock event reason (power cap, power brake, thermal) held the clock down (tools/gpu_sampler.py);
--calls-at lists the points whose every call, and every clock sample, go to the line.

  PYTHONPATH=build/python:.devbuild/carry tools/grid_order_probe.py --head-dim 256 \
      --tail sdpa_cudnn,ours,ours --tail sdpa_cudnn,sleep2,ours --out probe.jsonl
"""
import argparse
import importlib
import json
import math
import statistics
import sys
import time

import torch
import triton

import peers
from bench_points import parse_point
from gpu_sampler import CLOCK_EVENT_BITS, Sampler

SAMPLE_PERIOD_MS = 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--providers", default="sdpa_flash,sdpa_cudnn,ours")
    ap.add_argument("--point", default="fwd:256:causal:16384", help="the --tail runs' point (bench_points.py's form)")
    ap.add_argument("--tail", action="append", default=[],
                    help="providers run in this order at --point after the row; sleepN waits N seconds")
    ap.add_argument("--calls-at", default="fwd:256:causal:16384", help="comma list of mode:head_dim:mask:seqlen")
    ap.add_argument("--passes", type=int, default=1, help="times the row runs before the tails")
    ap.add_argument("--min-seqlen", type=int, default=0, help="the row from this length on (its grid context)")
    ap.add_argument("--edge", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    peers.OURS["mod"] = importlib.import_module("fusedattn")
    dtype = getattr(torch, args.dtype)
    kept = {}
    do_bench = triton.testing.do_bench

    def keeping_do_bench(fn, warmup, rep, return_mode):
        if return_mode != "median":
            raise SystemExit(f"grid_order_probe: peers.py asked do_bench for '{return_mode}', not 'median'")
        kept["times"] = do_bench(fn, warmup=warmup, rep=rep, return_mode="all")
        return statistics.median(kept["times"])

    triton.testing.do_bench = keeping_do_bench
    sampler = Sampler(SAMPLE_PERIOD_MS, reasons=True)
    out = open(args.out, "a") if args.out else None
    calls_at = set(args.calls_at.split(","))

    def bench(name, shape, phase):
        B, Hq, Hkv, Sq, Sk, D, causal, mode = shape
        key = f"{mode}:{D}:{'causal' if causal else 'full'}:{Sq}"
        rec = {"phase": phase, "provider": name, "point": key, "D": D, "dtype": args.dtype}
        t0 = time.perf_counter()
        try:
            ms = peers.bench_one(name, B, Hq, Hkv, Sq, Sk, D, causal, mode, dtype)
        except Exception as e:  # as peers.py: a provider that cannot run this shape says why
            ms, rec["error"] = None, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        t1 = time.perf_counter()
        torch.cuda.empty_cache()  # as peers.py does after every provider
        times = kept.pop("times", None)
        if ms is not None and times:
            mhz, watts, _ = sampler.mean(t0, t1)
            rec.update({"ms": round(ms, 4),
                        "tflops": round(peers.flops(B, Hq, Sq, Sk, D, causal, mode) / ms * 1e-9, 1),
                        "calls": len(times), "min": round(min(times), 4), "max": round(max(times), 4),
                        "first": round(statistics.mean(times[:args.edge]), 4),
                        "last": round(statistics.mean(times[-args.edge:]), 4),
                        "mhz": round(mhz), "watts": round(watts), "wall_s": round(t1 - t0, 2)})
            window = [s for s in sampler.window(t0, t1) if s.reasons is not None]
            if window:
                instant = [s.watts_now for s in window if not math.isnan(s.watts_now)]
                if instant:
                    rec["watts_now"] = round(statistics.mean(instant), 1)
                rec["held"] = {reason: round(sum(1 for s in window if s.reasons & bit) / len(window), 2)
                               for reason, bit in CLOCK_EVENT_BITS.items() if any(s.reasons & bit for s in window)}
            if key in calls_at:
                rec["times"] = [round(t, 4) for t in times]
                rec["clock_trace"] = [[round((s.time - t0) * 1e3), s.mhz, s.watts_now, hex(s.reasons)] for s in window]
        line = json.dumps(rec)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    providers = args.providers.split(",")
    for p in range(args.passes):
        for shape in peers.suites("fa"):
            if shape[5] == args.head_dim and shape[3] >= args.min_seqlen:
                for name in providers:
                    bench(name, shape, f"row{p}")

    mode, d, causal, sq, sk, batch, hq, hkv = parse_point(args.point)
    shape = (batch, hq, hkv, sq, sk, d, causal, mode)
    for i, tail in enumerate(args.tail):
        for name in tail.split(","):
            if name.startswith("sleep"):
                time.sleep(float(name[len("sleep"):]))
            else:
                bench(name, shape, f"tail{i}:{tail}")
    sampler.stop()


if __name__ == "__main__":
    sys.exit(main())
