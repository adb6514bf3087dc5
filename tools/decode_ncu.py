#!/usr/bin/env python3
"""One call per (point, provider) inside an NVTX range named "measure", for ncu.

Each point's inputs are built as peers.py builds them ([B, H, S, D] tensors, fresh random values)
and each provider is peers.py's own (sdpa_cudnn: torch SDPA's CUDNN_ATTENTION backend; ours:
fusedattn.flash_attn_func on [B, S, H, D] views), called three times to warm up and once inside
the range, so ncu profiles exactly the measured call's kernels:

  PYTHONPATH=build-gpu/python:.devbuild/carry ncu --nvtx --nvtx-include "measure/" --metrics M \\
      python3 tools/decode_ncu.py [--points fwd:128:full:1:131072:16:32:8,...] [--providers sdpa_cudnn,ours]

Points as in bench_points.py (forward only; the default is peers.py's decode step at batch 16 and
128k keys). docs/hopper.md, session 85: the K/V maps' L2 promotion found this way.
"""
import argparse
import math
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_points  # noqa: E402  (forward_inputs; puts .devbuild/carry on the path)
import peers  # noqa: E402

WARMUP_CALLS = 3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", default="fwd:128:full:1:131072:16:32:8")
    ap.add_argument("--providers", default="sdpa_cudnn,ours")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--ours-module", default="fusedattn")
    args = ap.parse_args()
    if "ours" in args.providers.split(","):  # peers alone need no build of ours
        peers.OURS["mod"] = __import__(args.ours_module)
    dtype = getattr(torch, args.dtype)
    for text in args.points.split(","):
        (_, d, causal, sq, sk, *_), q, k, v = bench_points.forward_inputs(text, dtype)
        for provider in args.providers.split(","):
            if bench_points.peer_mask_differs(provider, causal, sq, sk):
                print(f"{text} {provider}: {bench_points.PEERS_LEFT_OUT}", flush=True)
                continue
            fn = peers.PROVIDERS[provider]
            for _ in range(WARMUP_CALLS):
                fn(q, k, v, causal, 1 / math.sqrt(d))
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("measure")
            fn(q, k, v, causal, 1 / math.sqrt(d))
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
            print(f"measured {provider} at {text}", flush=True)


if __name__ == "__main__":
    main()
