"""One decode call per provider inside an NVTX range named "measure", for ncu.

A decode step as peers.py's decode suite builds it (one query, GQA 32/8 heads, d128, fp16,
[B, H, S, D] tensors), run by cuDNN (torch SDPA's CUDNN_ATTENTION backend) and by ours
(fusedattn.flash_attn_func on [B, S, H, D] views), each three times to warm up and once inside the
range, so ncu profiles exactly the measured call's kernels:

  PYTHONPATH=build-gpu/python ncu --nvtx --nvtx-include "measure/" --metrics M \\
      python3 tools/decode_ncu.py --batch 1,16 --keys 131072 [--providers cudnn,ours]

docs/hopper.md, session 85: the K/V maps' L2 promotion found this way.
"""
import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fusedattn

HEADS_Q, HEADS_KV, HEAD_DIM = 32, 8, 128
WARMUP_CALLS = 3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", default="16", help="comma list of batch sizes")
    ap.add_argument("--keys", type=int, default=131072, help="KV cache length")
    ap.add_argument("--providers", default="cudnn,ours", help="comma list: cudnn, ours")
    args = ap.parse_args()
    wanted = args.providers.split(",")
    for batch in (int(b) for b in args.batch.split(",")):
        q = torch.randn(batch, HEADS_Q, 1, HEAD_DIM, device="cuda", dtype=torch.float16)
        k = torch.randn(batch, HEADS_KV, args.keys, HEAD_DIM, device="cuda", dtype=torch.float16)
        v = torch.randn(batch, HEADS_KV, args.keys, HEAD_DIM, device="cuda", dtype=torch.float16)

        def ours():
            return fusedattn.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        for name, call in (("cudnn", cudnn), ("ours", ours)):
            if name not in wanted:
                continue
            for _ in range(WARMUP_CALLS):
                call()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("measure")
            call()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
            print(f"measured {name} batch {batch}", flush=True)


if __name__ == "__main__":
    main()
