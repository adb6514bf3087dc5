#!/usr/bin/env python3
"""Ring attention (fusedattn.ring_flash_attn_func) over the GPUs of one host, against one GPU
running flash_attn_func on the whole sequence.

One process per GPU (NCCL, batch 1, model dim 2048 so 2048 / head_dim heads). Per sequence length
and mask (full; causal with contiguous chunks; causal with zigzag chunks) it times, with CUDA
events, medians of --iters calls after two warm-ups, the slowest rank's time each call:
  ring_fwd          the ring's forward
  ring_fwd_unchecked  the same with check_chunks=False (no all_gather of the chunks' shapes)
  ring_fwd_bwd      forward + backward, the chunk accumulators' transfer under the next step's
                    kernels (context_parallel._OVERLAP_ACCUMULATORS, the default)
  ring_fwd_bwd_serial  the same with that transfer waited for at once (the first version)
  one_fwd, one_fwd_bwd  flash_attn_func over the whole sequence on rank 0's GPU alone
  check             ring_flash_attn_func's chunk check alone (one all_gather of eight integers)
TFLOP/s are the whole sequence's (forward 4 S^2 H D, halved when causal; backward 2.5x) per
second; the ring's per GPU divides them by the GPU count, so the ring's scaling is its per-GPU
rate against the single GPU's.

  tools/bench_ring.py [--gpus 2] [--head-dim 128] [--seqlens 16384,65536] [--dtype float16]
                      [--iters 10] [--out FILE]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MODEL_DIM = 2048
WARMUP = 2
CASES = [("full", False, False), ("causal", True, False), ("causal_zigzag", True, True)]


def flops(seqlen, heads, head_dim, causal, backward):
    fwd = 4 * seqlen * seqlen * heads * head_dim / (2 if causal else 1)
    return fwd * (3.5 if backward else 1.0)


def elapsed_ms(fn):
    """One call of fn on this rank's GPU, timed by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def timed(fn, iters, device):
    """Median ms of fn over iters calls, each the slowest rank's (every rank calls this)."""
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        elapsed = torch.tensor([elapsed_ms(fn)], device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(elapsed.item())
    return statistics.median(times)


def worker(rank, world, init_file, args, results):
    import fusedattn
    from fusedattn import context_parallel

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
    dtype = getattr(torch, args.dtype)
    heads = MODEL_DIM // args.head_dim
    rows = []
    for seqlen in [int(s) for s in args.seqlens.split(",")]:
        chunk = seqlen // world
        for name, causal, zigzag in CASES:
            torch.manual_seed(rank)
            q, k, v = (torch.randn(1, chunk, heads, args.head_dim, device=device, dtype=dtype).requires_grad_()
                       for _ in range(3))
            dout = torch.randn(1, chunk, heads, args.head_dim, device=device, dtype=dtype)

            def ring_fwd():
                with torch.no_grad():
                    fusedattn.ring_flash_attn_func(q, k, v, causal=causal, zigzag=zigzag)

            def ring_fwd_unchecked():
                with torch.no_grad():
                    fusedattn.ring_flash_attn_func(q, k, v, causal=causal, zigzag=zigzag, check_chunks=False)

            def ring_fwd_bwd():
                out = fusedattn.ring_flash_attn_func(q, k, v, causal=causal, zigzag=zigzag)
                out.backward(dout)

            row = {"seqlen": seqlen, "mask": name, "head_dim": args.head_dim, "dtype": args.dtype, "gpus": world}
            row["ring_fwd"] = timed(ring_fwd, args.iters, device)
            row["ring_fwd_unchecked"] = timed(ring_fwd_unchecked, args.iters, device)
            for key, overlap in (("ring_fwd_bwd", True), ("ring_fwd_bwd_serial", False)):
                context_parallel._OVERLAP_ACCUMULATORS = overlap
                row[key] = timed(ring_fwd_bwd, args.iters, device)
            context_parallel._OVERLAP_ACCUMULATORS = True
            row["check"] = timed(lambda: context_parallel._check_chunks(q, k, v, zigzag, None), args.iters, device)
            if rank == 0:
                whole = [torch.randn(1, seqlen, heads, args.head_dim, device=device, dtype=dtype).requires_grad_()
                         for _ in range(3)]
                whole_dout = torch.randn(1, seqlen, heads, args.head_dim, device=device, dtype=dtype)

                def one_fwd():
                    with torch.no_grad():
                        fusedattn.flash_attn_func(*whole, causal=causal)

                def one_fwd_bwd():
                    fusedattn.flash_attn_func(*whole, causal=causal).backward(whole_dout)

                row["one_fwd"] = one_gpu_time(one_fwd, args.iters)
                row["one_fwd_bwd"] = one_gpu_time(one_fwd_bwd, args.iters)
                del whole, whole_dout
                rows.append(row)
            dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        results.put(rows)


def one_gpu_time(fn, iters):
    """Median ms of fn over iters calls on this rank's GPU alone."""
    for _ in range(WARMUP):
        fn()
    return statistics.median(elapsed_ms(fn) for _ in range(iters))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seqlens", default="16384,65536")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if torch.cuda.device_count() < args.gpus:
        sys.exit(f"bench_ring: {args.gpus} GPUs asked, {torch.cuda.device_count()} visible")
    context = mp.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        procs = [context.Process(target=worker, args=(r, args.gpus, init_file, args, results))
                 for r in range(args.gpus)]
        for p in procs:
            p.start()
        rows = results.get()
        for p in procs:
            p.join()
    name = torch.cuda.get_device_name(0)
    print(f"{name} x{args.gpus}  {args.dtype}  d{args.head_dim}: ms, and TFLOP/s (ring: per GPU)")
    header = ("seqlen", "mask", "one_fwd", "ring_fwd", "unchecked", "one_fwd_bwd", "ring_fwd_bwd", "ring_serial",
              "check", "fwd_scaling", "fwd_bwd_scaling")
    print("".join(f"{h:>16}" for h in header))
    for row in rows:
        heads, d, s, w = MODEL_DIM // row["head_dim"], row["head_dim"], row["seqlen"], row["gpus"]
        causal = row["mask"] != "full"
        tf = lambda ms, bwd, gpus: flops(s, heads, d, causal, bwd) / gpus / (ms * 1e9)  # noqa: E731
        row["scaling_fwd"] = tf(row["ring_fwd"], False, w) / tf(row["one_fwd"], False, 1)
        row["scaling_fwd_bwd"] = tf(row["ring_fwd_bwd"], True, w) / tf(row["one_fwd_bwd"], True, 1)
        cells = [s, row["mask"],
                 f"{row['one_fwd']:.2f} ({tf(row['one_fwd'], False, 1):.0f})",
                 f"{row['ring_fwd']:.2f} ({tf(row['ring_fwd'], False, w):.0f})",
                 f"{row['ring_fwd_unchecked']:.2f} ({tf(row['ring_fwd_unchecked'], False, w):.0f})",
                 f"{row['one_fwd_bwd']:.2f} ({tf(row['one_fwd_bwd'], True, 1):.0f})",
                 f"{row['ring_fwd_bwd']:.2f} ({tf(row['ring_fwd_bwd'], True, w):.0f})",
                 f"{row['ring_fwd_bwd_serial']:.2f} ({tf(row['ring_fwd_bwd_serial'], True, w):.0f})",
                 f"{row['check']:.3f}", f"{row['scaling_fwd']:.2f}", f"{row['scaling_fwd_bwd']:.2f}"]
        print("".join(f"{c:>16}" for c in cells))
    if args.out:
        with open(args.out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
