#!/usr/bin/env python3
"""Attention right behind the kernel that writes its query, back to back, as in a model's layer
(a projection or a rotary kernel, then attention): how long one such pair takes per iteration,
per column. peers.py's do_bench times each call alone, between an L2 flush and two events, which
is what the performance log's figures are; this times what a dependent launch (the Hopper
forward's FUSEDATTN_SM90_PDL, on by default) can change, the gap between the kernel before it and
attention's own start, in a run of many pairs.

  tools/chain_bench.py --points decode,fwd:256:full:2048 [--providers sdpa_cudnn,ours]
      [--env NAME=VALUE ...] [--iters 200] [--repeat 5] [--dtype float16] [--graph] [--cold MIB]
Points as tools/bench_points.py takes them (forward only). Each run times --iters pairs (q
rewritten by a copy, then the attention call) between two events, after one untimed run; each
column reads --repeat runs, the columns in reverse order on every second run. Prints per point the
median microseconds per pair of each column, with its min-max, and the copy alone per iteration.
Through Python a call's host time (~40 us) exceeds a decode step's GPU time, so short calls need
--graph, which captures the pairs into one CUDA graph and times its replays.
Back to back, a point's K and V stay in the L2 from one pair to the next where they fit (a decode
step at batch 1 and 4k keys: 16 MiB), which in a model they would not: the other layers run in
between. --cold MIB writes a buffer of that size before each pair (more than the L2 holds: 128 on
an H100 or H200), and the copy column then reads that write and the copy together.
"""
import argparse
import statistics
import sys

import torch

import bench_points as bp
import peers


def per_pair_us(fn, q, q_src, k, v, causal, scale, iters, graph, evict=None):
    """Microseconds per (copy into q, attention) pair over `iters` pairs, or per copy alone (fn
    None); with `graph` the pairs are captured into one CUDA graph and a replay is timed, so the
    host's time per call (tens of microseconds through Python) stays out of the GPU's. `evict`, a
    buffer written before each pair, takes K and V out of the L2."""
    def run():
        for _ in range(iters):
            if evict is not None:
                evict.fill_(1)
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
    ap.add_argument("--cold", type=int, default=0, metavar="MIB", help="write MIB MiB before each pair (0: none)")
    args = ap.parse_args()
    if args.iters < 1 or args.repeat < 1 or args.cold < 0:
        raise SystemExit("--iters and --repeat must be at least 1, --cold at least 0")
    evict = torch.empty(args.cold << 20, dtype=torch.uint8, device="cuda") if args.cold else None
    peers.OURS["mod"] = __import__(args.module)
    dtype = getattr(torch, args.dtype)
    columns = [(p, None) for p in args.providers.split(",")] + [("ours", e) for e in args.env]
    names = bp.column_names(columns)
    how = "graph replays" if args.graph else "runs"
    cold = f", each after a {args.cold} MiB write (in the copy column)" if args.cold else ""
    print(f"{torch.cuda.get_device_name()}  {args.dtype}  median us per (copy, attention) pair of {args.repeat} {how} "
          f"of {args.iters}{cold}")
    print("%-32s" % "point" + bp.header_cells(names) + "%10s" % "copy" + "   ratios to the first column")
    for text in bp.expand_points(args.points):
        point, q_src, k, v = bp.forward_inputs(text, dtype)
        _, d, causal, sq, sk, *_ = point
        if any(bp.peer_mask_differs(provider, causal, sq, sk) for provider, _ in columns):
            print(f"  {text}: {bp.PEERS_LEFT_OUT}")
        scale = d ** -0.5
        q = torch.empty_like(q_src)
        readings = [[] for _ in columns]
        copies = []
        with torch.no_grad():
            for rep in range(args.repeat):
                order = range(len(columns)) if rep % 2 == 0 else reversed(range(len(columns)))
                for i in order:
                    provider, env = columns[i]
                    if bp.peer_mask_differs(provider, causal, sq, sk):
                        readings[i].append(float("nan"))
                        continue
                    with bp.apply_env(env):
                        try:
                            readings[i].append(per_pair_us(peers.PROVIDERS[provider], q, q_src, k, v, causal, scale,
                                                           args.iters, args.graph, evict))
                        except Exception as e:  # a provider that cannot run the point says why
                            print(f"  {provider} {env or ''}: {type(e).__name__}: {str(e)[:120]}")
                            readings[i].append(float("nan"))
                copies.append(per_pair_us(None, q, q_src, k, v, causal, scale, args.iters, args.graph, evict))
        row = [statistics.median(r) for r in readings]
        ratios = " ".join("%.3f" % (x / row[0]) for x in row[1:])
        print("%-32s" % text + "".join("%16.2f" % x for x in row) + "%10.2f" % statistics.median(copies) + "   "
              + ratios, flush=True)
        print("%-32s" % "" + "".join("%16s" % f"{min(r):.2f}-{max(r):.2f}" for r in readings), flush=True)
        del q, q_src, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
