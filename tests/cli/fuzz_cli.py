#!/usr/bin/env python3
"""Random command lines of the fusedattn CLI, many of them malformed (sizes, windows, documents,
pages, dtypes, layouts, counts, flags without values, unknown flags), on the CPU backend: each must
end with exit status 0 (ok), 1 (library error) or 2 (bad command line), never 3 (check failed: a
wrong result, or a bound of the check that misses some shape's rounding), and, in a sanitized build (scripts/test_sanitize.sh), without a sanitizer report. Sizes stay small
enough that a valid command line runs in seconds even under a sanitizer, and thread counts small
enough that the system grants them (a sanitizer aborts where it refuses one; tests/CMakeLists.txt's
threads_refused covers that case in the plain build).

  tests/cli/fuzz_cli.py CLI [--runs 300] [--seed 1]
"""
import argparse
import os
import random
import subprocess
import sys

# Per flag: values the CLI takes (a library call may still turn them down), and malformed ones.
COUNT = ["0", "1", "2", "3", "7"]
BAD_NUMBER = ["-1", "-5", "abc", "", "99999999999999999999", "2147483648", "0x10", "1,2"]
FLAGS = {
    "--batch": (COUNT, BAD_NUMBER), "--heads": (COUNT + ["8"], BAD_NUMBER),
    "--kv-heads": (COUNT + ["8"], BAD_NUMBER),
    "--seqlen-q": (COUNT + ["64", "129"], BAD_NUMBER), "--seqlen-k": (COUNT + ["64", "129"], BAD_NUMBER),
    "--head-dim": (COUNT + ["40", "64", "129", "256", "257"], BAD_NUMBER),
    "--window": (["-1,0", "3,2", "0,0", "-1,5", "100,-1", "9223372036854775807,0"], ["a,b", "5", "1,2,3", ",", "-2,5"]),
    "--documents": (["1,2", "0", "5,0,3", "40,24", "64,65"], ["-1,4", "x", "3,,2", "2147483648,1"]),
    "--page-size": (["1", "16", "64", "128"], BAD_NUMBER), "--dtype": (["fp16", "bf16", "fp32"], ["fp8", "int"]),
    "--layout": (["bshd", "bhsd"], ["x"]), "--iters": (["1", "2"], ["0", "-1", "x"]),
    "--warmup": (["0", "1"], ["-1"]), "--threads": (["0", "1", "2", "16"], ["-3"]),
    "--seed": (["1", "7"], ["-1", "x"]), "--check-rows": (["0", "1", "64", "100000"], ["-1"]),
    "--softmax-scale": (["0", "0.125", "1", "-0.5", "4", "1e-3", "100"], ["nan", "inf", "x", "1e39", "", "0x1p3"]),
}
MALFORMED_SHARE = 0.1  # of the drawn flags' values
BARE = ["--causal", "--backward", "--deterministic", "--peers-naive", "--help", "--bogus", "--backend"]
EXIT_STATUSES = (0, 1, 2)
TIMEOUT_S = 120


def command_line(rng: random.Random) -> list:
    # The small default shape first; the drawn flags may override any of it.
    args = ["--backend", "cpu", "--seqlen-q", "64", "--iters", "1", "--warmup", "0"]
    for flag in rng.sample(sorted(FLAGS), rng.randint(1, 6)):
        valid, malformed = FLAGS[flag]
        value = rng.choice(malformed if rng.random() < MALFORMED_SHARE else valid)
        args += [f"{flag}={value}"] if rng.random() < 0.3 else [flag, value]
    args += [flag for flag in BARE if rng.random() < (0.25 if flag in ("--causal", "--backward") else 0.03)]
    return args


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cli")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    opts = parser.parse_args()
    rng = random.Random(opts.seed)
    failures = 0
    statuses = {}
    for run in range(opts.runs):
        args = command_line(rng)
        try:
            done = subprocess.run([opts.cli] + args, capture_output=True, text=True, timeout=TIMEOUT_S,
                                  env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
        except subprocess.TimeoutExpired:
            print(f"run {run}: no exit within {TIMEOUT_S} s: {' '.join(args)}")
            failures += 1
            continue
        output = done.stdout + done.stderr
        statuses[done.returncode] = statuses.get(done.returncode, 0) + 1
        if done.returncode not in EXIT_STATUSES or "Sanitizer" in output or "runtime error" in output:
            print(f"run {run}: exit status {done.returncode}: {' '.join(args)}\n{output[-3000:]}")
            failures += 1
    print(f"{opts.runs} command lines, {failures} failed; exit statuses {dict(sorted(statuses.items()))}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
