"""The operators under torch.library.opcheck and torch.compile(fullgraph=True)."""
from __future__ import annotations

import pytest
import torch

import fusedattn
from conftest import DEVICES, DTYPES, randn

ops = torch.ops.fusedattn


def dense_inputs(device, dtype, requires_grad=True):
    q = randn(2, 24, 4, 64, dtype=dtype, device=device).requires_grad_(requires_grad)
    k = randn(2, 31, 2, 64, dtype=dtype, device=device).requires_grad_(requires_grad)
    v = randn(2, 31, 2, 64, dtype=dtype, device=device).requires_grad_(requires_grad)
    return q, k, v


def varlen_inputs(device, dtype, requires_grad=True):
    cu_q = torch.tensor([0, 5, 5, 29], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 9, 12, 43], dtype=torch.int32, device=device)
    q = randn(29, 4, 64, dtype=dtype, device=device).requires_grad_(requires_grad)
    k = randn(43, 2, 64, dtype=dtype, device=device).requires_grad_(requires_grad)
    v = randn(43, 2, 64, dtype=dtype, device=device).requires_grad_(requires_grad)
    return q, k, v, cu_q, cu_k, 24, 31


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_forward_ops(device):
    dtype = DTYPES[device][-1]
    torch.library.opcheck(ops.fwd, (*dense_inputs(device, dtype), None, True, -1, 0, False))
    torch.library.opcheck(ops.fwd, (*dense_inputs(device, dtype), 0.2, False, 7, 3, True))
    torch.library.opcheck(ops.varlen_fwd, (*varlen_inputs(device, dtype), None, True, -1, 0, False))
    # Paged K/V (forward only, so no gradients asked for): varlen_inputs' keys in pages of 128 rows
    # (the CUDA kernels' multiple), sequence b's in page b.
    q, k, v, cu_q, cu_k, max_q, max_k = varlen_inputs(device, dtype, requires_grad=False)
    page = 128
    pages = [torch.zeros(3, page, *t.shape[1:], dtype=dtype, device=device) for t in (k, v)]
    bounds = cu_k.tolist()
    for b in range(3):
        for pool, packed in zip(pages, (k, v)):
            pool[b, :bounds[b + 1] - bounds[b]] = packed[bounds[b]:bounds[b + 1]]
    table = torch.arange(3, dtype=torch.int32, device=device)[:, None]
    torch.library.opcheck(ops.varlen_fwd, (q, *pages, cu_q, cu_k, max_q, max_k, None, True, -1, 0, False, None,
                                           table))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_backward_ops(device):
    dtype = DTYPES[device][-1]
    q, k, v = dense_inputs(device, dtype, requires_grad=False)
    out, lse = ops.fwd(q, k, v, None, True, -1, 0)
    torch.library.opcheck(ops.bwd, (torch.randn_like(out), q, k, v, out, lse, None, True, -1, 0, False))
    q, k, v, cu_q, cu_k, max_q, max_k = varlen_inputs(device, dtype, requires_grad=False)
    out, lse = ops.varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, None, False, -1, -1)
    torch.library.opcheck(ops.varlen_bwd, (torch.randn_like(out), q, k, v, out, lse, cu_q, cu_k, max_q, max_k,
                                           None, False, -1, -1, False))


class TinyAttentionBlock(torch.nn.Module):
    """Projections around fusedattn, as a model would use it."""

    def __init__(self, dim=128, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        batch, seqlen, dim = x.shape
        qkv = self.qkv(x).view(batch, seqlen, 3, self.heads, dim // self.heads)
        out = fusedattn.flash_attn_qkvpacked_func(qkv, causal=True)
        return self.proj(out.reshape(batch, seqlen, dim))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_forward_and_backward(device, backend):
    dtype = DTYPES[device][-1]
    torch._dynamo.reset()
    model = TinyAttentionBlock().to(device=device, dtype=dtype)
    x = randn(2, 40, 128, dtype=dtype, device=device)
    compiled = torch.compile(model, fullgraph=True, backend=backend)  # fullgraph: a graph break raises

    eager_out = model(x)
    eager_grads = torch.autograd.grad(eager_out.float().square().sum(), list(model.parameters()))
    out = compiled(x)
    grads = torch.autograd.grad(out.float().square().sum(), list(model.parameters()))
    # Same kernels in both; only the surrounding projections may be fused differently by inductor.
    tol = dict(rtol=2e-2, atol=2e-2) if dtype != torch.float32 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out, eager_out, **tol)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, **tol)


def test_compile_traces_the_ops_as_single_nodes():
    """The graph dynamo captures contains the fusedattn operator itself, not a decomposition."""
    seen = []

    def capture(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    q, k, v = dense_inputs("cpu", torch.float32, requires_grad=False)
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v: fusedattn.flash_attn_func(q, k, v, causal=True), backend=capture,
                       fullgraph=True)
    torch.testing.assert_close(fn(q, k, v), fusedattn.flash_attn_func(q, k, v, causal=True), rtol=0, atol=0)
    assert any("fusedattn.fwd" in t for t in seen), seen
