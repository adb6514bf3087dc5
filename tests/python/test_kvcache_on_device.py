"""flash_attn_with_kvcache with the lengths left on the device (a CUDA cache_seqlens): new tokens
appended and attended, unpaged, over block tables and through cache_batch_idx, with no read on the
host. That is what a call captured in a CUDA graph runs; an eager CUDA call that appends reads the
lengths on the host first, which costs less. The host path's checks are made on the device: a
failing sequence is not written and reads NaN, and fusedattn.check_device_errors() raises the host
path's words. A decode step that appends, captured in a CUDA graph. On the CPU the same code runs
with the CPU lengths treated as device lengths."""
from __future__ import annotations

import pytest
import torch

import fusedattn
from conftest import DEVICES, DTYPES, HAS_CUDA, randn
from fusedattn import _device_faults, flash_attn_interface
from test_device_checks import capture
from test_kvcache import CUDA_PAGE_ROWS, caches, check_against_reference, paged, rope_reference, rotary_tables, unpaged

KINDS = ["unpaged", "block_table", "cache_batch_idx"]


def lengths_on_device(monkeypatch, on_device: bool) -> None:
    """Makes flash_attn_with_kvcache take the device path for any tensor of lengths (on_device),
    or the host path for every one."""
    monkeypatch.setattr(flash_attn_interface, "_lengths_on_device",
                        lambda t, checked: on_device and isinstance(t, torch.Tensor))


class Case:
    """A decode step that appends `new` tokens: caches of `capacity` positions per sequence, stored
    as `kind` says (KINDS), with fresh values everywhere; `rotary` None, or the layout of rotary
    embedding's pairs, "interleaved" (0, 1), (2, 3), ... or "neox" (i, i + half)."""

    def __init__(self, device, kind, lengths, new=2, capacity=CUDA_PAGE_ROWS * 2, rotary=None, causal=True):
        self.device, self.kind, self.new, self.capacity, self.causal = device, kind, new, capacity, causal
        self.dtype = DTYPES[device][-1]
        batch, hq, hkv, d = len(lengths), 4, 2, 64
        self.lengths = torch.tensor(lengths, dtype=torch.int32, device=device)
        logical = caches(batch, capacity, hkv, d, self.dtype, device)
        self.kwargs = {}
        if kind == "block_table":
            k_pool, v_pool, table = paged(*logical, CUDA_PAGE_ROWS)
            self.k_cache, self.v_cache, self.kwargs["block_table"] = k_pool, v_pool, table
        elif kind == "cache_batch_idx":  # more cache rows than sequences, read in another order
            rows = caches(batch + 2, capacity, hkv, d, self.dtype, device)
            self.k_cache, self.v_cache = rows
            self.kwargs["cache_batch_idx"] = torch.randperm(batch + 2, device=device)[:batch].to(torch.int32)
        else:
            self.k_cache, self.v_cache = logical
        self.q = randn(batch, new, hq, d, dtype=self.dtype, device=device)
        self.k, self.v = (randn(batch, new, hkv, d, dtype=self.dtype, device=device) for _ in range(2))
        if rotary is not None:
            self.kwargs["rotary_cos"], self.kwargs["rotary_sin"] = rotary_tables(capacity, 32, self.dtype, device)
            self.kwargs["rotary_interleaved"] = {"interleaved": True, "neox": False}[rotary]

    def fresh_caches(self):
        return self.k_cache.clone(), self.v_cache.clone()

    def run(self, k_cache, v_cache, lengths=None):
        return fusedattn.flash_attn_with_kvcache(
            self.q, k_cache, v_cache, self.k, self.v,
            cache_seqlens=self.lengths if lengths is None else lengths, causal=self.causal,
            return_softmax_lse=True, **self.kwargs)

    def rotated(self, x, sequences=None):
        """x's rows of the sequences (default: every sequence's) rotated in float64 as a causal call
        rotates its new tokens: at their positions after each sequence's cached keys."""
        sequences = list(range(self.q.shape[0])) if sequences is None else sequences
        positions = self.lengths[sequences].long()[:, None] + torch.arange(self.new, device=self.device)[None, :]
        return rope_reference(x[sequences], self.kwargs["rotary_cos"], self.kwargs["rotary_sin"], positions,
                              self.kwargs["rotary_interleaved"])

    def rotated_q(self, sequences=None):
        """The sequences' query rows as the call attends them: rotated, rounded to the dtype."""
        return self.rotated(self.q, sequences).to(self.dtype)

    def expect_rotated_keys(self, k_cache, sequences=None):
        """The new keys in the caches are the float64 rotation of k, to a few roundings."""
        sequences = list(range(self.q.shape[0])) if sequences is None else sequences
        cache, expected, eps = self.logical(k_cache, sequences), self.rotated(self.k, sequences), torch.finfo(self.dtype).eps
        for row, b in enumerate(sequences):
            n = int(self.lengths[b])
            torch.testing.assert_close(cache[row, n:n + self.new].double(), expected[row], rtol=4 * eps, atol=4 * eps)

    def logical(self, cache, sequences=None):
        """The sequences' cache positions (len(sequences), capacity, heads, dim) in the stored
        caches (default: every sequence's)."""
        sequences = list(range(self.q.shape[0])) if sequences is None else sequences
        if self.kind == "block_table":
            return unpaged(cache, self.kwargs["block_table"][sequences], self.capacity)
        if self.kind == "cache_batch_idx":
            return cache[self.kwargs["cache_batch_idx"][sequences].long()]
        return cache[sequences]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rotary", [None, "interleaved", "neox"], ids=["plain", "interleaved", "neox"])
def test_appends_as_the_host_path_does(device, kind, rotary, monkeypatch):
    """The caches written bit for bit as by the host path (which reads the lengths first), and
    attention over each sequence's keys as the reference says; ragged lengths, one empty sequence
    and one that fills its cache."""
    case = Case(device, kind, [5, 0, CUDA_PAGE_ROWS + 3, 2 * CUDA_PAGE_ROWS - 2], rotary=rotary)
    lengths_on_device(monkeypatch, False)
    host_k, host_v = case.fresh_caches()
    case.run(host_k, host_v)
    lengths_on_device(monkeypatch, True)
    k_cache, v_cache = case.fresh_caches()
    out, lse = case.run(k_cache, v_cache)
    assert torch.equal(k_cache, host_k) and torch.equal(v_cache, host_v), "caches written otherwise"
    if rotary is not None:
        case.expect_rotated_keys(k_cache)
    q = case.rotated_q() if rotary else case.q  # the query rows as the call rotated them
    visible = [n + case.new for n in case.lengths.tolist()]
    check_against_reference(q, case.logical(k_cache), case.logical(v_cache), visible, out, lse, True, (-1, -1))
    fusedattn.check_device_errors(device)


FAULTS = {
    # name: (lengths, fault on the table side, the words of the host path's error)
    "past_capacity": ([3, 2 * CUDA_PAGE_ROWS - 1, 7], None, "cache_seqlens: sequence 1 holds 255 tokens"),
    "negative": ([3, 4, -1], None, "cache_seqlens: sequence 2 holds -1 tokens"),
    "cache_row": ([3, 4, 5], "cache_batch_idx", "cache_batch_idx: sequence 1's page 0"),
    "rotary": ([3, 4, 2 * CUDA_PAGE_ROWS - 2], "rotary", "rotary_cos: its 200 positions end before position 255"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fault", FAULTS)
def test_a_failing_sequence_is_not_written_reads_nan_and_is_raised(device, fault, monkeypatch):
    """The host path raises before it writes; the device path writes and attends the other
    sequences, leaves the failing one's cache as it was and its outputs NaN, and keeps the fault
    for check_device_errors, which raises it once in the host path's words."""
    lengths, side, words = FAULTS[fault]
    kind = "cache_batch_idx" if side == "cache_batch_idx" else "unpaged"
    case = Case(device, kind, lengths, rotary="neox" if side == "rotary" else None)
    if side == "cache_batch_idx":
        case.kwargs["cache_batch_idx"][1] = case.k_cache.shape[0]
    if side == "rotary":  # tables that end before the last sequence's new tokens
        case.kwargs["rotary_cos"], case.kwargs["rotary_sin"] = rotary_tables(200, 32, case.dtype, device)
    lengths_on_device(monkeypatch, False)
    with pytest.raises(ValueError) as host:
        case.run(*case.fresh_caches())
    assert words in str(host.value)
    lengths_on_device(monkeypatch, True)
    k_cache, v_cache = case.fresh_caches()
    out, lse = case.run(k_cache, v_cache)
    failed = {"past_capacity": 1, "negative": 2, "cache_row": 1, "rotary": 2}[fault]
    assert out[failed].isnan().all() and lse[failed].isnan().all()
    others = [b for b in range(len(lengths)) if b != failed]
    if side == "cache_batch_idx":  # sequence 1 names no row: every row but the others' is as it was
        written_rows = case.kwargs["cache_batch_idx"][others].long()
        untouched = [r for r in range(case.k_cache.shape[0]) if r not in written_rows.tolist()]
        assert torch.equal(k_cache[untouched], case.k_cache[untouched])
    else:
        assert torch.equal(k_cache[failed], case.k_cache[failed]) and torch.equal(v_cache[failed], case.v_cache[failed])
    if side == "rotary":
        case.expect_rotated_keys(k_cache, others)
    q = case.rotated_q(others) if side == "rotary" else case.q[others]
    check_against_reference(q, case.logical(k_cache, others), case.logical(v_cache, others),
                            [lengths[b] + case.new for b in others], out[others], lse[others], True, (-1, -1))
    with pytest.raises(ValueError) as found:
        fusedattn.check_device_errors(device)
    assert str(found.value) == str(host.value)
    fusedattn.check_device_errors(device)  # raised once


def test_the_first_check_of_the_host_path_is_raised(monkeypatch):
    """Several faults in one call (a cache row past the caches, then a length past them) and in a
    later call: check_device_errors raises the host path's first, the one found first."""
    lengths_on_device(monkeypatch, True)
    case = Case("cpu", "cache_batch_idx", [3, 4, 2 * CUDA_PAGE_ROWS])
    case.kwargs["cache_batch_idx"][0] = -1
    case.run(*case.fresh_caches())
    case.run(*case.fresh_caches(), lengths=torch.tensor([-5, 0, 0], dtype=torch.int32))
    with pytest.raises(ValueError, match="cache_seqlens: sequence 2 holds 256 tokens"):
        fusedattn.check_device_errors("cpu")
    fusedattn.check_device_errors("cpu")


def test_more_new_tokens_than_positions_are_refused_on_the_host(monkeypatch):
    lengths_on_device(monkeypatch, True)
    case = Case("cpu", "unpaged", [0, 0], new=5, capacity=4)
    with pytest.raises(ValueError, match="k: its 5 new tokens exceed the cache's 4 positions"):
        case.run(*case.fresh_caches())


needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="lengths on a GPU")


@needs_cuda
@pytest.mark.parametrize("kind", KINDS)
def test_the_device_path_reads_nothing_on_the_host(kind, monkeypatch):
    """torch's sync debug mode turns any host read into an error: the device path (what a
    captured call runs; forced here on an eager one) reads nothing."""
    lengths_on_device(monkeypatch, True)
    case = Case("cuda", kind, [5, 0, 9], rotary="interleaved")
    case.run(*case.fresh_caches())  # warm-up: the offsets the call makes once
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            case.lengths.tolist()  # the mode catches the host read the call must not make
        k_cache, v_cache = case.fresh_caches()
        out, lse = case.run(k_cache, v_cache)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    check_against_reference(*_rotated_reference_inputs(case, k_cache, v_cache), out, lse, True, (-1, -1))


@needs_cuda
def test_an_eager_call_that_appends_checks_on_the_host():
    """Eager, the lengths are read and checked first (cheaper than the device's checks): a bad
    one raises at once and nothing is written."""
    case = Case("cuda", "unpaged", [3, 2 * CUDA_PAGE_ROWS - 1])
    k_cache, v_cache = case.fresh_caches()
    with pytest.raises(ValueError, match="cache_seqlens: sequence 1 holds 255 tokens"):
        case.run(k_cache, v_cache)
    assert torch.equal(k_cache, case.k_cache) and torch.equal(v_cache, case.v_cache)


def _rotated_reference_inputs(case, k_cache, v_cache):
    return case.rotated_q(), case.logical(k_cache), case.logical(v_cache), [n + case.new for n in case.lengths.tolist()]


@needs_cuda
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("steps", [([5, 0, 9], [7, 1, 200], [0, 255, 128]), ([5], [7], [255])],
                         ids=["ragged", "one_sequence"])
def test_a_decode_step_that_appends_is_captured_and_replayed(kind, steps, monkeypatch):
    """One token appended per sequence and attended, captured once; each replay appends at the
    lengths the tensor holds then, as the eager call on the same caches does, and a replay with a
    length past the cache raises its fault afterwards. One sequence: the eager warm-up runs a
    plain call (uniform lengths) and makes no offsets, so the captured call makes its own, which
    an eager call on the device path after it must not take (they hold values only in replays)."""
    first, *later = steps
    case = Case("cuda", kind, first, new=1, causal=False)
    k_cache, v_cache = case.fresh_caches()
    graph, (out, lse) = capture(lambda: case.run(k_cache, v_cache))
    with monkeypatch.context() as forced:
        lengths_on_device(forced, True)
        eager_k, eager_v = k_cache.clone(), v_cache.clone()
        eager_out, eager_lse = case.run(eager_k, eager_v)
        check_against_reference(case.q, case.logical(eager_k), case.logical(eager_v), [n + 1 for n in first],
                                eager_out, eager_lse, False, (-1, -1))
    for lengths in later:
        case.lengths.copy_(torch.tensor(lengths, dtype=torch.int32))
        case.q.copy_(randn(*case.q.shape, dtype=case.dtype, device="cuda"))
        case.k.copy_(randn(*case.k.shape, dtype=case.dtype, device="cuda"))
        eager_k, eager_v = k_cache.clone(), v_cache.clone()
        eager = case.run(eager_k, eager_v)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(k_cache, eager_k) and torch.equal(v_cache, eager_v), "the replay wrote otherwise"
        check_against_reference(case.q, case.logical(k_cache), case.logical(v_cache), [n + 1 for n in lengths],
                                out, lse, False, (-1, -1))
        if len(lengths) > 1:  # the same variable-length call eager and replayed (one sequence: a plain one eager)
            assert torch.equal(out, eager[0]) and torch.equal(lse, eager[1])
    fusedattn.check_device_errors()
    failing = [3] * len(first)
    failing[-1] = 2 * CUDA_PAGE_ROWS
    case.lengths.copy_(torch.tensor(failing, dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    assert out[-1].isnan().all() and not out[:-1].isnan().any()
    with pytest.raises(ValueError, match=f"cache_seqlens: sequence {len(first) - 1} holds 256 tokens"):
        fusedattn.check_device_errors()


@needs_cuda
def test_a_capture_without_a_warm_up_is_refused_by_name(monkeypatch):
    """The device's fault record is made by an eager call (the warm-up of torch's recipe); a
    capture that finds none raises saying so, rather than writing into a record made in the
    capture (whose zeros exist only in replays)."""
    monkeypatch.setattr(_device_faults, "_records", {})
    case = Case("cuda", "unpaged", [5, 0, 9], new=1)
    k_cache, v_cache = case.fresh_caches()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="run the call once before the capture"):
        with torch.cuda.graph(graph):
            case.run(k_cache, v_cache)


@pytest.mark.parametrize("what", ["cache_seqlens", "cache_leftpad", "block_table"])
def test_a_captured_call_that_would_read_on_the_host_is_refused_by_name(what, monkeypatch):
    """Where a call can only check on the host (pages the kernels do not read in place, left
    padding, lengths given as an int over a table), a capture raises naming the argument read,
    instead of torch's error from the copy. (The capture is pretended: the CPU runs the rule.)"""
    monkeypatch.setattr(flash_attn_interface, "_capturing", lambda device: True)
    case = Case("cpu", "block_table" if what != "cache_leftpad" else "unpaged", [3, 4])
    if what == "cache_seqlens":  # pages read through a gathered copy
        monkeypatch.setattr(flash_attn_interface, "_kernels_read_pages", lambda device, page: False)
    if what == "cache_leftpad":
        case.kwargs["cache_leftpad"] = torch.tensor([1, 0], dtype=torch.int32)
    lengths = None if what == "cache_seqlens" else 5  # an int: the table or the padding is what is read
    k_cache, v_cache = case.fresh_caches()
    with pytest.raises(RuntimeError, match=f"{what}: flash_attn_with_kvcache reads it on the host here"):
        case.run(k_cache, v_cache, lengths=lengths)
    assert torch.equal(k_cache, case.k_cache), "written before the refusal"
