#!/usr/bin/env python3
"""Splits a row of the FA grid's sustained energy into a per-FLOP part and a part fixed per call.

Along one row of the FA grid (a head dim and a mask, 16k tokens, model dim 2048) every length runs
the same number of query tiles and moves the same bytes of Q, K, V and O; only the keys per tile
grow. So joules per FLOP fit E(S) = a + b / S, S the length in thousands of keys: `a` is what the
main loop (and the launch's tail, the same share of every point's tiles) costs per FLOP, `b / S`
what the call's fixed cost (the tile boundaries, the DRAM traffic) adds (docs/hopper.md, session
115). A change to the tile boundary should move b and leave a.

  tools/energy_fit.py FILE.jsonl [FILE.jsonl ...]
FILE: tools/bench_power.py's --out records (gpu_check.sh's power step writes them). Rows with at
least two lengths are fitted by least squares per provider (each --env variant its own); with
three or more, each point's residual shows how well the model holds. Runs on any machine.
"""
import argparse
import collections
import json
import sys

from perf_table import FA_MODEL_DIM, FA_TOKENS

# A call's FLOPs per thousand keys on an FA-grid row: 4 * tokens * model_dim * 1024, full mask.
PFLOP_PER_KILOKEY = 4 * FA_TOKENS * FA_MODEL_DIM * 1024 / 1e15


def fit(points):
    """Least-squares (a, b) of e = a + b / s over [(s, e), ...]: two points or more."""
    xs = [1.0 / s for s, _ in points]
    ys = [e for _, e in points]
    n = len(points)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("every point has the same length")
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b


def rows_of(records):
    """{(head_dim, mask, column): [(kilokeys, joule_per_pflop), ...]} of FA-grid points."""
    rows = collections.defaultdict(list)
    for r in records:
        fields = r["point"].split(":")
        if len(fields) != 4 or fields[0] != "fwd" or fields[2] not in ("full", "causal"):
            continue  # a point of another shape or a window: not on a grid row
        column = r["provider"] + (f"[{r['env']}]" if r.get("env") else "")
        rows[(int(fields[1]), fields[2], column)].append((int(fields[3]) / 1024, r["joule_per_pflop"]))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    records = [json.loads(line) for path in args.files for line in open(path) if line.strip()]
    rows = {key: pts for key, pts in rows_of(records).items() if len({s for s, _ in pts}) >= 2}
    if not rows:
        sys.exit("energy_fit: no grid row with two lengths or more in the records")
    print(f"{'row':<14}{'column':<44}{'a J/PFLOP':>10}{'b':>8}{'fixed mJ':>10}  residuals at each length")
    for (d, mask, column), pts in sorted(rows.items()):
        a, b = fit(pts)
        residuals = " ".join(f"{s:g}k {e - (a + b / s):+.1f}" for s, e in sorted(pts))
        # The fixed part's joules per call: (b / S) J/PFLOP times the call's S * PFLOP_PER_KILOKEY.
        fixed_mj = b * PFLOP_PER_KILOKEY * 1e3 * (0.5 if mask == "causal" else 1.0)
        print(f"{f'd{d} {mask}':<14}{column:<44}{a:>10.0f}{b:>8.0f}{fixed_mj:>10.1f}  {residuals}")


if __name__ == "__main__":
    main()
