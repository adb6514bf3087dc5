"""Streams and devices follow torch: kernels are ordered on the caller's current stream and run
on the tensors' device whatever the current device is."""
from __future__ import annotations

import pytest
import torch

import fusedattn
from conftest import HAS_CUDA, randn

# Long enough that a kernel launched on the wrong stream would overtake the pending copy.
SPIN_CYCLES = 200_000_000


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_kernels_are_ordered_on_the_current_stream():
    q, k, v = (randn(2, 256, 4, 64, dtype=torch.float16, device="cuda") for _ in range(3))
    fresh_q = randn(2, 256, 4, 64, dtype=torch.float16, device="cuda")
    expected = fusedattn.flash_attn_func(fresh_q, k, v)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(SPIN_CYCLES)  # delays the copy below on `side` only
        q.copy_(fresh_q)
        out = fusedattn.flash_attn_func(q, k, v)  # must see the copied q: same stream
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(out, expected)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_runs_on_the_tensors_device():
    q, k, v = (randn(1, 64, 2, 64, dtype=torch.float16, device="cuda:1") for _ in range(3))
    with torch.cuda.device(0):
        out = fusedattn.flash_attn_func(q, k, v, causal=True)
    assert out.device == q.device
    with torch.cuda.device(1):
        expected = fusedattn.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(out, expected)
