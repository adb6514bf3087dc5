"""Shared helpers for the Python tests: the float64 reference, the plain same-dtype implementation,
the 2x error rule, fresh random inputs and poisoned outputs."""
from __future__ import annotations

import math
import os
import zlib

import pytest
import torch

import fusedattn

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device"))]
# The CUDA kernels take half precision only; the CPU backend also takes float32.
DTYPES = {"cpu": (torch.float32, torch.float16, torch.bfloat16), "cuda": (torch.float16, torch.bfloat16)}
# check_device_errors raises one fault a call; a failed test leaves at most a few.
_MAX_FAULTS_LEFT = 16


@pytest.fixture(autouse=True)
def fresh_seed(request):
    """Every test draws its own inputs, reproducibly (the seed is derived from the test's id, and
    from FUSEDATTN_TEST_SEED where that is set: other draws of the same tests, e.g. a longer fuzz
    run with `for s in $(seq 20); do FUSEDATTN_TEST_SEED=$s pytest -q test_fuzz.py; done`)."""
    torch.manual_seed(zlib.crc32((request.node.nodeid + os.environ.get("FUSEDATTN_TEST_SEED", "")).encode()))


@pytest.fixture(autouse=True)
def no_fault_left_from_an_earlier_test():
    """A test that fails before its check_device_errors leaves its device-check faults recorded;
    they are taken here, so that the next test's checks see only its own (each test that makes a
    fault asserts that check_device_errors raises it). CUDA is only asked where torch has set it up
    already: a first CUDA call in this process could break a later test's forked workers."""
    devices = ["cpu"] + (["cuda"] if HAS_CUDA and torch.cuda.is_initialized() else [])
    for device in devices:
        for _ in range(_MAX_FAULTS_LEFT):
            try:
                fusedattn.check_device_errors(device)
                break
            except ValueError:
                continue


@pytest.fixture(autouse=True)
def poisoned_outputs():
    """Fills every torch.empty (so every output and workspace the operators allocate) with NaN
    (integers with their maximum) before the kernels run: an element a kernel forgets to write
    shows up as NaN instead of a lucky zero."""
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.utils.deterministic.fill_uninitialized_memory = fill
    torch.use_deterministic_algorithms(was_on, warn_only=was_warn)


def allowed_keys(seqlen_q: int, seqlen_k: int, window_left: int, window_right: int, device) -> torch.Tensor:
    """[seqlen_q, seqlen_k] bool: which keys each query sees (bottom-right aligned window; -1 = no limit)."""
    i = torch.arange(seqlen_q, device=device)[:, None]
    j = torch.arange(seqlen_k, device=device)[None, :]
    diag = i + seqlen_k - seqlen_q
    ok = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if window_left >= 0:
        ok &= j >= diag - window_left
    if window_right >= 0:
        ok &= j <= diag + window_right
    return ok


def attention_math(q, k, v, dout, scale, window_left=-1, window_right=-1, dtype=torch.float64, allowed=None,
                   stored_out=None):
    """Plain attention and its gradients in `dtype`, on one dense (batch, seqlen, heads, dim) batch.

    Returns out, lse [batch, heads, seqlen_q], dq, dk, dv. Fully masked rows give out = 0, lse = -inf
    and zero gradients. Used in float64 as the reference and in the inputs' dtype as the "plain
    same-dtype implementation" of the 2x rule; in half precision its lse is the float32 one of the
    same inputs, as the kernels return lse (flash_attn's softmax_lse) in float32: a logsumexp
    rounded to bf16 would set the bar at its own rounding, 0.06 at an lse of 8. `allowed` (bool,
    broadcastable to [batch, heads, seqlen_q, seqlen_k]) hides more keys on top of the window.
    `stored_out` (the output as a kernel stored it) gives the backward's delta = dO . O over it, as
    the FlashAttention backward reads its O back: in float64, that algorithm's own model.
    """
    inputs = (q, k, v)
    group = q.shape[2] // k.shape[2]
    q, k, v = (t.to(dtype).transpose(1, 2) for t in (q, k, v))  # (batch, heads, seqlen, dim)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~allowed_keys(q.shape[2], k.shape[2], window_left, window_right, q.device), -math.inf)
    if allowed is not None:
        s = s.masked_fill(~allowed.to(q.device), -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    lse_or_zero = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))  # no -inf - (-inf)
    p = torch.exp(s - lse_or_zero[..., None])
    out = p @ v
    if dtype in (torch.float16, torch.bfloat16):
        lse = attention_math(*inputs, None, scale, window_left, window_right, torch.float32, allowed)[1]
    result = [out.transpose(1, 2), lse]
    if dout is not None:
        do = dout.to(dtype).transpose(1, 2)
        dv = p.transpose(-1, -2) @ do
        dp = do @ v.transpose(-1, -2)
        o = out if stored_out is None else stored_out.to(dtype).transpose(1, 2)
        delta = (do * o).sum(-1, keepdim=True)
        ds = p * (dp - delta) * scale
        dq = ds @ k
        dk = ds.transpose(-1, -2) @ q

        def fold(t):  # sum each GQA group's query heads onto its KV head
            b, h, s_, d = t.shape
            return t.view(b, h // group, group, s_, d).sum(2).transpose(1, 2)

        result += [dq.transpose(1, 2), fold(dk), fold(dv)]
    return result


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


# float32: the plain implementation is nearly exact, and a tiled algorithm legitimately sums in a
# different order; allow the same 1e-5 relative slack as the C++ CPU tests.
FP32_RELATIVE_SLACK = 1e-5


def atol_for(dtype: torch.dtype, magnitude: float) -> float:
    """Small absolute slack of the 2x rule: one unit in the last place of the result's magnitude
    (half precision), or FP32_RELATIVE_SLACK of it (float32)."""
    unit = FP32_RELATIVE_SLACK if dtype == torch.float32 else torch.finfo(dtype).eps
    return unit * max(1.0, magnitude)


def assert_2x_rule(name: str, ours: torch.Tensor, reference: torch.Tensor, plain: torch.Tensor) -> None:
    """err(ours) <= 2 * err(plain same-dtype implementation) + atol, both against float64."""
    ref = reference.double()
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(ours), finite), f"{name}: non-finite values differ from the reference"
    # Where the reference is not finite (a fully masked row's lse: -inf) ours must be the same value:
    # a NaN there is the poison of an element never written, +inf a wrong sign.
    torch.testing.assert_close(ours.double()[~finite], ref[~finite], rtol=0, atol=0, equal_nan=True,
                               msg=lambda m: f"{name}: non-finite values differ from the reference: {m}")
    err = (ours.double() - ref)[finite].abs().max().item() if finite.any() else 0.0
    plain_err = (plain.double() - ref)[finite].abs().max().item() if finite.any() else 0.0
    magnitude = ref[finite].abs().max().item() if finite.any() else 0.0
    bound = 2 * plain_err + atol_for(ours.dtype, magnitude)
    assert err <= bound, f"{name}: error {err:.3e} > 2 x plain {plain_err:.3e} + atol (bound {bound:.3e})"


def assert_matches_reference(q, k, v, dout, out, lse, causal, window, label=""):
    """out and lse of a call on q, k, v (flash_attn's causal and window_size) and their gradients
    for dout, taken through autograd, against the float64 reference by the 2x rule."""
    assert lse.dtype == torch.float32, f"{label}softmax_lse is {lse.dtype}, flash_attn returns float32"
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    left, right = window[0], (0 if causal else window[1])
    args = (q.detach(), k.detach(), v.detach(), dout, default_scale(q.shape[-1]), left, right)
    reference = attention_math(*args, dtype=torch.float64)
    plain = attention_math(*args, dtype=q.dtype)
    for name, ours, ref, pl in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, dq, dk, dv), reference, plain):
        assert_2x_rule(label + name, ours.detach(), ref, pl)


def assert_varlen_matches_reference(q, k, v, dout, cu_q, cu_k, out, lse, causal, window, label=""):
    """A varlen call's out, lse and gradients for dout (autograd) against the float64 reference run
    on each sequence alone, by the 2x rule."""
    assert lse.dtype == torch.float32, f"{label}softmax_lse is {lse.dtype}, flash_attn returns float32"
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    left, right = window[0], (0 if causal else window[1])
    scale = default_scale(q.shape[-1])
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cu_q) - 1):
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        args = (q.detach()[rq][None], k.detach()[rk][None], v.detach()[rk][None], dout[rq][None], scale, left, right)
        reference, plain = attention_math(*args), attention_math(*args, dtype=q.dtype)
        ours = (out[rq], lse[:, rq], dq[rq], dk[rk], dv[rk])
        for name, o, r, p in zip(("out", "lse", "dq", "dk", "dv"), ours, reference, plain):
            assert_2x_rule(f"{label}{name}[seq {b}]", o.detach(), r[0], p[0])


def randn(*shape, dtype, device, scale=1.0):
    return (torch.randn(*shape, dtype=torch.float32) * scale).to(dtype=dtype, device=device)
