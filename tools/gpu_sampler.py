"""nvidia-smi's SM clock, board power and temperature sampled in the background, for the tools that
say what clock a measurement ran at (bench_power.py, bench_l2_power.py, bench_points.py --clocks),
and on request why the clock is held down (grid_order_probe.py)."""
import math
import subprocess
import threading
import time
from typing import NamedTuple, Optional

import torch


# nvidia-smi's clocks_event_reasons.active bits (NVML's clocksEventReasons) that hold the SM clock
# below its boost clock under load.
CLOCK_EVENT_BITS = {
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
}


class Sample(NamedTuple):
    """One nvidia-smi line; watts_now and reasons only where the sampler was asked for them
    (NaN / None also where the driver reports none, "[N/A]")."""
    time: float
    mhz: float
    watts: float
    temp: float
    watts_now: float = math.nan
    reasons: Optional[int] = None


def _reading(field):
    try:
        return float(field)
    except ValueError:
        return math.nan


def _bitmask(field):
    try:
        return int(field.strip(), 16)
    except ValueError:
        return None


class Sampler:
    """nvidia-smi's clock/power/temperature lines, stamped with this process's clock on arrival.

    With reasons=True each sample also carries the instantaneous board power (power.draw is
    averaged over about a second, so it lags a short bench) and the clock event reasons bitmask."""

    def __init__(self, period_ms, reasons=False):
        self.samples = []  # Sample
        fields = "clocks.sm,power.draw,temperature.gpu"
        if reasons:
            fields += ",power.draw.instant,clocks_event_reasons.active"
        self.proc = subprocess.Popen(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits",
             f"-lms={period_ms}", "-i", str(torch.cuda.current_device())],
            stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            fields = line.split(",")
            try:
                mhz, watts, temp = (float(x) for x in fields[:3])
            except ValueError:
                continue  # not a sample line, or one without the readings every tool averages
            extra = {}
            if len(fields) == 5:
                extra = {"watts_now": _reading(fields[3]), "reasons": _bitmask(fields[4])}
            self.samples.append(Sample(time.perf_counter(), mhz, watts, temp, **extra))

    def mean(self, t0, t1):
        rows = self.window(t0, t1)
        if not rows:
            return math.nan, math.nan, math.nan
        return tuple(sum(values) / len(rows) for values in zip(*((r.mhz, r.watts, r.temp) for r in rows)))

    def window(self, t0, t1):
        """The samples that arrived between t0 and t1."""
        return [s for s in self.samples if t0 <= s[0] <= t1]

    def stop(self):
        self.proc.terminate()
