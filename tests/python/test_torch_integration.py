"""Streams and devices follow torch: kernels are ordered on the caller's current stream and run
on the tensors' device whatever the current device is."""
from __future__ import annotations

import pytest
import torch

import fusedattn
from conftest import DEVICES, HAS_CUDA, randn

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


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_offsets_are_rechecked_when_they_change(device):
    """The binding checks a cu_seqlens tensor once per version (checked_offsets.h); an in-place
    write bumps torch's version counter, so bad new contents are still caught."""
    dtype = torch.float16 if device == "cuda" else torch.float32
    q, k, v = (randn(37, 2, 64, dtype=dtype, device=device) for _ in range(3))
    cu = torch.tensor([0, 7, 37], dtype=torch.int32, device=device)
    expected = fusedattn.flash_attn_varlen_func(q, k, v, cu, cu, 30, 30, causal=True)
    assert torch.equal(fusedattn.flash_attn_varlen_func(q, k, v, cu, cu, 30, 30, causal=True), expected)
    cu[0] = 1  # in place: a new version with contents that fail the check
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        fusedattn.flash_attn_varlen_func(q, k, v, cu, cu, 30, 30, causal=True)
    cu[0] = 0
    assert torch.equal(fusedattn.flash_attn_varlen_func(q, k, v, cu, cu, 30, 30, causal=True), expected)
    with pytest.raises(ValueError, match="max_seqlen_q"):  # the check is per max_seqlen too
        fusedattn.flash_attn_varlen_func(q, k, v, cu, cu, 29, 30, causal=True)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_offsets_made_in_inference_mode(device):
    """Inference tensors have no version counter: their offsets are checked on every call."""
    dtype = torch.float16 if device == "cuda" else torch.float32
    with torch.inference_mode():
        q, k, v = (randn(37, 2, 64, dtype=dtype, device=device) for _ in range(3))
        cu = torch.tensor([0, 7, 37], dtype=torch.int32, device=device)
        first = fusedattn.flash_attn_varlen_func(q, k, v, cu, cu, 30, 30)
        assert torch.equal(fusedattn.flash_attn_varlen_func(q, k, v, cu, cu, 30, 30), first)
        cu[0] = 1
        with pytest.raises(ValueError, match="cu_seqlens_q"):
            fusedattn.flash_attn_varlen_func(q, k, v, cu, cu, 30, 30)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_varlen_calls_can_be_captured_in_a_cuda_graph():
    """Once its offsets are checked, a varlen call makes no device-to-host copy: a CUDA graph can
    capture the forward and backward operators (a copy would fail the capture), and the replay
    matches the eager calls."""
    q, k, v, dout = (randn(300, 4, 128, dtype=torch.bfloat16, device="cuda") for _ in range(4))
    cu = torch.tensor([0, 100, 101, 300], dtype=torch.int32, device="cuda")
    ops = torch.ops.fusedattn
    mask = (None, True, -1, 0, True)  # softmax_scale, causal, window_left, window_right, deterministic

    def step():
        out, lse = ops.varlen_fwd(q, k, v, cu, cu, 199, 199, *mask)
        return (out, lse, *ops.varlen_bwd(dout, q, k, v, out, lse, cu, cu, 199, 199, *mask))

    expected = step()  # eager: checks the offsets once
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up on the capture stream, as torch recommends
        with torch.cuda.graph(graph, stream=side):
            captured = step()
    torch.cuda.current_stream().wait_stream(side)
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, expected):
        assert torch.equal(got, want)
