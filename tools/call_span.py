#!/usr/bin/env python3
"""Where a call's time goes between do_bench's events, per provider: a short loop of N iterations
of (L2 flush, start event, call, end event) under torch.profiler, as triton's do_bench runs them,
and per iteration the event time, the gap from the flush's end to the call's first kernel (launch
latency) and the span from its first kernel's start to its last kernel's end. Medians over the
iterations; TFLOP/s by the event time.

The loop is short (N calls, ~30 ms at d256 full 2k), so the card stays below its power cap where
do_bench's 125 ms at full load reach it: the figures are the kernels' speed in cycles, and set
against bench_points.py's (the same point, same providers) they show what the cap takes from each
(docs/hopper.md, session 84). Run on the GPU machine with the Python binding built:

  PYTHONPATH=build-gpu/python:.devbuild/carry tools/call_span.py --points fwd:256:full:2048 \\
      [--providers sdpa_cudnn,ours] [--env FUSEDATTN_SM90_QUAD_MIX=0 ...] [--dtype bfloat16] [--iters 60]
Points as in bench_points.py (forward only); each --env adds an `ours` column with that setting.
"""
import argparse
import math
import pathlib
import statistics
import sys

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_points  # noqa: E402  (forward_inputs, apply_env; puts .devbuild/carry on the path)
import peers  # noqa: E402

FLUSH_BYTES = 256 * 1024 * 1024  # triton's do_bench flushes the L2 with a 256 MiB fill
FLUSH_MIN_US = 20.0              # the fill's kernel, told apart from a provider's own small fills
WARMUP = 20


def spans(events):
    """(gap, span) per iteration from the profiler's device events: each flush, then the kernels
    up to the next flush."""
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in events if e.device_type == DeviceType.CUDA)
    is_flush = [("FillFunctor" in name and end - start > FLUSH_MIN_US) for start, end, name in kernels]
    out = []
    for i, flush in enumerate(is_flush):
        if not flush:
            continue
        call = []
        for j in range(i + 1, len(kernels)):
            if is_flush[j]:
                break
            call.append(kernels[j])
        if call:
            first, last = min(k[0] for k in call), max(k[1] for k in call)
            out.append((first - kernels[i][1], last - first))
    return out


def measure(text, provider, env, dtype, iters):
    (mode, d, causal, sq, sk, batch, hq, hkv), q, k, v = bench_points.forward_inputs(text, dtype)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    fn = peers.PROVIDERS[provider]
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    with bench_points.apply_env(env), torch.no_grad():
        for _ in range(WARMUP):
            flush.zero_()
            fn(q, k, v, causal, 1 / math.sqrt(d))
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for start, end in events:
                flush.zero_()
                start.record()
                fn(q, k, v, causal, 1 / math.sqrt(d))
                end.record()
            torch.cuda.synchronize()
    event_us = statistics.median(s.elapsed_time(e) * 1e3 for s, e in events)
    parts = spans(prof.events())
    gap = statistics.median(g for g, _ in parts)
    span = statistics.median(s for _, s in parts)
    tflops = peers.flops(batch, hq, sq, sk, d, causal, mode) / event_us * 1e-6
    return event_us, gap, span, tflops


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", required=True)
    ap.add_argument("--providers", default="sdpa_cudnn,ours")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--ours-module", default="fusedattn")
    args = ap.parse_args()
    peers.OURS["mod"] = __import__(args.ours_module)
    dtype = getattr(torch, args.dtype)
    columns = [(p, "") for p in args.providers.split(",")] + [("ours", e) for e in args.env]
    print(f"{torch.cuda.get_device_name()}  {args.dtype}  medians of {args.iters} calls, each after an L2 flush")
    print(f"{'point':34s} {'column':34s} {'event us':>9s} {'gap us':>7s} {'span us':>8s} {'TFLOP/s':>8s}")
    for text in args.points.split(","):
        _, _, causal, sq, sk, *_ = bench_points.parse_point(text)
        runnable = [c for c in columns if not bench_points.peer_mask_differs(c[0], causal, sq, sk)]
        if len(runnable) < len(columns):
            print(f"{text}: {bench_points.PEERS_LEFT_OUT}")
        for provider, env in runnable:
            event_us, gap, span, tflops = measure(text, provider, env, dtype, args.iters)
            label = provider + (f" {env}" if env else "")
            print(f"{text:34s} {label:34s} {event_us:9.1f} {gap:7.1f} {span:8.1f} {tflops:8.1f}")


if __name__ == "__main__":
    main()
