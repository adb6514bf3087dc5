#!/usr/bin/env python3
"""A few FA-grid points, ours against the peers in one process, with ratios: the quick A/B tool
for kernel work on the GPU machine (the full grid is tools/gpu_check.sh's `peers` step).

Timing is peers.py's own (`bench_one`, triton do_bench median, autograd for the backward), so the
numbers compare with the performance log. peers.py is read from .devbuild/carry/ (copied there
from ../shared/bench and carried with the device call).

  tools/bench_points.py --points fwd:128:causal:4096,bwd:256:full:2048 [--providers sdpa_flash,ours]
      [--dtype float16] [--env [PROVIDER@]NAME=VALUE[+NAME=VALUE...] ...]
A point is mode:head_dim:mask:seqlen on the FA grid (16k tokens, model dim 2048), or any shape as
mode:head_dim:mask:seqlen_q:seqlen_k:batch:heads_q:heads_kv (causal with seqlen_q != seqlen_k: ours
only, since SDPA's is_causal aligns top-left); mask is full, causal or windowN (a causal
sliding window of N keys to the left: window_size=(N, 0), ours only, its FLOPs counted over the
visible pairs); `fa-fwd` or `fa-bwd` names every
forward or backward point of that grid, `decode` every point of peers.py's decode suite. --out FILE appends one JSON line per
measurement in peers.py's record format (tools/perf_table.py reads it; the --env columns carry an
`env` key, which it skips). Each --env setting adds one more `ours` column measured with that environment variable set (read by the
library at launch time, e.g. FUSEDATTN_DISABLE_SM90=1), so variants compare in one run;
`PROVIDER@NAME=VALUE` makes it a column of that provider instead (`ours_deterministic@FUSEDATTN_SM90_BWD=0`). The
provider `ours_deterministic` is ours called with deterministic=True (the backward's dQ adds in a
fixed order).

--repeat N measures every point N times in a row, the columns in reverse order on every second
time (so neither side always runs first or last), and prints each column's median with its
min-max: at the power cap one reading moves by 3-7% between runs of one process, so effects of
about 1% need medians (docs/hopper.md, session 24). Every reading goes to --out with its `rep`.
--order given keeps the columns in the given order every time, as peers.py runs its providers
(each one right after the one before it, FA2 first): what a column reads may depend on what ran
just before it, since the clock the power cap allows lags the load (docs/hopper.md, session 40).

--clocks samples nvidia-smi (tools/gpu_sampler.py) through the run and adds to every --out record
the mean SM clock, board power and GPU temperature over that reading's bench_one call (its
estimate, warm-up and timed runs): whether a column read high because it ran at a higher clock,
e.g. after a slower column let the card cool (docs/hopper.md, session 72).

--gemm N adds a first row: torch.matmul of two N x N matrices in --dtype, timed the same way and
as often (--repeat), the card's dense-GEMM rate at its power cap in this process, against which
the attention points' TFLOP/s read (docs/hopper.md, session 28).
"""
import argparse
import contextlib
import json
import os
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / ".devbuild" / "carry"))
import torch  # noqa: E402
import peers  # noqa: E402

from perf_table import FA_MODEL_DIM, FA_TOKENS  # noqa: E402


def parse_point(text):
    """(mode, head_dim, causal, seqlen_q, seqlen_k, batch, heads_q, heads_kv) of a point."""
    fields = text.split(":")
    window = fields[2][len("window"):] if len(fields) in (4, 8) and fields[2].startswith("window") else None
    if (len(fields) not in (4, 8) or fields[0] not in ("fwd", "bwd")
            or not (fields[2] in ("full", "causal") or (window and window.isdigit()))):
        raise SystemExit(f"bad point '{text}': expected mode:head_dim:mask:seqlen or "
                         "mode:head_dim:mask:seqlen_q:seqlen_k:batch:heads_q:heads_kv, mode fwd|bwd, "
                         "mask full|causal|windowN")
    mode, d = fields[0], int(fields[1])
    causal = fields[2] == "causal" or window is not None
    if len(fields) == 4:
        s = int(fields[3])
        return mode, d, causal, s, s, FA_TOKENS // s, FA_MODEL_DIM // d, FA_MODEL_DIM // d
    sq, sk, batch, hq, hkv = (int(x) for x in fields[3:])
    return mode, d, causal, sq, sk, batch, hq, hkv


def forward_inputs(text, dtype):
    """A forward point's fields (parse_point's) and fresh random q, k, v as peers.py builds them
    ([batch, heads, seqlen, head_dim] on the GPU), for the tools that call the providers directly
    (call_span.py, decode_ncu.py, bench_power.py); a backward point is refused."""
    point = parse_point(text)
    mode, d, causal, sq, sk, batch, hq, hkv = point
    if mode != "fwd":
        raise SystemExit(f"{text}: forward points only")
    q = torch.randn(batch, hq, sq, d, device="cuda", dtype=dtype)
    k = torch.randn(batch, hkv, sk, d, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    return point, q, k, v


def peer_mask_differs(provider, causal, sq, sk):
    """Whether a peer provider runs another mask than ours at this point: SDPA's is_causal aligns
    the diagonal top-left, ours (as flash_attn) bottom-right, so at Sq != Sk a causal point is a
    different problem for the peers and no ratio to them means anything."""
    return causal and sq != sk and not provider.startswith("ours")


PEERS_LEFT_OUT = "the peers left out (their causal mask aligns top-left at Sq != Sk)"


def point_window(text):
    """The left window of a windowN point, else None."""
    mask = text.split(":")[2]
    return int(mask[len("window"):]) if mask.startswith("window") else None


def window_flops(batch, heads, sq, sk, d, left, mode):
    """FLOPs of a causal sliding window (bottom-right aligned): each query row sees at most left + 1 keys."""
    pairs = 0
    for i in range(sq):
        last = i + sk - sq  # the row's diagonal key
        if last >= 0:
            pairs += min(last, left) + 1
    return 4.0 * batch * heads * pairs * d * (2.5 if mode == "bwd" else 1.0)


def install_ours(name, **kwargs):
    """Provider `name`: ours through flash_attn_func with these extra arguments (peers.py's
    providers take [B, H, S, D] tensors; flash_attn_func [B, S, H, D] views of them)."""
    def provider(q, k, v, causal, scale):
        o = peers.OURS["mod"].flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              softmax_scale=scale, causal=causal, **kwargs)
        return o.transpose(1, 2)
    peers.PROVIDERS[name] = provider


def install_window(left):
    """Points with a window run ours through window_size (the peers have no sliding window)."""
    install_ours("ours_window", window_size=(left, 0))


def install_deterministic():
    """The `ours_deterministic` column: ours with deterministic=True (no peer takes the flag)."""
    install_ours("ours_deterministic", deterministic=True)


def column_names(columns):
    """Each (provider, env) column's header name: the provider, or an env column's setting without
    the common prefixes, after its provider's suffix where that is not `ours`."""
    short = lambda p, e: (p[len("ours_"):] + "@" if p != "ours" else "") + e.replace("FUSEDATTN_", "").replace("SM90_", "")
    return [p if e is None else short(p, e) for p, e in columns]


def header_cells(names, width=16):
    """Column headers of `width` characters, a space first so that neighbours never run together;
    a longer name keeps its end, where an env column's value is."""
    return "".join(" " + name[-(width - 1):].rjust(width - 1) for name in names)


@contextlib.contextmanager
def apply_env(env):
    """Sets an --env column's NAME=VALUE[+NAME=VALUE...] for the block (read by the library at launch)."""
    saved = {}
    for setting in env.split("+") if env else []:
        key, value = setting.split("=", 1)
        saved[key] = os.environ.get(key)
        os.environ[key] = value
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def expand_points(spec):
    """The --points list with `fa-fwd` / `fa-bwd` replaced by that mode's points of the FA grid."""
    points = []
    for text in spec.split(","):
        if text in ("fa-fwd", "fa-bwd"):
            mode = text[3:]
            points += [f"{mode}:{d}:{mask}:{s}" for d in (64, 128, 256) for s in (512, 1024, 2048, 4096, 8192, 16384)
                       for mask in ("full", "causal")]
        elif text == "decode":
            points += [f"{mode}:{d}:{'causal' if causal else 'full'}:{sq}:{sk}:{b}:{hq}:{hkv}"
                       for b, hq, hkv, sq, sk, d, causal, mode in peers.suites("decode")]
        else:
            points.append(text)
    return points


def measure(text, provider, env, dtype_name, rep, out, sampler=None):
    """TFLOP/s of one column at one point (nan where the provider cannot run it), recorded to out
    (with the mean clock, power and temperature over the reading where a sampler runs)."""
    mode, d, causal, sq, sk, batch, hq, hkv = parse_point(text)
    left = point_window(text)
    if left is not None and provider != "ours":
        return float("nan")  # no peer takes a sliding window
    if peer_mask_differs(provider, causal, sq, sk):
        return float("nan")
    dtype = getattr(torch, dtype_name)
    start = time.perf_counter()
    with apply_env(env):
        try:
            if left is None:
                ms = peers.bench_one(provider, batch, hq, hkv, sq, sk, d, causal, mode, dtype)
                tflops = peers.flops(batch, hq, sq, sk, d, causal, mode) / ms * 1e-9
            else:
                install_window(left)
                ms = peers.bench_one("ours_window", batch, hq, hkv, sq, sk, d, causal, mode, dtype)
                tflops = window_flops(batch, hq, sq, sk, d, left, mode) / ms * 1e-9
        except Exception as e:  # a provider that cannot run the point says why, the row goes on
            print(f"  {provider} {env or ''}: {type(e).__name__}: {str(e)[:120]}")
            return float("nan")
        finally:
            torch.cuda.empty_cache()
    end = time.perf_counter()
    if out:
        suite = "fa" if len(text.split(":")) == 4 else "shape"
        rec = {"suite": suite, "provider": provider, "B": batch, "Hq": hq, "Hkv": hkv, "Sq": sq, "Sk": sk, "D": d,
               "causal": causal, "mode": mode, "dtype": dtype_name, "ms": round(ms, 4), "tflops": round(tflops, 1)}
        if left is not None:
            rec["window_left"] = left
        if env:
            rec["env"] = env  # perf_table.py renders only the default columns
        if rep is not None:
            rec["rep"] = rep
        if sampler is not None:
            mhz, watts, temp = sampler.mean(start, end)
            rec.update(mhz=round(mhz), watts=round(watts), temp_c=round(temp, 1))
        out.write(json.dumps(rec) + "\n")
        out.flush()
    return tflops


def measure_gemm(n, dtype_name, rep, out):
    """TFLOP/s of torch.matmul at n x n x n (cuBLAS), recorded to out like a point."""
    dtype = getattr(torch, dtype_name)
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    ms = peers.triton.testing.do_bench(lambda: a @ b, warmup=25, rep=100, return_mode="median")
    tflops = 2.0 * n ** 3 / ms * 1e-9
    del a, b
    torch.cuda.empty_cache()
    if out:
        rec = {"suite": "gemm", "provider": "torch_matmul", "N": n, "dtype": dtype_name,
               "ms": round(ms, 4), "tflops": round(tflops, 1)}
        if rep is not None:
            rec["rep"] = rep
        out.write(json.dumps(rec) + "\n")
        out.flush()
    return tflops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", required=True)
    ap.add_argument("--providers", default="sdpa_flash,ours")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--env", action="append", default=[],
                    help="[PROVIDER@]NAME=VALUE[+NAME=VALUE...]: one more column of PROVIDER (default ours) with these set")
    ap.add_argument("--module", default="fusedattn")
    ap.add_argument("--out", default=None, help="append JSON lines (peers.py's record format) to this file")
    ap.add_argument("--repeat", type=int, default=1, help="readings per point and column, the order alternating; medians shown")
    ap.add_argument("--order", choices=("alternate", "given"), default="alternate",
                    help="column order over the repeats: reversed every second time, or always as given")
    ap.add_argument("--gemm", type=int, default=0, metavar="N", help="first, torch.matmul at N x N x N in --dtype")
    ap.add_argument("--clocks", action="store_true",
                    help="add each reading's mean SM clock, board power and temperature (nvidia-smi) to its --out record")
    args = ap.parse_args()
    if args.repeat < 1:
        raise SystemExit(f"--repeat must be at least 1, got {args.repeat}")
    if args.gemm < 0:
        raise SystemExit(f"--gemm must be a matrix size (0: none), got {args.gemm}")
    if args.clocks and not args.out:
        raise SystemExit("--clocks adds to the --out records: give --out FILE")
    out = open(args.out, "a") if args.out else None
    sampler = None
    if args.clocks:
        from gpu_sampler import Sampler  # nvidia-smi is needed only here
        sampler = Sampler(20)
    peers.OURS["mod"] = __import__(args.module)
    install_deterministic()
    # An env column runs `ours` unless its setting names another provider (`ours_deterministic@...`).
    columns = [(p, None) for p in args.providers.split(",")]
    columns += [tuple(e.split("@", 1)) if "@" in e else ("ours", e) for e in args.env]
    names = column_names(columns)
    what = "TFLOP/s" if args.repeat == 1 else f"median TFLOP/s of {args.repeat} (min-max)"
    print(f"{torch.cuda.get_device_name()}  {args.dtype}  {what}")
    print("%-32s" % "point" + header_cells(names) + "   ratios to the first column")
    if args.gemm:
        gemm = [measure_gemm(args.gemm, args.dtype, rep if args.repeat > 1 else None, out) for rep in range(args.repeat)]
        print("%-32s" % f"matmul {args.gemm}^3" + "%16.1f" % statistics.median(gemm)
              + (f"   ({min(gemm):.0f}-{max(gemm):.0f})" if args.repeat > 1 else ""), flush=True)
    for text in expand_points(args.points):
        readings = [[] for _ in columns]
        for rep in range(args.repeat):
            forward = rep % 2 == 0 or args.order == "given"
            order = range(len(columns)) if forward else reversed(range(len(columns)))
            for i in order:
                provider, env = columns[i]
                readings[i].append(measure(text, provider, env, args.dtype, rep if args.repeat > 1 else None, out,
                                           sampler))
        row = [statistics.median(r) for r in readings]
        ratios = " ".join("%.3f" % (x / row[0]) for x in row[1:])
        print("%-32s" % text + "".join("%16.1f" % x for x in row) + "   " + ratios, flush=True)
        if args.repeat > 1:
            print("%-32s" % "" + "".join("%16s" % f"{min(r):.0f}-{max(r):.0f}" for r in readings), flush=True)
    if sampler is not None:
        sampler.stop()


if __name__ == "__main__":
    main()
