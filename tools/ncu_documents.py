#!/usr/bin/env python3
"""An ncu target: packed causal documents under a column mask, then the same documents as a
varlen batch, each forward run twice (fp16, model dim 2048, 2048 / head_dim heads).

Run the portable kernels side by side (their forward kernels are named fwd_kernel):
  FUSEDATTN_DISABLE_SM90=1 ncu -k regex:fwd_kernel -s 2 -c 2 --section SpeedOfLight \\
      python3 tools/ncu_documents.py 128 3586,1705,3232,3774,1850,293,1188,756
(-s 2 skips the first round's two launches.) The lengths are bench_documents.py's mixed case.
"""
import sys

import torch

import fusedattn
from fusedattn.masks import document_mask

MODEL_DIM = 2048
ROUNDS = 2


def main():
    head_dim, lengths = int(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")]
    heads, total = MODEL_DIM // head_dim, sum(lengths)
    q, k, v = (torch.randn(1, total, heads, head_dim, device="cuda", dtype=torch.float16) for _ in range(3))
    mask = document_mask(lengths, causal=True, device="cuda")
    offsets = torch.tensor([0] + lengths, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
    for _ in range(ROUNDS):
        fusedattn.flash_attn_func(q, k, v, causal=True, column_mask=mask)
        fusedattn.flash_attn_varlen_func(q[0], k[0], v[0], offsets, offsets, max(lengths), max(lengths), causal=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
