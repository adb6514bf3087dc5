#!/usr/bin/env python3
"""The table of tools/ab_chain.sh: its runs of tools/chain_bench.py (DIR/ab_chain_<build>_<round>.txt,
build `new` or `base`) read back, and per point and column the median over the rounds of each build
(us a copy-and-attention pair), then ours' new / base time.

  tools/ab_chain_table.py DIR
"""
import collections
import pathlib
import re
import statistics
import sys

# chain_bench.py's columns after the providers (and --env columns): the copy alone, then ratios.
TRAILING = ("copy", "ratios")


def read_runs(folder):
    """{(point, build, column): [us, ...]} and the points and columns in their first order."""
    values = collections.defaultdict(list)
    points, columns = [], []
    for path in sorted(pathlib.Path(folder).glob("ab_chain_*_*.txt")):
        match = re.fullmatch(r"ab_chain_(new|base)_\d+\.txt", path.name)
        if not match:
            continue
        header = None
        for line in path.read_text().splitlines():
            fields = line.split()
            if fields and fields[0] == "point":
                header = []
                for name in fields[1:]:
                    if name in TRAILING:
                        break
                    header.append(name)
            elif fields and fields[0].startswith("fwd:") and header:
                point = fields[0]
                points += [point] if point not in points else []
                for name, value in zip(header, fields[1:]):
                    columns += [name] if name not in columns else []
                    values[point, match.group(1), name].append(float(value))
    return values, points, columns


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    values, points, columns = read_runs(sys.argv[1])
    if not points:
        raise SystemExit(f"{sys.argv[1]}: no chain_bench tables (ab_chain_new_N.txt, ab_chain_base_N.txt)")
    print("us a (copy, attention) pair, medians over the rounds, new | base; then ours new / base")
    for point in points:
        cells, ratio = [], "-"
        for column in columns:
            medians = {b: statistics.median(values[point, b, column]) if values[point, b, column] else None
                       for b in ("new", "base")}
            cells.append(f"{column} " + " | ".join("-" if m is None else f"{m:.2f}" for m in medians.values()))
            if column == "ours" and None not in medians.values():
                ratio = f"{medians['new'] / medians['base']:.3f}"
        print(f"{point:32s} " + "   ".join(cells) + f"   ours new/base {ratio}")


if __name__ == "__main__":
    main()
