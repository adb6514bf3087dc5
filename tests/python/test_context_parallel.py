"""ring_flash_attn_func (context parallelism): W processes on the CPU (torch.distributed's gloo
backend) each hold one chunk of a sequence (contiguous, or zigzag: an early and a late part); their outputs and gradients, gathered, must give the
whole sequence's answer: the float64 reference, with float32's tolerance or the 2x rule (its plain
same-dtype implementation) in half precision. The same inputs on every rank come from one seed
per case, the outputs are poisoned (torch.empty is NaN-filled in the workers too), and a rank
whose chunk differs in shape gets a clear error rather than a hang."""
from __future__ import annotations

import io
import os
import queue
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import fusedattn
from conftest import assert_2x_rule, attention_math, default_scale

# (world size, batch, heads, kv heads, chunk length, head dim)
CASES = [(2, 2, 4, 2, 48, 32), (3, 1, 4, 1, 37, 64)]
# How long a test waits for its rings' reports. A case takes ~12 s on two H200s (process start,
# NCCL set-up) and less on the CPU; a rank that hangs (a transfer never matched) fails the test
# after this, its processes killed, rather than holding the suite and the GPUs (session 60 saw a
# ring test under NCCL run past 200 s once, beside another process's GPU tests; not reproduced).
REPORT_TIMEOUT_S = 180


def positions(rank, world, chunk, zigzag):
    """The sequence positions of rank `rank`'s chunk rows: contiguous, or (zigzag) parts rank and
    2 * world - 1 - rank of 2 * world."""
    if not zigzag:
        return torch.arange(rank * chunk, (rank + 1) * chunk)
    half = chunk // 2
    late = 2 * world - 1 - rank
    return torch.cat([torch.arange(rank * half, (rank + 1) * half), torch.arange(late * half, (late + 1) * half)])


def _worker(rank, world, init_file, case, dtype, causal, zigzag, seed, groups, results, backend="gloo",
            check_chunks=True):
    """One rank of `groups` rings of world / groups ranks each (torch.distributed subgroups when
    more than one): ring g attends over its own sequence (seed + g); its first rank reports the
    ring's outputs and gradients in sequence order, and the inputs. backend "nccl": rank r works
    on GPU r, its chunks' passes go through NCCL. The ring call's all_gathers are counted, and the
    count is reported beside the results."""
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = True
        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
        ring = world // groups
        subgroups = [dist.new_group(list(range(g * ring, (g + 1) * ring))) for g in range(groups)] if groups > 1 \
            else [None]
        g, local = rank // ring, rank % ring
        group = subgroups[g]
        _, batch, heads, heads_kv, chunk, dim = case
        gen = torch.Generator().manual_seed(seed + g)
        full = [torch.randn(batch, ring * chunk, h, dim, generator=gen).to(dtype)
                for h in (heads, heads_kv, heads_kv, heads)]
        mine = positions(local, ring, chunk, zigzag)
        q, k, v, dout = (t[:, mine].to(device) for t in full)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        all_gather, gathers = dist.all_gather, []

        def counted_all_gather(*args, **kwargs):
            gathers.append(1)
            return all_gather(*args, **kwargs)

        dist.all_gather = counted_all_gather
        out, lse = fusedattn.ring_flash_attn_func(q, k, v, causal=causal, group=group, return_softmax_lse=True,
                                                  zigzag=zigzag, check_chunks=check_chunks)
        out.backward(dout)
        dist.all_gather = all_gather
        # Every rank's rows, put back in sequence order.
        order = torch.cat([positions(r, ring, chunk, zigzag) for r in range(ring)])
        gathered = []
        for t in (out.detach(), lse, q.grad, k.grad, v.grad):
            parts = [torch.empty_like(t) for _ in range(ring)]
            dist.all_gather(parts, t.contiguous(), group=group)
            dim_ = 2 if t is lse else 1
            rows = torch.cat(parts, dim=dim_)
            in_order = torch.empty_like(rows)
            in_order.index_copy_(dim_, order.to(rows.device), rows)
            gathered.append(in_order)
        if local == 0:
            # As bytes, not tensors: a tensor put on the queue is shared through this process's
            # file descriptors, which are gone if it exits before the test has read them.
            buffer = io.BytesIO()
            torch.save([t.cpu() for t in gathered] + full, buffer)
            results.put(("ok", buffer.getvalue(), len(gathers)))
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001  (reported to the test, which fails with it)
        results.put(("error", traceback.format_exc(), 0))


def _run(world, tmp_path, case, dtype, causal, zigzag, seed, groups=1, backend="gloo", check_chunks=True,
         gathers=None):
    """Each ring's (out, lse, dq, dk, dv, q, k, v, dout), whole sequences, in no particular order;
    `gathers`, where given, gets each ring's count of all_gathers in its first rank's ring call."""
    context = mp.get_context("spawn")
    results = context.Queue()
    procs = [context.Process(target=_worker, args=(r, world, str(tmp_path / "store"), case, dtype, causal, zigzag,
                                                   seed, groups, results, backend, check_chunks))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        reports = [results.get(timeout=REPORT_TIMEOUT_S) for _ in range(groups)]
    except queue.Empty:
        exit_codes = [p.exitcode for p in procs]  # None: still running (hung), else it died
        for p in procs:
            p.kill()
            p.join()
        pytest.fail(f"ring of {world} ranks ({backend}): no report within {REPORT_TIMEOUT_S} s; the ranks' "
                    f"exit codes then {exit_codes} (None: still running), all killed")
    for p in procs:
        p.join(timeout=60)
    for status, payload, _ in reports:
        assert status == "ok", payload
    if gathers is not None:
        gathers.extend(count for _, _, count in reports)
    return [torch.load(io.BytesIO(payload)) for _, payload, _ in reports]


def check_against_reference(out, lse, dq, dk, dv, q, k, v, dout, causal, dtype):
    window = (-1, 0 if causal else -1)
    args = (q, k, v, dout, default_scale(q.shape[-1])) + window
    ref, plain = attention_math(*args), attention_math(*args, dtype=dtype)
    for name, got, want, same_dtype in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, dq, dk, dv), ref, plain):
        assert_2x_rule(name, got, want, same_dtype)


@pytest.mark.parametrize("case", CASES, ids=[f"world{c[0]}" for c in CASES])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("zigzag", [False, True], ids=["contiguous", "zigzag"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_ring_matches_the_whole_sequence(tmp_path, case, causal, zigzag, dtype):
    if zigzag:  # two equal parts per rank
        case = case[:4] + (case[4] // 2 * 2,) + case[5:]
    seed = int(torch.randint(0, 2**31, ()).item())
    (result,) = _run(case[0], tmp_path, case, dtype, causal, zigzag, seed)
    check_against_reference(*result, causal, dtype)


# On GPUs through NCCL, one rank per GPU: chunks long enough for several KV blocks per pass.
NCCL_CASES = [(2, 2, 8, 2, 384, 128), (2, 1, 4, 4, 320, 64)]
TWO_GPUS = torch.cuda.is_available() and dist.is_nccl_available() and torch.cuda.device_count() >= 2


@pytest.mark.skipif(not TWO_GPUS, reason="needs two CUDA GPUs and NCCL")
@pytest.mark.parametrize("case", NCCL_CASES, ids=[f"d{c[5]}" for c in NCCL_CASES])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("zigzag", [False, True], ids=["contiguous", "zigzag"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_ring_over_nccl_matches_the_whole_sequence(tmp_path, case, causal, zigzag, dtype):
    seed = int(torch.randint(0, 2**31, ()).item())
    (result,) = _run(case[0], tmp_path, case, dtype, causal, zigzag, seed, backend="nccl")
    check_against_reference(*result, causal, dtype)


def test_rings_of_a_subgroup_each(tmp_path):
    """Four processes as two rings of two (torch.distributed subgroups, `group=`), each over its
    own sequence: the ring passes go to the subgroup's neighbours, by their global ranks."""
    case = (4, 1, 4, 2, 24, 32)
    seed = int(torch.randint(0, 2**31, ()).item())
    results = _run(4, tmp_path, case, torch.float32, True, False, seed, groups=2)
    assert len(results) == 2
    for result in results:
        check_against_reference(*result, True, torch.float32)


@pytest.mark.parametrize("backend", ["gloo", pytest.param("nccl", marks=pytest.mark.skipif(
    not TWO_GPUS, reason="needs two CUDA GPUs and NCCL"))])
def test_the_chunk_check_is_one_all_gather_and_can_be_left_out(tmp_path, backend):
    """check_chunks=False: the same answer without the shapes' all_gather (the ring's own
    transfers are point-to-point, so the ring call then gathers nothing)."""
    case, dtype = (CASES[0], torch.float32) if backend == "gloo" else (NCCL_CASES[0], torch.float16)
    for check_chunks, expected in ((True, 1), (False, 0)):
        gathers, run_dir = [], tmp_path / f"check_{check_chunks}"
        run_dir.mkdir()
        (result,) = _run(2, run_dir, case, dtype, True, True, 23, backend=backend, check_chunks=check_chunks,
                         gathers=gathers)
        check_against_reference(*result, True, dtype)
        assert gathers == [expected], (check_chunks, gathers)


def _rejecting_worker(rank, world, init_file, length, kwargs, results):
    """Calls ring_flash_attn_func on a chunk of length(rank) positions; reports the ValueError."""
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        q = torch.randn(1, length(rank), 2, 32)
        try:
            fusedattn.ring_flash_attn_func(q, q, q, **kwargs)
            results.put((rank, "no error"))
        except ValueError as e:
            results.put((rank, str(e)))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        results.put((rank, traceback.format_exc()))


def _messages_of_two_ranks(tmp_path, length, **kwargs):
    context = mp.get_context("spawn")
    results = context.Queue()
    procs = [context.Process(target=_rejecting_worker, args=(r, 2, str(tmp_path / "store"), length, kwargs, results))
             for r in range(2)]
    for p in procs:
        p.start()
    messages = dict(results.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    return [messages[rank] for rank in range(2)]


def _one_longer(rank):  # rank 1's chunk is one position longer
    return 16 + rank


def _odd(rank):
    return 15


def test_chunks_of_different_shapes_are_rejected(tmp_path):
    for message in _messages_of_two_ranks(tmp_path, _one_longer):
        assert "every rank's chunk must have the same shape" in message, message


def test_zigzag_chunks_must_be_even(tmp_path):
    for message in _messages_of_two_ranks(tmp_path, _odd, causal=True, zigzag=True):
        assert "zigzag: a rank's chunk is two equal parts" in message, message


def test_needs_an_initialised_process_group():
    if dist.is_initialized():
        pytest.skip("this process already has a process group")
    q = torch.randn(1, 8, 2, 32)
    with pytest.raises(RuntimeError, match="group: ring_flash_attn_func needs an initialised"):
        fusedattn.ring_flash_attn_func(q, q, q)
