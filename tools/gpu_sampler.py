"""nvidia-smi's SM clock, board power and temperature sampled in the background, for the tools that
say what clock a measurement ran at (bench_power.py, bench_l2_power.py, bench_points.py --clocks)."""
import math
import subprocess
import threading
import time

import torch


class Sampler:
    """nvidia-smi's clock/power/temperature lines, stamped with this process's clock on arrival."""

    def __init__(self, period_ms):
        self.samples = []  # (time, MHz, W, C)
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader,nounits",
             f"-lms={period_ms}", "-i", str(torch.cuda.current_device())],
            stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                mhz, watts, temp = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.perf_counter(), mhz, watts, temp))

    def mean(self, t0, t1):
        rows = [s for s in self.samples if t0 <= s[0] <= t1]
        if not rows:
            return math.nan, math.nan, math.nan
        return tuple(sum(r[i] for r in rows) / len(rows) for i in (1, 2, 3))

    def stop(self):
        self.proc.terminate()
