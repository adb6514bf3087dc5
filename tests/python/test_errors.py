"""Invalid calls raise a Python exception that names the argument at fault."""
from __future__ import annotations

import pytest
import torch

import fusedattn
from conftest import HAS_CUDA, randn

ops = torch.ops.fusedattn


def qkv(dtype=torch.float32, device="cpu", shape=(1, 8, 2, 64)):
    return tuple(randn(*shape, dtype=dtype, device=device) for _ in range(3))


@pytest.mark.parametrize("kwargs, argument", [
    (dict(dropout_p=0.1), "dropout_p"),
    (dict(softcap=30.0), "softcap"),
    (dict(alibi_slopes=torch.ones(2)), "alibi_slopes"),
])
def test_unimplemented_features_name_the_argument(kwargs, argument):
    with pytest.raises(NotImplementedError, match=argument):
        fusedattn.flash_attn_func(*qkv(), **kwargs)


def test_unsupported_dtype():
    q, k, v = qkv(torch.float64)
    with pytest.raises(ValueError, match=r"q: dtype .*not supported"):
        fusedattn.flash_attn_func(q, k, v)


def test_mismatched_dtypes():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"k: dtype"):
        fusedattn.flash_attn_func(q, k.half(), v)


def test_wrong_rank():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"q: expected rank 4"):
        fusedattn.flash_attn_func(q[0], k, v)
    with pytest.raises(ValueError, match=r"q: expected rank 3"):
        fusedattn.flash_attn_varlen_func(q, k, v, torch.tensor([0, 8], dtype=torch.int32),
                                         torch.tensor([0, 8], dtype=torch.int32), 8, 8)


def test_non_contiguous_last_dim():
    q, k, v = qkv(shape=(1, 8, 2, 64))
    strided = randn(1, 8, 2, 128, dtype=torch.float32, device="cpu")[..., ::2]
    with pytest.raises(ValueError, match=r"k: the last dimension must be contiguous"):
        fusedattn.flash_attn_func(q, strided, v)


def test_shape_mismatches():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"v: shape"):
        fusedattn.flash_attn_func(q, k, v[:, :4])
    with pytest.raises(ValueError, match=r"q: number of heads"):
        fusedattn.flash_attn_func(randn(1, 8, 3, 64, dtype=torch.float32, device="cpu"), k, v)


def test_bad_window_and_cu_seqlens():
    q, k, v = qkv()
    # flash_attn reads any negative side as unbounded.
    assert torch.equal(fusedattn.flash_attn_func(q, k, v, window_size=(-5, -2)),
                       fusedattn.flash_attn_func(q, k, v, window_size=(-1, -1)))
    assert torch.equal(fusedattn.flash_attn_func(q, k, v, window_size=(3, -7)),
                       fusedattn.flash_attn_func(q, k, v, window_size=(3, -1)))
    with pytest.raises(ValueError, match="window_size"):
        fusedattn.flash_attn_func(q, k, v, window_size=(1, 2, 3))
    packed = randn(8, 2, 64, dtype=torch.float32, device="cpu")
    good = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        fusedattn.flash_attn_varlen_func(packed, packed, packed, torch.tensor([0, 8], dtype=torch.int64), good, 8, 8)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        fusedattn.flash_attn_varlen_func(packed, packed, packed, good, torch.tensor([0, 9, 4], dtype=torch.int32), 8, 8)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        fusedattn.flash_attn_varlen_func(packed, packed, packed, good, good, 4, 8)


def test_unsupported_head_dim():
    q, k, v = qkv(shape=(1, 4, 1, 264))
    with pytest.raises(NotImplementedError, match="head_dim"):
        fusedattn.flash_attn_func(q, k, v)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_mixed_devices():
    q, k, v = qkv(torch.float16)
    with pytest.raises(ValueError, match=r"(q|k|v): .*device"):
        fusedattn.flash_attn_func(q.cuda(), k, v.cuda())


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_float32_on_cuda_is_unsupported():
    q, k, v = qkv(torch.float32, device="cuda")
    with pytest.raises(NotImplementedError, match="fp32"):
        fusedattn.flash_attn_func(q, k, v)



def test_check_device_errors_has_nothing_to_check_on_the_cpu():
    """The device check of offsets is the CUDA backend's: a CPU device (and, without a GPU, the
    default) returns at once; varlen calls on the CPU check their offsets when called."""
    assert fusedattn.check_device_errors("cpu") is None
    if not HAS_CUDA:
        assert fusedattn.check_device_errors() is None
    q, k, v = (randn(5, 2, 64, dtype=torch.float32, device="cpu") for _ in range(3))
    bad = torch.tensor([0, 3, 2, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens_q: must be non-decreasing; entry 2 \(2\) is below entry 1 \(3\)"):
        fusedattn.flash_attn_varlen_func(q, k, v, bad, torch.tensor([0, 1, 2, 5], dtype=torch.int32), 3, 3,
                                         check_on_device=True)
