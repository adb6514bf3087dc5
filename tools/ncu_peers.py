#!/usr/bin/env python3
"""The launch shape and traffic of every kernel in one call of each provider, under ncu.

Runs tools/decode_ncu.py (one call per point and provider inside an NVTX range "measure", inputs
and providers as peers.py's) under ncu with the metrics below, and prints one row per kernel in
launch order: grid, block, cluster, registers, shared memory, time, DRAM and L2 traffic, tensor
pipe activity and instructions. What a peer's kernel is made of (tile, persistence, clusters)
and what it moves, beside ours, without its source:

  PYTHONPATH=build-gpu/python:.devbuild/carry tools/ncu_peers.py --points fwd:256:full:2048 \\
      [--providers sdpa_cudnn,ours] [--dtype bfloat16] [--raw ncu.csv]

Clocks are left to the card (--clock-control none), caches flushed before each kernel (ncu's
default), so the traffic is one cold call's.
"""
import argparse
import csv
import io
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent

# (ncu metric, column heading, divisor for the printed value)
COLUMNS = [
    ("launch__grid_size", "grid", 1),
    ("launch__block_size", "block", 1),
    ("launch__cluster_dim_x", "cl.x", 1),
    ("launch__registers_per_thread", "regs", 1),
    ("launch__shared_mem_per_block_dynamic", "dyn smem KiB", 1024),
    ("launch__shared_mem_per_block_static", "st smem KiB", 1024),
    ("gpu__time_duration.sum", "us", 1000),
    ("dram__bytes_read.sum", "DRAM rd MB", 1e6),
    ("dram__bytes_write.sum", "DRAM wr MB", 1e6),
    ("lts__t_sectors_srcunit_tex_op_read.sum", "L2 rd MB", 1e6 / 32),
    ("lts__t_sectors_srcunit_tex_op_write.sum", "L2 wr MB", 1e6 / 32),
    ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed", "tensor %", 1),
    ("sm__cycles_elapsed.avg", "kcycles", 1e3),  # thousands: fine enough to compare a 2k call with a 16k one
    ("smsp__inst_executed.sum", "Minst", 1e6),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", default="fwd:256:full:2048")
    ap.add_argument("--providers", default="sdpa_cudnn,ours")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--raw", help="also write ncu's CSV here")
    args = ap.parse_args()
    metrics = ",".join(m for m, _, _ in COLUMNS)
    cmd = ["ncu", "--nvtx", "--nvtx-include", "measure/", "--clock-control", "none", "--csv", "--print-units", "base",
           "--metrics", metrics, sys.executable, str(HERE / "decode_ncu.py"), "--points", args.points,
           "--providers", args.providers, "--dtype", args.dtype]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if args.raw:
        pathlib.Path(args.raw).write_text(run.stdout + run.stderr)
    # ncu's CSV lines start with a quote; decode_ncu.py's own lines name each measured call in order.
    table = "\n".join(line for line in run.stdout.splitlines() if line.startswith('"'))
    calls = [line for line in run.stdout.splitlines() if line.startswith("measured ")]
    if run.returncode != 0 or not table:
        sys.exit(f"ncu failed (exit {run.returncode}):\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
    kernels = {}  # ncu's kernel ID -> (name, {metric: value})
    for row in csv.DictReader(io.StringIO(table)):
        name, values = kernels.setdefault(row["ID"], (row["Kernel Name"], {}))
        values[row["Metric Name"]] = row["Metric Value"].replace(",", "")
    print("calls in order: " + "; ".join(c[len("measured "):] for c in calls))
    print(" | ".join(["kernel"] + [h for _, h, _ in COLUMNS]))
    for _, (name, values) in sorted(kernels.items(), key=lambda item: int(item[0])):
        cells = []
        for metric, _, divisor in COLUMNS:
            try:
                value = float(values[metric]) / divisor
                cells.append(f"{value:.0f}" if divisor == 1 and value == int(value) else f"{value:.1f}")
            except (KeyError, ValueError):
                cells.append(values.get(metric, "-"))
        print(" | ".join([name[:90]] + cells))


if __name__ == "__main__":
    main()
