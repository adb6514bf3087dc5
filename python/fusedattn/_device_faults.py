"""Faults that flash_attn_with_kvcache finds on the device, where it reads nothing on the host: a
call with a CUDA cache_seqlens captured into a CUDA graph, which cannot wait for the stream.

The host path checks the lengths, cache_batch_idx and the rotary tables' reach before it writes;
the device path makes the same checks with tensor operations. A sequence that fails one is not
written and its outputs are NaN; the call's first fault is kept per device (unless one is kept
already) until fusedattn.check_device_errors() raises it in the host check's words. The words live
here, for both paths. Faults in the offsets and the block table are the library's own
(check_on_device).
"""
from __future__ import annotations

import torch

# Fault kinds, in the order the host path checks them: a call keeps the first kind it finds, at
# its first sequence.
CAPACITY = 1   # a sequence's length and new tokens pass the cache's positions
CACHE_ROW = 2  # cache_batch_idx names no row of the caches (for a sequence with keys)
ROTARY = 3     # the rotary tables end before a position the new tokens reach
_FIELDS = 3    # the call's index + 1 (0: none kept), the failure's rank, its value

_records: dict[torch.device, torch.Tensor] = {}


def capacity_message(sequence: int, length: int, new: int, capacity: int) -> str:
    return (f"fusedattn: cache_seqlens: sequence {sequence} holds {length} tokens; with the {new} new ones it must "
            f"fit the cache's {capacity} positions")


def page_outside_message(name: str, sequence: int, page: int, block: int, page_size: int, num_blocks: int) -> str:
    return (f"fusedattn: {name}: sequence {sequence}'s page {page} (positions {page * page_size}.."
            f"{(page + 1) * page_size - 1}) names block {block}, outside the caches' {num_blocks}")


def rotary_message(positions: int, last: int) -> str:
    return (f"fusedattn: rotary_cos: its {positions} positions end before position {last}, which the new tokens "
            "reach")


def capturing(device) -> bool:
    """Whether the current stream of a CUDA device is being captured into a CUDA graph."""
    return torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()


def prepare(device: torch.device) -> None:
    """Makes the device's record, outside any CUDA graph capture: one made in a capture would hold
    its zeros only once the graph replays, and be zeroed again at each replay. flash_attn_with_kvcache
    calls this on every eager call that a capture would check on the device, so the warm-up that
    torch's capture recipe runs first makes it."""
    if device not in _records:
        _records[device] = torch.zeros(_FIELDS, dtype=torch.int64, device=device)


# What a kept fault means, by call: the checks' (kind, bound, detail) in the host path's order and
# the batch, so that the device keeps only the call's index, the failure's rank (check * batch +
# sequence) and its value. A call's index is fixed where it is captured, so a replay keeps the
# meaning it had then.
_calls: list[tuple[int, tuple[tuple[int, int, int], ...]]] = []
_call_index: dict[tuple[int, tuple[tuple[int, int, int], ...]], int] = {}


class Faults:
    """The checks of one call: each a kind, the sequences that fail it (bool, batch) and the value
    its message names for each; bound and detail complete the message."""

    def __init__(self) -> None:
        self._checks: list[tuple[int, torch.Tensor, torch.Tensor, int, int]] = []

    def add(self, kind: int, failed: torch.Tensor, value: torch.Tensor, bound: int, detail: int = 0) -> None:
        self._checks.append((kind, failed, value.long(), bound, detail))

    def record(self) -> None:
        """Keeps the first check's first failing sequence on its device, unless a fault is kept
        there already: a few tensor operations, nothing read on the host."""
        if not self._checks:
            return
        checks = sorted(self._checks, key=lambda check: check[0])  # the host path's order
        failed = torch.stack([check[1] for check in checks])  # (checks, batch)
        device = failed.device
        kept = _records.get(device)
        if kept is None:
            if capturing(device):
                raise RuntimeError("fusedattn: flash_attn_with_kvcache: this call checks its lengths on the device "
                                   f"when captured, into a record that {device} does not have yet; run the call "
                                   "once before the capture (torch's capture recipe warms up so)")
            prepare(device)
            kept = _records[device]
        meaning = (failed.shape[1], tuple((kind, bound, detail) for kind, _, _, bound, detail in checks))
        call = _call_index.get(meaning)
        if call is None:
            call = _call_index[meaning] = len(_calls)
            _calls.append(meaning)
        rank = failed.flatten().int().argmax().view(1)
        value = torch.stack([check[2] for check in checks]).flatten().index_select(0, rank)
        found = torch.cat((torch.full_like(rank, call + 1), rank, value))
        kept.copy_(torch.where((kept[0] == 0) & failed.any(), found, kept))


def raise_recorded(device: torch.device) -> None:
    """Raises the fault kept on `device` (a ValueError in the host check's words) and forgets it.
    Reads it on the host: waits for the device."""
    kept = _records.get(device)
    if kept is None:
        return
    call, rank, value = kept.tolist()
    if call == 0:
        return
    kept.zero_()
    batch, checks = _calls[call - 1]
    check, sequence = divmod(rank, batch)
    kind, bound, detail = checks[check]
    if kind == CAPACITY:
        raise ValueError(capacity_message(sequence, value, detail, bound))
    if kind == CACHE_ROW:
        raise ValueError(page_outside_message("cache_batch_idx", sequence, 0, value, detail, bound))
    raise ValueError(rotary_message(bound, value))
