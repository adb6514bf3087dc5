"""Random calls through the flash_attn-style API. Tensors as users hand them over (views of packed
buffers, transposes, padded rows, strided sequences, storage offsets, expanded heads) must give
the reference's answer, forward and backward. Calls with broken arguments (ranks, sizes, dtypes,
layouts, scales, windows, offsets, max_seqlen up to 2^63 - 1, seqused_k, block tables) must run
or raise a Python exception: a crash ends the test process, and a hang its CI job (max_seqlen_q =
10**12 ran for hours until validation lowered it to the offsets' rows)."""
from __future__ import annotations

import functools
import random

import pytest
import torch

import fusedattn
from conftest import DEVICES, DTYPES, assert_matches_reference, assert_varlen_matches_reference, randn

# Exceptions a broken call may raise: the library's errors arrive as ValueError (bad arguments) or
# NotImplementedError (unimplemented features), each message naming the argument after the prefix
# "fusedattn: ". The test's own torch operations on broken tensors (stacking, reshaping) raise
# torch's errors before any call.
LIBRARY_ERRORS = (ValueError, NotImplementedError)
TEST_SETUP_ERRORS = (RuntimeError, IndexError, TypeError)
VIEW_KINDS = ("contiguous", "bhsd", "padded", "packed", "strided", "offset", "expanded")


def view_of(rng: random.Random, kind: str, shape, dtype, device) -> torch.Tensor:
    """A (batch, seqlen, heads, dim) tensor of fresh random values, laid out as `kind` says. All are
    read by the calls (the library allocates what it writes), so they may be expanded."""
    b, s, h, d = shape
    if kind == "bhsd":  # the Triton tutorial's layout, transposed
        return randn(b, h, s, d, dtype=dtype, device=device).transpose(1, 2)
    if kind == "padded":  # rows padded past the head dim, by an odd count too
        return randn(b, s, h, d + rng.choice((3, 8, 64)), dtype=dtype, device=device)[..., :d]
    if kind == "packed":  # one of q/k/v in a (batch, seqlen, 3, heads, dim) buffer
        return randn(b, s, 3, h, d, dtype=dtype, device=device)[:, :, rng.randrange(3)]
    if kind == "strided":  # every second position
        return randn(b, 2 * s, h, d, dtype=dtype, device=device)[:, ::2]
    if kind == "offset":  # a storage offset that is not a multiple of anything
        return randn(b * s * h * d + 3, dtype=dtype, device=device)[3:].view(b, s, h, d)
    if kind == "expanded":  # one head's values read by every head (stride 0)
        return randn(b, s, 1, d, dtype=dtype, device=device).expand(b, s, h, d)
    return randn(b, s, h, d, dtype=dtype, device=device)


def random_mask(rng: random.Random):
    """causal (40% of draws) and window_size (30% bounded on one side or both), independently."""
    causal = rng.random() < 0.4
    window = (rng.choice((-1, 0, 5, 30)), rng.choice((-1, 0, 7))) if rng.random() < 0.3 else (-1, -1)
    return causal, window


@pytest.mark.parametrize("device", DEVICES)
def test_odd_views_match_the_reference(device):
    rng = random.Random(torch.initial_seed())
    head_dims = (8, 40, 64) if device == "cpu" else (64, 128)
    for trial in range(24):
        dtype = rng.choice(DTYPES[device])
        batch, sq, sk = rng.randint(1, 2), rng.randint(1, 70), rng.randint(1, 70)
        hkv = rng.choice((1, 2))
        hq = hkv * rng.choice((1, 2, 3))
        d = rng.choice(head_dims)
        causal, window = random_mask(rng)
        kinds = [rng.choice(VIEW_KINDS) for _ in range(4)]
        q = view_of(rng, kinds[0], (batch, sq, hq, d), dtype, device).requires_grad_()
        k = view_of(rng, kinds[1], (batch, sk, hkv, d), dtype, device).requires_grad_()
        v = view_of(rng, kinds[2], (batch, sk, hkv, d), dtype, device).requires_grad_()
        dout = view_of(rng, kinds[3], (batch, sq, hq, d), dtype, device)
        label = f"trial {trial}: {dtype} B{batch} Sq{sq} Sk{sk} H{hq}/{hkv} D{d} causal={causal} " \
                f"window={window} views={kinds}"
        out, lse, _ = fusedattn.flash_attn_func(q, k, v, causal=causal, window_size=window, return_attn_probs=True)
        assert_matches_reference(q, k, v, dout, out, lse, causal, window, label=f"{label}: ")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_misaligned_cuda_views_are_read_through_copies():
    """The CUDA kernels load 16-byte vectors. A view at an odd storage offset or with an odd row
    length is read through a contiguous copy, forward and backward, and left unchanged."""
    rng = random.Random(torch.initial_seed())
    b, s, h, d = 2, 45, 2, 64
    for dtype in DTYPES["cuda"]:
        for causal in (False, True):
            q = view_of(rng, "offset", (b, s, h, d), dtype, "cuda").requires_grad_()
            k = randn(b, s, h, d + 3, dtype=dtype, device="cuda")[..., :d].requires_grad_()
            v = view_of(rng, "offset", (b, s, h, d), dtype, "cuda").requires_grad_()
            dout = view_of(rng, "offset", (b, s, h, d), dtype, "cuda")
            assert q.data_ptr() % 16 and k.stride(2) % 8
            before = [t.detach().clone() for t in (q, k, v, dout)]
            out, lse, _ = fusedattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
            assert_matches_reference(q, k, v, dout, out, lse, causal, (-1, -1), label=f"{dtype} causal={causal}: ")
            for name, t, old in zip(("q", "k", "v", "dout"), (q, k, v, dout), before):
                assert torch.equal(t.detach(), old), f"{name} changed"


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_views_and_bounds_match_the_reference(device):
    """Packed sequences (some empty) in the same views, with max_seqlen at the longest sequence, a
    little above it, or far above (a model's context length, up to 2^40)."""
    rng = random.Random(torch.initial_seed())
    head_dims = (8, 64) if device == "cpu" else (64, 128)
    for trial in range(16):
        dtype = rng.choice(DTYPES[device])
        hkv = rng.choice((1, 2))
        hq = hkv * rng.choice((1, 2))
        d = rng.choice(head_dims)
        lens_q = [rng.choice((1, 7, 33, 70))] + [rng.choice((0, 1, 7, 33, 70)) for _ in range(rng.randint(0, 3))]
        lens_k = [n if rng.random() < 0.5 else rng.choice((0, 1, 9, 40, 64)) for n in lens_q]
        causal, window = random_mask(rng)
        kinds = [rng.choice(VIEW_KINDS) for _ in range(4)]
        total_q, total_k = sum(lens_q), sum(lens_k)
        q = view_of(rng, kinds[0], (1, total_q, hq, d), dtype, device)[0].requires_grad_()
        k = view_of(rng, kinds[1], (1, total_k, hkv, d), dtype, device)[0].requires_grad_()
        v = view_of(rng, kinds[2], (1, total_k, hkv, d), dtype, device)[0].requires_grad_()
        dout = view_of(rng, kinds[3], (1, total_q, hq, d), dtype, device)[0]
        cu_q, cu_k = (torch.tensor([0] + lens, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
                      for lens in (lens_q, lens_k))
        bound = rng.choice((0, 5, 2 ** 40))
        max_q, max_k = max(lens_q) + bound, max(lens_k) + bound
        label = f"trial {trial}: {dtype} q{lens_q} k{lens_k} H{hq}/{hkv} D{d} causal={causal} window={window} " \
                f"max_seqlen +{bound} views={kinds}: "
        out, lse, _ = fusedattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal,
                                                       window_size=window, return_attn_probs=True)
        assert_varlen_matches_reference(q, k, v, dout, cu_q, cu_k, out, lse, causal, window, label)


def broken_tensor(rng: random.Random, device) -> torch.Tensor:
    """A tensor of random rank (0-5), sizes (0-9, sometimes a head dim), dtype and layout."""
    rank = rng.choice((0, 1, 2, 3, 3, 4, 4, 4, 5))
    shape = [rng.choice((0, 1, 2, 3, 8, 9, 64, 300)) if i == rank - 1 else rng.randint(0, 9) for i in range(rank)]
    dtype = rng.choice((torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64))
    t = torch.randn(*shape).to(dtype=dtype, device=device) if rank else torch.tensor(1.0, device=device)
    if rank >= 2 and rng.random() < 0.3:
        t = t.transpose(-1, -2)  # last dimension not contiguous (unless it has one element)
    if rank >= 1 and rng.random() < 0.2:
        t = t[..., ::2]
    return t


def offsets(rng: random.Random, device) -> torch.Tensor:
    """cu_seqlens of random length, content, dtype and layout: often wrong."""
    n = rng.randint(0, 4)
    values = sorted(rng.randint(0, 12) for _ in range(n))
    if values and rng.random() < 0.5:
        values[0] = 0
    if rng.random() < 0.2:
        rng.shuffle(values)
    dtype = torch.int32 if rng.random() < 0.8 else rng.choice((torch.int64, torch.float32))
    cu = torch.tensor(values, dtype=dtype, device=device)
    return cu[::2] if rng.random() < 0.1 else cu


def max_seqlen(rng: random.Random) -> int:
    return rng.choice((-1, 0, 1, 5, 12, 100, 2 ** 40, 2 ** 63 - 1))


@pytest.mark.parametrize("device", DEVICES)
def test_broken_calls_raise_or_run(device):
    rng = random.Random(torch.initial_seed())
    calls, ran = 300, 0
    dtype = DTYPES[device][0]
    for trial in range(calls):
        # A valid base call most of the time, with one or more of its arguments broken.
        b, s, h, d = rng.randint(1, 2), rng.randint(1, 12), rng.choice((1, 2)), rng.choice((8, 64))
        q, k, v = (randn(b, s, h, d, dtype=dtype, device=device) for _ in range(3))
        kwargs = dict(causal=rng.random() < 0.3, window_size=(rng.randint(-3, 20), rng.randint(-3, 20)),
                      softmax_scale=rng.choice((None, None, 0.5, -1.0, 0.0, float("inf"), float("nan"))))
        entry = rng.choice(("dense", "dense", "varlen", "qkvpacked", "kvpacked", "kvcache"))
        broken = [rng.random() < 0.25 for _ in range(3)]
        q, k, v = (broken_tensor(rng, device) if bad else t for bad, t in zip(broken, (q, k, v)))
        backward = rng.random() < 0.3
        try:
            for t in (q, k, v):
                if t.is_floating_point():
                    t.requires_grad_(backward)
            if entry == "dense":
                call = functools.partial(fusedattn.flash_attn_func, q, k, v, **kwargs)
            elif entry == "qkvpacked":
                call = functools.partial(fusedattn.flash_attn_qkvpacked_func, torch.stack((q, k, v), dim=2), **kwargs)
            elif entry == "kvpacked":
                call = functools.partial(fusedattn.flash_attn_kvpacked_func, q, torch.stack((k, v), dim=2), **kwargs)
            elif entry == "kvcache":  # k and v as the caches; new tokens, lengths and rotary tables at random
                new_kv = {}
                if rng.random() < 0.5:
                    n = rng.choice((0, 1, 3))
                    new_kv = dict(k=randn(b, n, h, d, dtype=dtype, device=device),
                                  v=randn(b, n, h, d, dtype=dtype, device=device))
                    if rng.random() < 0.5:
                        half = rng.choice((0, 4, d // 2, d))
                        new_kv.update(rotary_cos=torch.rand(rng.choice((0, 3, 40)), half, device=device),
                                      rotary_sin=torch.rand(40, half, device=device))
                lengths = [rng.choice((-3, 0, 1, s - 1, s, s + 3)) for _ in range(b)]
                cache_seqlens = rng.choice((lengths[0], None, torch.tensor(
                    lengths, dtype=rng.choice((torch.int32, torch.int32, torch.int64)), device=device)))
                if rng.random() < 0.3:  # the caches' rows as a pool of pages, the table often right
                    page = rng.choice((1, 2, 5))
                    pageable = [t.dim() == 4 and t.shape[1] % page == 0 for t in (k, v)]
                    k, v = (t.reshape(-1, page, *t.shape[2:]) if ok else t for ok, t in zip(pageable, (k, v)))
                    blocks = k.shape[0] if k.dim() == 4 else 1
                    row = [rng.choice((0, blocks - 1, rng.randrange(-2, blocks + 2))) for _ in range(rng.randint(1, 4))]
                    kwargs["block_table"] = torch.tensor([row] * b, device=device,
                                                         dtype=torch.int32 if rng.random() < 0.9 else torch.int64)
                elif rng.random() < 0.2:  # each sequence's cache row, often a valid one
                    rows = k.shape[0] if k.dim() == 4 else 1
                    kwargs["cache_batch_idx"] = torch.tensor(
                        [rng.choice((0, rows - 1, rng.randrange(-1, rows + 1))) for _ in range(b)], device=device,
                        dtype=torch.int32 if rng.random() < 0.9 else torch.int64)
                elif rng.random() < 0.2:  # where each sequence's keys start, often inside its length
                    pads = [rng.choice((0, 1, rng.randrange(-1, s + 2))) for _ in range(b)]
                    kwargs["cache_leftpad"] = torch.tensor(pads, dtype=torch.int32, device=device)
                call = functools.partial(fusedattn.flash_attn_with_kvcache, q, k.detach(), v.detach(),
                                         cache_seqlens=cache_seqlens, **new_kv, **kwargs)
            else:
                flat = [t.reshape(-1, *t.shape[2:]) if t.dim() == 4 else t for t in (q, k, v)]
                cu_q = offsets(rng, device) if rng.random() < 0.5 else torch.tensor([0, flat[0].shape[0]],
                                                                                      dtype=torch.int32, device=device)
                cu_k = offsets(rng, device) if rng.random() < 0.5 else torch.tensor([0, flat[1].shape[0]],
                                                                                      dtype=torch.int32, device=device)
                if rng.random() < 0.3:  # key counts per sequence: often right, sometimes not
                    n = cu_q.shape[0] - 1 if rng.random() < 0.8 else rng.randint(0, 4)
                    used_dtype = torch.int32 if rng.random() < 0.8 else rng.choice((torch.int64, torch.float32))
                    counts = [rng.choice((-5, 0, 1, 7, 2 ** 31 - 1)) for _ in range(max(n, 0))]
                    kwargs["seqused_k"] = torch.tensor(counts, dtype=used_dtype, device=device)
                if rng.random() < 0.2:  # k and v's rows padded into pages, read through a table often right
                    page = rng.choice((1, 3, 128))  # 128: what the CUDA kernels read
                    for i in (1, 2):
                        if flat[i].dim() == 3:
                            rows = flat[i].shape[0]
                            pool = flat[i].new_zeros(max(1, -(-rows // page)), page, *flat[i].shape[1:])
                            pool.view(-1, *flat[i].shape[1:])[:rows] = flat[i]
                            flat[i] = pool
                    blocks = flat[1].shape[0] if flat[1].dim() == 4 else 1
                    sequences, columns = max(cu_q.shape[0] - 1, 0), rng.randint(1, 4)
                    table = [[j % blocks if rng.random() < 0.8 else rng.randrange(-2, blocks + 2)
                              for j in range(b * columns, (b + 1) * columns)] for b in range(sequences)]
                    kwargs["block_table"] = torch.tensor(table, device=device, dtype=torch.int32 if rng.random() < 0.9
                                                         else torch.int64).view(sequences, columns)
                call = functools.partial(fusedattn.flash_attn_varlen_func, *flat, cu_q, cu_k, max_seqlen(rng),
                                         max_seqlen(rng), **kwargs)
        except TEST_SETUP_ERRORS:
            continue  # the test's own torch operations turned the broken tensors down
        try:
            out = call()
            if backward and out.requires_grad:
                out.sum().backward()
            ran += 1
        except LIBRARY_ERRORS as e:
            assert str(e).startswith("fusedattn: "), f"{entry}: {type(e).__name__} not from fusedattn's checks: {e}"
    # Enough of the calls are valid that the run path is exercised too.
    assert ran * 30 >= calls, f"only {ran} of {calls} calls ran"
