"""Context parallelism: attention over a sequence sharded across the ranks of a torch.distributed
process group (ring attention).

Rank r of a group of W holds the r-th of W equal, contiguous chunks of the sequence: its queries,
keys and values, (batch, seqlen / W, heads, headdim) each. The K/V chunks travel round the ring
(rank r sends to r + 1 and receives from r - 1) while every rank attends its queries to the chunk
it holds with fusedattn's kernels, and merges the partial outputs by their log-sum-exp. The next
chunk's transfer runs under the current chunk's kernels. Under a causal mask a rank attends to
the chunks of the ranks before it in full, to its own under the causal mask, and skips the later
ones, so the last rank does W chunks' work and the first one; with `zigzag` each rank holds an
early and a late part of the sequence and every rank does the same work (_Step).

The backward runs the ring again. Each rank's dq comes from its own queries; each K/V chunk
travels with fp32 accumulators of its dk and dv, which every rank adds its share to (fusedattn's
backward with the final out and log-sum-exp gives exactly that share), and which come home after
the last step; they travel under the next step's kernels, as the K/V do. Communication is
torch.distributed's point-to-point (batch_isend_irecv), so any backend that has it serves: NCCL on
GPUs, gloo on the CPU.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ._ops import _last_dim_contiguous, ops

# flash_attn's "no limit" for either side of a window.
_UNBOUNDED = -1


class _Transfer:
    """A ring pass in flight: its requests, and the tensors it sends, kept alive until it is done."""

    def __init__(self, requests: list, sent: list[torch.Tensor]):
        self.requests, self.sent = requests, sent

    def wait(self) -> None:
        for request in self.requests:
            request.wait()


def _ring_pass(tensors: list[torch.Tensor], group) -> tuple[list[torch.Tensor], _Transfer]:
    """Starts sending `tensors` to the next rank and receiving the previous rank's into new
    buffers; returns the buffers and the transfer to wait for."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    following = dist.get_global_rank(group, (rank + 1) % world) if group is not None else (rank + 1) % world
    preceding = dist.get_global_rank(group, (rank - 1) % world) if group is not None else (rank - 1) % world
    sent = [t.contiguous() for t in tensors]
    received = [torch.empty_like(t) for t in sent]
    ops_ = [dist.P2POp(dist.isend, t, following, group) for t in sent]
    ops_ += [dist.P2POp(dist.irecv, r, preceding, group) for r in received]
    return received, _Transfer(dist.batch_isend_irecv(ops_), sent)


class _Step:
    """What rank `rank`'s queries do with the K/V that rank `source` holds: the query rows `q`
    and key rows `kv` of the local chunks that meet (slices of the sequence dimension), and
    whether under the causal mask (their own positions) or in full; `skip` where none meet.

    Contiguous chunks: a causal mask sees earlier ranks' chunks in full, its own causally, later
    ones not at all. Zigzag chunks (rank r holds parts r and 2W - 1 - r of 2W): its own chunk is
    causal as one sequence (the parts are in order); an earlier rank's first part is seen by both
    of its parts, its second part by neither; a later rank's both parts by its second part only.
    So every step but its own costs a rank half a chunk pair, and the ranks stay balanced."""

    def __init__(self, rank: int, source: int, causal: bool, zigzag: bool, length: int):
        whole, half = slice(0, length), slice(length // 2, length)
        self.q, self.kv, self.causal, self.skip = whole, whole, False, False
        if not causal:
            return
        if source == rank:
            self.causal = True
        elif not zigzag:
            self.skip = source > rank
        elif source < rank:
            self.kv = slice(0, length // 2)
        else:
            self.q = half


def _rows(t: torch.Tensor, rows: slice) -> torch.Tensor:
    """Rows of the sequence dimension (1) of a (batch, seqlen, heads, dim) chunk."""
    return t if rows == slice(0, t.shape[1]) else t[:, rows].contiguous()


# The merge computes in fp32 and rounds once into its output's dtype. A rank of a ring of two
# merges at most once, so the running result stays in q's dtype there: the same bits a float32
# running result would give after its final conversion, without that pass and the first step's
# widening one. Longer rings keep the running result in float32, rounded once at the end.
_LARGEST_RING_MERGING_IN_Q_DTYPE = 2


def _ring_forward(q, k, v, softmax_scale, causal: bool, zigzag: bool, group):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    out = lse = None
    kv = [k, v]
    for step in range(world):
        it = _Step(rank, (rank - step) % world, causal, zigzag, q.shape[1])
        pending = _ring_pass(kv, group) if step < world - 1 else None
        if not it.skip:
            part_out, part_lse = ops.fwd(_rows(q, it.q), _rows(kv[0], it.kv), _rows(kv[1], it.kv), softmax_scale,
                                         it.causal, _UNBOUNDED, 0 if it.causal else _UNBOUNDED, False)
            if out is None:  # the first step, the rank's own chunk: every row, nothing to merge with
                out, lse = (part_out if world <= _LARGEST_RING_MERGING_IN_Q_DTYPE else part_out.float()), part_lse
            else:  # in place, rows it.q of the running result (fusedattn.merge)
                ops.merge_attention(out[:, it.q], lse[..., it.q], part_out, part_lse)
        if pending is not None:
            kv, transfer = pending
            transfer.wait()
    return out.to(q.dtype), lse


# The chunk accumulators' transfer runs under the next step's backward kernels (their parts are
# added once the accumulators have arrived). False sends them and waits at once, as the first
# version did, kept for measuring the overlap (tools/bench_ring.py).
_OVERLAP_ACCUMULATORS = True


def _ring_backward(dout, q, k, v, out, lse, softmax_scale, causal: bool, zigzag: bool, group):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    dout = _last_dim_contiguous(dout)
    kv = [k, v]
    # dq, and the fp32 accumulators of the chunk held at each step: the first step (the rank's own
    # chunk, every row, never skipped) starts them from its parts; the chunks' accumulators of the
    # later steps arrive from the previous rank while the step's kernels run. The parts are added
    # in q's dtype, which torch widens in the same pass (no float32 copy of them).
    dq = grads = None
    arriving = None
    for step in range(world):
        it = _Step(rank, (rank - step) % world, causal, zigzag, q.shape[1])
        pending = _ring_pass(kv, group) if step < world - 1 else None
        if not it.skip:
            dq_part, dk_part, dv_part = ops.bwd(_rows(dout, it.q), _rows(q, it.q), _rows(kv[0], it.kv),
                                                _rows(kv[1], it.kv), _rows(out, it.q),
                                                lse[..., it.q].contiguous(), softmax_scale, it.causal, _UNBOUNDED,
                                                0 if it.causal else _UNBOUNDED, False)
            if dq is None:
                dq = dq_part.float()
            else:
                dq[:, it.q] += dq_part
        if arriving is not None:
            grads, transfer = arriving
            transfer.wait()
        if not it.skip:
            if grads is None:
                grads = [dk_part.float(), dv_part.float()]
            else:
                grads[0][:, it.kv] += dk_part
                grads[1][:, it.kv] += dv_part
        # The chunk's accumulators go where the chunk goes next; after the last step, home.
        if world > 1:
            arriving = _ring_pass(grads, group)
            if not _OVERLAP_ACCUMULATORS:
                arriving[1].wait()
        if pending is not None:
            kv, transfer = pending
            transfer.wait()
    if arriving is not None:
        grads, transfer = arriving
        transfer.wait()
    return dq.to(q.dtype), grads[0].to(k.dtype), grads[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal, zigzag, group):
        out, lse = _ring_forward(q, k, v, softmax_scale, causal, zigzag, group)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (softmax_scale, causal, zigzag, group)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(dout, q, k, v, out, lse, *ctx.args)
        return dq, dk, dv, None, None, None, None


def _check_chunks(q, k, v, zigzag: bool, group, across_ranks: bool = True) -> None:
    """The local chunks: rank 4, self-attention (as many keys as queries), of an even length with
    zigzag, and (across_ranks) of one shape on every rank: the ring's buffers are sized by the
    local chunk, and a transfer between chunks of different shapes could hang. That part is one
    small all_gather, read on the host."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"fusedattn: {name}: expected the local chunk (batch, seqlen / world_size, heads, "
                             f"headdim), got shape {tuple(t.shape)}")
    if zigzag and q.shape[1] % 2 != 0:
        raise ValueError(f"fusedattn: zigzag: a rank's chunk is two equal parts of the sequence; its length "
                         f"{q.shape[1]} is odd")
    if k.shape[1] != q.shape[1] or v.shape[:3] != k.shape[:3]:
        raise ValueError(f"fusedattn: k, v: each rank's chunk holds the keys of its queries' positions: shapes "
                         f"{tuple(k.shape)} and {tuple(v.shape)} must have q's {q.shape[1]} positions")
    if not across_ranks:
        return
    # One all_gather of eight integers on the chunks' device and one read of it (all_gather_object,
    # which pickles, took ~0.9 ms a call on two H200s, as much as a 16k-token ring's forward step).
    mine = torch.tensor([*q.shape, *k.shape], dtype=torch.int64).to(q.device)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    shapes = [(tuple(t[:4]), tuple(t[4:])) for t in torch.stack(gathered).tolist()]
    if any(shape != shapes[0] for shape in shapes):
        raise ValueError(f"fusedattn: q: every rank's chunk must have the same shape (equal chunks of the "
                         f"sequence); the ranks hold {shapes}")


def ring_flash_attn_func(q, k, v, softmax_scale=None, causal=False, group=None, return_softmax_lse=False,
                         zigzag=False, check_chunks=True):
    """softmax(q k^T * softmax_scale) v over a sequence sharded across `group` (default: the world),
    flash_attn_func's layout: q, k, v are this rank's chunk (batch, seqlen / world_size, nheads or
    nheads_k, headdim), chunk r the r-th of the sequence; with zigzag, of the sequence cut into
    2 * world_size equal parts, rank r holds parts r and 2 * world_size - 1 - r, in that order
    (under a causal mask every rank then does the same work; see _Step). causal aligns the whole
    sequence's queries and keys (self-attention). GQA/MQA as in flash_attn_func. Returns this
    rank's out, or (out, softmax_lse [batch, nheads, seqlen / world_size] float32) with
    return_softmax_lse, in the order of its chunk. Differentiable in q, k and v. Not implemented,
    and not accepted: windows, dropout, softcap, ALiBi, variable-length batches. Every call checks
    with one all_gather that the chunks agree, read on the host: a wait for the device that cost
    0.3-0.4 ms of a 16k-token forward on two H200s (docs/perf.md). check_chunks=False leaves that
    part out where the caller guarantees equal chunks on every rank (the local checks stay); chunks
    that then differ are undefined behaviour: the ring's transfers may hang.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("fusedattn: group: ring_flash_attn_func needs an initialised torch.distributed "
                           "process group (torch.distributed.init_process_group)")
    _check_chunks(q, k, v, zigzag, group, across_ranks=bool(check_chunks))
    out, lse = _RingAttention.apply(q, k, v, softmax_scale, bool(causal), bool(zigzag), group)
    return (out, lse) if return_softmax_lse else out
