#!/usr/bin/env python3
"""Attention right behind the kernel that writes its query, back to back, as in a model's layer
(a projection or a rotary kernel, then attention): how long one such pair takes per iteration,
per column. peers.py's do_bench times each call alone, between an L2 flush and two events, which
is what the performance log's figures are; this times what a dependent launch (the Hopper
forward's FUSEDATTN_SM90_PDL, on by default) can change, the gap between the kernel before it and
attention's own start, in a run of many pairs.

  tools/chain_bench.py --points decode,fwd:256:full:2048 [--providers sdpa_cudnn,ours]
      [--env NAME=VALUE ...] [--iters 200] [--repeat 5] [--dtype float16] [--graph]
Points as tools/bench_points.py takes them (forward only). Each run times --iters pairs (q
rewritten by a copy, then the attention call) between two events, after one untimed run; each
column reads --repeat runs, the columns in reverse order on every second run. Prints per point the
median microseconds per pair of each column, with its min-max, and the copy alone per iteration.
Through Python a call's host time (~40 us) exceeds a decode step's GPU time, so short calls need
--graph, which captures the pairs into one CUDA graph and times its replays.
"""
import argparse
import statistics
import sys

import torch

import bench_points as bp
import peers


def per_pair_us(fn, q, q_src, k, v, causal, scale, iters, graph):
    """Microseconds per (copy into q, attention) pair over `iters` pairs, or per copy alone (fn
    None); with `graph` the pairs are captured into one CUDA graph and a replay is timed, so the
    host's time per call (tens of microseconds through Python) stays out of the GPU's."""
    def run():
        for _ in range(iters):
            q.copy_(q_src)
            if fn is not None:
                fn(q, k, v, causal, scale)
    run()  # warm: plans, workspaces, autotuning
    torch.cuda.synchronize()
    timed = run
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            run()
        g.replay()
        torch.cuda.synchronize()
        timed = g.replay
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    timed()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", required=True)
    ap.add_argument("--providers", default="sdpa_cudnn,ours")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE[+NAME=VALUE...]: one more column of ours")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--module", default="fusedattn")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--graph", action="store_true", help="time replays of the pairs captured into a CUDA graph")
    args = ap.parse_args()
    if args.iters < 1 or args.repeat < 1:
        raise SystemExit("--iters and --repeat must be at least 1")
    peers.OURS["mod"] = __import__(args.module)
    dtype = getattr(torch, args.dtype)
    columns = [(p, None) for p in args.providers.split(",")] + [("ours", e) for e in args.env]
    names = [p if e is None else e.replace("FUSEDATTN_", "").replace("SM90_", "") for p, e in columns]
    how = "graph replays" if args.graph else "runs"
    print(f"{torch.cuda.get_device_name()}  {args.dtype}  median us per (copy, attention) pair of {args.repeat} {how} "
          f"of {args.iters}")
    print("%-32s" % "point" + "".join("%16s" % n[:16] for n in names) + "%10s" % "copy" + "   ratios to the first column")
    for text in bp.expand_points(args.points):
        point, q_src, k, v = bp.forward_inputs(text, dtype)
        _, d, causal, *_ = point
        scale = d ** -0.5
        q = torch.empty_like(q_src)
        readings = [[] for _ in columns]
        copies = []
        with torch.no_grad():
            for rep in range(args.repeat):
                order = range(len(columns)) if rep % 2 == 0 else reversed(range(len(columns)))
                for i in order:
                    provider, env = columns[i]
                    with bp.apply_env(env):
                        try:
                            readings[i].append(per_pair_us(peers.PROVIDERS[provider], q, q_src, k, v, causal, scale,
                                                           args.iters, args.graph))
                        except Exception as e:  # a provider that cannot run the point says why
                            print(f"  {provider} {env or ''}: {type(e).__name__}: {str(e)[:120]}")
                            readings[i].append(float("nan"))
                copies.append(per_pair_us(None, q, q_src, k, v, causal, scale, args.iters, args.graph))
        row = [statistics.median(r) for r in readings]
        ratios = " ".join("%.3f" % (x / row[0]) for x in row[1:])
        print("%-32s" % text + "".join("%16.2f" % x for x in row) + "%10.2f" % statistics.median(copies) + "   "
              + ratios, flush=True)
        print("%-32s" % "" + "".join("%16s" % f"{min(r):.2f}-{max(r):.2f}" for r in readings), flush=True)
        del q, q_src, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
