#!/usr/bin/env python3
"""How often each forward point of the FA grid met issue 5's goal over several grids: per point,
ours / cuDNN of each file's medians (tools/perf_table.py's ratio), how many files met the goal
there, and the lowest and median ratio. Which point misses a grid moves from grid to grid with
the peers' spread (docs/hopper.md, session 90); this says which points are narrow over many.

    tools/grid_history.py FILE.jsonl [FILE.jsonl ...] [--goal 1.10] [--goal-from 2048] [--goal-below 1.0]
      [--margin 0.03]
Each file is one grid of one dtype (peers.py JSON lines; several readings a point give their
median). Prints the points whose lowest ratio came within --margin of their goal (or missed it),
narrowest first, then each file's count of points that met the goal.
"""
import argparse
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from perf_table import add_goal_arguments, goal_at, medians, read_readings  # noqa: E402

PEER = "sdpa_cudnn"


def forward_ratios(path):
    """{(head dim, causal, seqlen): ours / cuDNN of the medians} of one grid's forward points."""
    rows, _ = read_readings(path)
    return {(d, causal, s): vals["ours"] / vals[PEER] for (mode, d, causal, s), vals in medians(rows).items()
            if mode == "fwd" and vals.get("ours") and vals.get(PEER)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    add_goal_arguments(ap)
    ap.add_argument("--margin", type=float, default=0.03, help="list the points whose lowest ratio is within this of the goal")
    args = ap.parse_args()
    grids = {path: forward_ratios(path) for path in args.files}
    points = sorted({key for ratios in grids.values() for key in ratios})
    listed = []
    for key in points:
        seen = [ratios[key] for ratios in grids.values() if key in ratios]
        goal = goal_at(args, key[2])
        listed.append((min(seen) - goal, key, seen, sum(r >= goal for r in seen)))
    print(f"{len(grids)} grids; points whose lowest ours/cuDNN came within {args.margin:.2f} of the goal "
          f"({args.goal:.2f} from {args.goal_from} keys, {args.goal_below:.2f} below), narrowest first:\n")
    print("| d | mask | seqlen | met | lowest | median | every grid |")
    print("|---|---|---|---|---|---|---|")
    for margin, (d, causal, s), seen, met in sorted(listed):
        if margin >= args.margin:
            continue
        every = " ".join(f"{r:.3f}" for r in seen)
        print(f"| {d} | {'causal' if causal else 'full'} | {s} | {met} of {len(seen)} | {min(seen):.3f} | "
              f"{statistics.median(seen):.3f} | {every} |")
    print()
    for path, ratios in grids.items():
        met = sum(r >= goal_at(args, key[2]) for key, r in ratios.items())
        print(f"{pathlib.Path(path).name}: {met} of {len(ratios)} forward points meet the goal")


if __name__ == "__main__":
    main()
