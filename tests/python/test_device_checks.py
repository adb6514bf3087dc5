"""Offsets checked on the device (flash_attn_varlen_func's check_on_device, and every varlen call
captured in a CUDA graph): the host-checked call's answer bit for bit; a fault fills the outputs
with NaN and fusedattn.check_device_errors() raises it as the host check would have; paged decode
(flash_attn_varlen_func and flash_attn_with_kvcache) captured in a CUDA graph and replayed with new
lengths, tables and queries."""
from __future__ import annotations

import pytest
import torch

import fusedattn
from conftest import HAS_CUDA, randn
from test_kvcache import check_against_reference, paged
from test_paged import CUDA_PAGE, case, offsets

pytestmark = pytest.mark.skipif(not HAS_CUDA, reason="the device check is the CUDA backend's")

DTYPE = torch.float16


def varlen_args(page):
    """A ragged paged or packed call: (args, kwargs) for flash_attn_varlen_func."""
    lens_q, lens_k = [3, 40, 1], [300, 0, 700]
    q, k, v, cu_q, cu_k, k_pool, v_pool, table = case("cuda", DTYPE, CUDA_PAGE, lens_q, lens_k)
    if page:
        return [q, k_pool, v_pool, cu_q, cu_k, 40, 700], {"block_table": table}
    return [q, k, v, cu_q, cu_k, 40, 700], {}


@pytest.mark.parametrize("page", [False, True], ids=["packed", "paged"])
@pytest.mark.parametrize("causal", [False, True])
def test_check_on_device_gives_the_host_checked_answer(page, causal):
    args, kwargs = varlen_args(page)
    host = fusedattn.flash_attn_varlen_func(*args, causal=causal, return_attn_probs=True, **kwargs)
    device = fusedattn.flash_attn_varlen_func(*args, causal=causal, return_attn_probs=True, check_on_device=True,
                                              **kwargs)
    assert torch.equal(device[0], host[0]) and torch.equal(device[1], host[1])
    fusedattn.check_device_errors()


@pytest.mark.parametrize("fault", ["offsets", "table"])
def test_a_fault_fills_the_outputs_with_nan_and_is_raised_once(fault):
    args, kwargs = varlen_args(fault == "table")
    if fault == "offsets":
        args[3] = args[3].clone()
        args[3][2] = 2  # below entry 1 (3)
    else:
        kwargs["block_table"] = kwargs["block_table"].clone()
        kwargs["block_table"][2, 1] = -5  # sequence 2's keys 128-255
    with pytest.raises(ValueError) as host:
        fusedattn.flash_attn_varlen_func(*args, **kwargs)
    out, lse, _ = fusedattn.flash_attn_varlen_func(*args, return_attn_probs=True, check_on_device=True, **kwargs)
    assert out.isnan().all() and lse.isnan().all()
    with pytest.raises(ValueError) as found:
        fusedattn.check_device_errors(args[0].device)
    assert str(found.value) == str(host.value)
    assert ("cu_seqlens_q: must be non-decreasing" if fault == "offsets" else "block_table: entry [2, 1] is -5") \
        in str(found.value)
    fusedattn.check_device_errors()


def varlen_grads(args, **kwargs):
    """(out, dq, dk, dv) of a packed call with fresh leaves and a fresh incoming gradient."""
    q, k, v = (t.detach().clone().requires_grad_() for t in args[:3])
    out = fusedattn.flash_attn_varlen_func(q, k, v, *args[3:], deterministic=True, **kwargs)
    out.backward(randn(*out.shape, dtype=out.dtype, device=out.device))
    return out, q.grad, k.grad, v.grad


@pytest.mark.parametrize("causal", [False, True])
def test_the_backward_of_a_device_checked_call_checks_on_the_device(causal):
    args, _ = varlen_args(page=False)
    torch.manual_seed(1)
    host = varlen_grads(args, causal=causal)
    torch.manual_seed(1)
    device = varlen_grads(args, causal=causal, check_on_device=True)
    for h, d in zip(host, device):
        assert torch.equal(h, d)
    fusedattn.check_device_errors()
    # Offsets spoiled after the forward (through .data, which autograd's version check does not
    # see): the backward's own device check fills the gradients with NaN and records the fault.
    args[3] = args[3].clone()
    q, k, v = (t.detach().clone().requires_grad_() for t in args[:3])
    out = fusedattn.flash_attn_varlen_func(q, k, v, *args[3:], causal=causal, check_on_device=True)
    args[3].data[2] = 2  # below entry 1 (3)
    out.backward(randn(*out.shape, dtype=out.dtype, device=out.device))
    assert q.grad.isnan().all() and k.grad.isnan().all() and v.grad.isnan().all()
    with pytest.raises(ValueError, match="cu_seqlens_q: must be non-decreasing"):
        fusedattn.check_device_errors()
    fusedattn.check_device_errors()


def capture(fn):
    """fn() captured into a CUDA graph after a warm-up on a side stream (torch's recipe); returns
    the graph and the outputs its replays write."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph, outputs


def test_paged_varlen_decode_replays_new_lengths_and_tables():
    """vLLM's decode step: one query per sequence over paged caches, seqused_k giving the keys in
    use and static offsets spanning each table row; each replay reads the lengths, table and
    queries written into the captured tensors, and gives the eager host-checked call's bits."""
    batch, hq, hkv, d, page, columns = 4, 8, 2, 128, CUDA_PAGE, 3
    capacity = page * columns
    k_cache, v_cache = (randn(batch, capacity, hkv, d, dtype=DTYPE, device="cuda") for _ in range(2))
    k_pool, v_pool, table = paged(k_cache, v_cache, page)
    q = randn(batch, hq, d, dtype=DTYPE, device="cuda")
    used = torch.tensor([1, page, 2 * page + 5, capacity], dtype=torch.int32, device="cuda")
    cu_q = offsets([1] * batch, "cuda")
    cu_k = offsets([capacity] * batch, "cuda")

    def step():
        return fusedattn.flash_attn_varlen_func(q, k_pool, v_pool, cu_q, cu_k, 1, capacity, block_table=table,
                                                seqused_k=used, causal=True)

    graph, out = capture(step)
    for lengths in ([capacity, 7, 0, page + 1], [2, 2 * page, capacity - 1, 1]):
        used.copy_(torch.tensor(lengths, dtype=torch.int32))
        table.copy_(table[torch.randperm(batch, device="cuda")])  # each row now another sequence's pages
        q.copy_(randn(batch, hq, d, dtype=DTYPE, device="cuda"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, step())
        fusedattn.check_device_errors()
    table[1, 0] = k_pool.shape[0]  # a page past the pool, reached by sequence 1's keys
    graph.replay()
    torch.cuda.synchronize()
    assert out.isnan().all()
    with pytest.raises(ValueError, match=r"block_table: entry \[1, 0\] is"):
        fusedattn.check_device_errors()


def test_kvcache_paged_decode_is_captured_and_replayed():
    """flash_attn_with_kvcache over pages read in place, lengths in a CUDA tensor, no new tokens:
    nothing read on the host, so it is captured; each replay attends over the lengths it finds,
    as the reference over the logical caches says."""
    batch, hq, hkv, d, page = 3, 8, 2, 64, CUDA_PAGE
    capacity = 3 * page
    k_cache, v_cache = (randn(batch, capacity, hkv, d, dtype=DTYPE, device="cuda") for _ in range(2))
    k_pool, v_pool, table = paged(k_cache, v_cache, page)
    q = randn(batch, 1, hq, d, dtype=DTYPE, device="cuda")
    lengths = torch.tensor([1, page + 8, capacity], dtype=torch.int32, device="cuda")
    graph, (out, lse) = capture(lambda: fusedattn.flash_attn_with_kvcache(
        q, k_pool, v_pool, cache_seqlens=lengths, block_table=table, return_softmax_lse=True))
    for visible in ([1, page + 8, capacity], [capacity, 0, 2]):
        lengths.copy_(torch.tensor(visible, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        check_against_reference(q, k_cache, v_cache, visible, out, lse, False, (-1, -1))
    fusedattn.check_device_errors()
