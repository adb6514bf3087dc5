#!/usr/bin/env python3
"""Board power of L2 reads: what the forward's K/V traffic (each CTA's loads of K and V from L2)
costs under the H200's power cap.

The d256 forward runs at the card's power cap (tools/bench_power.py), so only less energy per
FLOP buys speed there. Its CTAs read every K/V block from L2 once per 128 query rows; a cluster
of two CTAs sharing each block through TMA multicast would halve that traffic. Whether that is
worth building depends on the energy of an L2 read, measured here by two Triton kernels of the
same shape (one program per SM slot, the same adds per element):
  read:  every program streams a window of an L2-resident buffer (ld.global.cg: L2, not L1)
  alu:   the same loop and adds on values made in registers, no loads
J per TB = (W read - W alu) / (TB/s read): the loads' energy through L2, the crossbar and the
load path (TMA's copies skip the registers, so this bounds theirs from above). Also the idle
board and a read from HBM for scale.

  tools/bench_l2_power.py [--mbytes 24] [--seconds 2]
"""
import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from bench_power import sustained  # noqa: E402
from gpu_sampler import Sampler  # noqa: E402

BLOCK = 2048  # floats a program loads per step (8 KiB)


@triton.jit
def stream(src, out, window: tl.constexpr, steps, READ: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    blocks: tl.constexpr = window // BLOCK
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    fake = offs.to(tl.float32)
    for i in range(steps):
        if READ:
            # Step i reads the window's block pid + 7 i: the programs of one step and the steps
            # of one program spread over the whole L2-resident window.
            x = tl.load(src + ((pid + 7 * i) % blocks) * BLOCK + offs, cache_modifier=".cg")
        else:
            x = fake + i
        acc += x
    tl.store(out + pid * BLOCK + offs, acc)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mbytes", type=int, default=24, help="the L2-resident window (MB); H100/H200 L2: 50 MB")
    ap.add_argument("--steps", type=int, default=4096, help="loads per program per call")
    ap.add_argument("--programs-per-sm", type=int, default=8)
    ap.add_argument("--hbm-gbytes", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--warmup", type=float, default=0.5)
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    programs = sms * args.programs_per_sm
    window = args.mbytes * 2**20 // 4 // BLOCK * BLOCK
    src = torch.randn(window, device="cuda")
    out = torch.empty(programs * BLOCK, device="cuda")
    big = torch.randn(args.hbm_gbytes * 2**30 // 4, device="cuda")
    sampler = Sampler(50)
    time.sleep(0.5)
    t0 = time.perf_counter()
    time.sleep(args.seconds)
    rows = [("idle", None, sampler.mean(t0, time.perf_counter()))]
    per_call = programs * args.steps * BLOCK * 4
    for name, fn, nbytes in (
            ("alu", lambda: stream[(programs,)](src, out, window, args.steps, False, BLOCK), None),
            ("L2 read", lambda: stream[(programs,)](src, out, window, args.steps, True, BLOCK), per_call),
            ("alu", lambda: stream[(programs,)](src, out, window, args.steps, False, BLOCK), None),
            ("HBM read", lambda: big.sum(), big.numel() * 4)):
        calls, wall, w0, w1 = sustained(fn, args.seconds, args.warmup)
        rate = nbytes * calls / wall if nbytes else per_call * calls / wall
        rows.append((name, rate if nbytes else None, sampler.mean(w0, w1), per_call * calls / wall))
    sampler.stop()
    alu_w = sum(r[2][1] for r in rows if r[0] == "alu") / 2
    print(f"{torch.cuda.get_device_name()}  sustained {args.seconds:g} s each; {programs} programs, "
          f"{args.mbytes} MB window; J/TB over the alu loop's board power")
    print(f"{'workload':<10} {'TB/s':>7} {'MHz':>6} {'W':>6} {'C':>4} {'J/TB':>7}")
    for row in rows:
        name, rate, (mhz, watts, temp) = row[0], row[1], row[2]
        if rate is None:
            extra = f"  (loop rate {row[3] / 1e12:.2f} TB/s equivalent)" if len(row) > 3 else ""
            print(f"{name:<10} {'':>7} {mhz:6.0f} {watts:6.0f} {temp:4.0f}{extra}")
        else:
            joules = (watts - alu_w) / (rate / 1e12)
            print(f"{name:<10} {rate / 1e12:7.2f} {mhz:6.0f} {watts:6.0f} {temp:4.0f} {joules:7.1f}")


if __name__ == "__main__":
    main()
