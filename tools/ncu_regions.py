#!/usr/bin/env python3
"""Summarises ncu's per-instruction source page (SASS) of one kernel by runs of instructions that
executed equally often: a hot loop's straight-line code is one run, a rarely taken path inside it
another. For each run: its instruction range, length, how often it executed, its warp stall
samples in all and those waiting for an instruction (stall_no_inst: an instruction cache miss or
fetch), and its most common opcodes. Jumps over rarely taken code show as a hot run after a cold
one with no_inst samples of its own.

  ncu --import REPORT.ncu-rep --page source --csv --print-source sass > source.csv
  tools/ncu_regions.py source.csv [--min-run 8] [--top 30]

Runs shorter than --min-run instructions are left out unless they hold 20 or more no_inst samples.
--top N then lists the N instructions with the most stall samples, in address order, each with its
share of the kernel's samples and its two largest stall reasons.
"""
import argparse
import collections
import csv


def load(path):
    rows = list(csv.reader(open(path)))
    # The first row names the kernel, the second the columns.
    header = rows[1]
    col = {name: i for i, name in enumerate(header)}

    def number(row, name):
        value = row[col[name]] if name in col else ""
        return float(value) if value not in ("", "-") else 0.0

    # The stall reasons' columns (all samples; ncu adds a "(Not Issued)" copy of each).
    reasons = [name for name in header if name.startswith("stall_") and not name.endswith("(Not Issued)")]
    return [{"sass": row[col["Source"]].strip(),
             "executed": number(row, "Instructions Executed"),
             "samples": number(row, "Warp Stall Sampling (All Samples)"),
             "no_inst": number(row, "stall_no_inst"),
             "reasons": {name: number(row, name) for name in reasons}}
            for row in rows[2:] if len(row) == len(header)]


def opcode(sass):
    words = sass.split()
    if words and words[0].startswith("@"):  # a predicate
        words = words[1:]
    return words[0] if words else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--min-run", type=int, default=8)
    ap.add_argument("--top", type=int, default=0, help="list the N instructions with most stall samples")
    args = ap.parse_args()
    ins = load(args.csv)
    total = sum(i["samples"] for i in ins)
    no_inst = sum(i["no_inst"] for i in ins)
    print(f"{len(ins)} instructions, {total:.0f} stall samples, {no_inst:.0f} no_inst "
          f"({100 * no_inst / max(total, 1):.1f}%)")
    print(f"{'range':>11} {'length':>6} {'executed':>10} {'samples':>8} {'no_inst':>8}  opcodes")
    start = 0
    for end in range(1, len(ins) + 1):
        if end < len(ins) and ins[end]["executed"] == ins[start]["executed"]:
            continue
        run = ins[start:end]
        run_no_inst = sum(i["no_inst"] for i in run)
        if len(run) >= args.min_run or run_no_inst >= 20:
            ops = collections.Counter(opcode(i["sass"]) for i in run)
            top = " ".join(f"{op}:{n}" for op, n in ops.most_common(4))
            print(f"{start:5d}-{end:5d} {len(run):6d} {run[0]['executed']:10.0f} "
                  f"{sum(i['samples'] for i in run):8.0f} {run_no_inst:8.0f}  {top}")
        start = end
    if args.top > 0:
        print(f"the {args.top} instructions with most stall samples:")
        hot = sorted(range(len(ins)), key=lambda k: -ins[k]["samples"])[:args.top]
        for k in sorted(hot):
            i = ins[k]
            why = sorted(i["reasons"].items(), key=lambda kv: -kv[1])[:2]
            print(f"{k:5d} {i['sass'][:64]:64} {i['samples']:8.0f} {100 * i['samples'] / max(total, 1):5.1f}%  "
                  + " ".join(f"{name[len('stall_'):]}:{n:.0f}" for name, n in why))


if __name__ == "__main__":
    main()
