#!/usr/bin/env python3
"""Sustained speed, SM clock and board power of ours and the peers at FA-grid points: tells a
kernel that needs fewer cycles from one that runs at a higher clock.

The H200 runs these kernels at its power cap (nvidia-smi's clock event reason 0x4, SW power cap):
the SM clock falls from 1980 MHz to 1400-1900 while the board draws ~680 W, so TFLOP/s is
(work per clock) x (clock the power allows). Each provider runs one point back to back for
--seconds (after --warmup seconds, not counted) while `nvidia-smi -lms` samples clock, power and
temperature; the table gives TFLOP/s, mean MHz and W over the counted window, FLOP per SM-cycle
(TFLOP/s / (MHz x SMs)) and joules per PFLOP. Providers alternate in A B B A order so a drift in
temperature falls on both.

  tools/bench_power.py --points fwd:128:full:512,fwd:256:full:16384 [--providers sdpa_cudnn,ours]
      [--dtype float16] [--seconds 2] [--env NAME=VALUE[+...]] [--out FILE]
Points as in bench_points.py (forward only; `fa-fwd` names every forward point of the FA grid);
--env adds an `ours` variant, as there. Each row's ratio is its TFLOP/s over the point's first
column's; where sdpa_cudnn and ours both run, the last lines hold ours against issue 5's goal
(tools/perf_table.py's rule) in this regime.

The regime is not do_bench's: peers.py and bench_points.py time each call after a kernel that
flushes the L2, this tool times calls back to back with nothing between them. The two differ
where a call's launches race those of the call before it: on the H100 the d256 full-mask quad
mix read 0.95-0.97x cuDNN back to back and 1.12-1.19x in do_bench's regime (docs/hopper.md,
session 105) until its launches were ordered in every eager call (1.09-1.13x back to back,
session 106).
"""
import argparse
import json
import math
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / ".devbuild" / "carry"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import torch  # noqa: E402
import peers  # noqa: E402
from bench_points import (PEERS_LEFT_OUT, apply_env, expand_points, forward_inputs, parse_point,  # noqa: E402
                          peer_mask_differs)
import perf_table  # noqa: E402
from gpu_sampler import Sampler  # noqa: E402


def sustained(fn, seconds, warmup):
    """Runs fn back to back; returns (calls, wall seconds, window start, window end) of the counted part."""
    end_warm = time.perf_counter() + warmup
    while time.perf_counter() < end_warm:
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    calls = 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(8):
            fn()
        calls += 8
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    return calls, t1 - t0, t0, t1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", required=True)
    ap.add_argument("--providers", default="sdpa_cudnn,ours")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--module", default="fusedattn")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--out", default=None)
    perf_table.add_goal_arguments(ap)
    ap.set_defaults(goal_peer="sdpa_cudnn")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    peers.OURS["mod"] = __import__(args.module)
    columns = [(p, None) for p in args.providers.split(",")] + [("ours", e) for e in args.env]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sampler = Sampler(50)
    time.sleep(0.5)
    rows = []
    for text in expand_points(args.points):
        (_, d, causal, sq, sk, batch, hq, hkv), q, k, v = forward_inputs(text, dtype)
        scale = 1.0 / math.sqrt(d)
        flop = peers.flops(batch, hq, sq, sk, d, causal, "fwd")
        results = {}
        runnable = [c for c in columns if not peer_mask_differs(c[0], causal, sq, sk)]
        if len(runnable) < len(columns):
            print(f"{text}: {PEERS_LEFT_OUT}")
        for name, env in runnable + runnable[::-1]:
            fn = peers.PROVIDERS[name]
            with torch.no_grad(), apply_env(env):
                calls, wall, t0, t1 = sustained(lambda: fn(q, k, v, causal, scale), args.seconds, args.warmup)
            mhz, watts, temp = sampler.mean(t0, t1)
            results.setdefault((name, env), []).append((flop * calls / wall / 1e12, mhz, watts, temp))
        for (name, env), runs in results.items():
            tflops, mhz, watts, temp = (sum(r[i] for r in runs) / len(runs) for i in range(4))
            rec = {"point": text, "provider": name if env is None else f"ours[{env}]", "dtype": args.dtype,
                   "tflops": tflops, "mhz": mhz, "watts": watts, "temp_c": temp,
                   "flop_per_sm_cycle": tflops * 1e12 / (mhz * 1e6 * sms),
                   "joule_per_pflop": watts / tflops * 1e3, "runs": [r[0] for r in runs]}
            rows.append(rec)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(rec) + "\n")
    sampler.stop()
    print(f"{torch.cuda.get_device_name()}  {args.dtype}  sustained {args.seconds:g} s per run, two runs each")
    print_rows(rows)
    print_goal(args, rows)


def print_rows(rows):
    """The table: a row per (point, column), its ratio to the point's first column."""
    first = {}
    for r in rows:
        first.setdefault(r["point"], r["tflops"])
    print(f"{'point':<22} {'provider':<34} {'TFLOP/s':>8} {'MHz':>6} {'W':>6} {'C':>4} {'FLOP/SM-cyc':>11} "
          f"{'J/PFLOP':>8} {'ratio':>6}")
    for r in rows:
        print(f"{r['point']:<22} {r['provider']:<34} {r['tflops']:8.1f} {r['mhz']:6.0f} {r['watts']:6.0f} "
              f"{r['temp_c']:4.0f} {r['flop_per_sm_cycle']:11.0f} {r['joule_per_pflop']:8.1f} "
              f"{r['tflops'] / first[r['point']]:6.3f}")


def print_goal(args, rows):
    """Ours against issue 5's goal over the points where cuDNN and ours both ran: tools/perf_table.py's
    goal lines, on this table's points (keyed as perf_table keys a grid's) and runs."""
    keyed, runs = {}, {}
    for r in rows:
        key = parse_point(r["point"])[:4]  # mode, head dim, causal, seqlen_q
        keyed.setdefault(key, {})[r["provider"]] = r["tflops"]
        runs.setdefault(key, {})[r["provider"]] = r["runs"]
    if any("ours" in vals and args.goal_peer in vals for vals in keyed.values()):
        perf_table.print_goal(args, keyed, runs, "cuDNN")


if __name__ == "__main__":
    main()
