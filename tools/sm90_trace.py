#!/usr/bin/env python3
"""Where a Hopper forward tile boundary's time goes, from the clock stamps of a trace build.

Build with -DFUSEDATTN_SM90_TRACE=ON, run one forward with FUSEDATTN_SM90_TRACE_FILE=trace.csv
(each launch appends its stamps: launch, sm, role, event, tile, blocks, clock; role -1 is the
producer, else the consumer warpgroup), then

  tools/sm90_trace.py trace.csv [--launch N]

prints, per consumer warpgroup, the median cycles of each part of a tile (src/cuda/sm90/trace.h
names the stamps) and of the boundary between two tiles of one CTA, also in KV steps (the loop's
time per block), and the producer's wait for the Q buffer. Clocks are per SM: only stamps of one
SM are compared, and each SM runs one CTA of the persistent kernel (the launch's default).

The stamps cost registers: where the trace build's ptxas lines report spills (tools/gpu_check.sh
notes them), the spill reloads from L2 land between stamps and the boundary reads long (session
71: the paired d256 tile spilled 260 B there and read 4.3-4.8 KV steps; the release build, which
does not spill, costs 2-4 steps of cycles per tile by shapes of equal FLOPs and 16 to 128 blocks
per tile, docs/perf.md, sixty-eighth session).
"""
import argparse
import bisect
import collections
import math
import csv
import statistics
import sys

# src/cuda/sm90/trace.h, TraceEvent
TILE_START, FIRST_K_READY, FIRST_S_READY, LAST_PV_DONE, EPILOGUE_DONE = 0, 1, 2, 3, 4
Q_WAIT_START, Q_ISSUED, LAST_LOAD_ISSUED = 5, 6, 7
Q_READY, O_STAGED, EPILOGUE_MET, O_RESCALED, O_WRITTEN, LOOP_ENTERED, O_STORE_ISSUED = 8, 9, 10, 11, 12, 13, 14
FIRST_TURN_TAKEN, FIRST_P_READY, FIRST_K_ISSUED = 15, 16, 17
PART_TICKETED, PARTS_COMBINED = 18, 19
COMBINE_LOADS_ISSUED, COMBINE_ROUND_SUMMED = 20, 21
NAMES = {TILE_START: "tile start", FIRST_K_READY: "first K landed",
         FIRST_S_READY: "first S ready", LAST_PV_DONE: "last P V done", EPILOGUE_DONE: "epilogue done",
         Q_WAIT_START: "waits for the Q buffer", Q_ISSUED: "Q issued", LAST_LOAD_ISSUED: "last K/V issued",
         Q_READY: "Q landed", O_STAGED: "O staged in shared memory", EPILOGUE_MET: "epilogue: warpgroups met",
         O_RESCALED: "epilogue: O rescaled", O_WRITTEN: "epilogue: O written (stmatrix)",
         LOOP_ENTERED: "tile set up (O zeroed)", O_STORE_ISSUED: "epilogue: O's store issued",
         FIRST_TURN_TAKEN: "first Q K^T's turn taken", FIRST_P_READY: "first P ready",
         FIRST_K_ISSUED: "first K issued", PART_TICKETED: "split: ticket drawn",
         PARTS_COMBINED: "split: parts combined", COMBINE_LOADS_ISSUED: "split: combine's first loads issued",
         COMBINE_ROUND_SUMMED: "split: combine's first round summed"}
PRODUCER = -1


def read(path, launch):
    """The stamps of one launch (the last when launch is None): {(sm, role): [(clock, event, tile, blocks)]}."""
    rows = collections.defaultdict(list)
    launches = set()
    try:
        f = open(path, newline="")
    except FileNotFoundError:
        raise SystemExit(f"{path}: no such trace (only a -DFUSEDATTN_SM90_TRACE=ON build writes one, "
                         "from a Hopper forward launch run with FUSEDATTN_SM90_TRACE_FILE set)")
    with f:
        for rec in csv.reader(f):
            if len(rec) != 7:
                raise SystemExit(f"{path}: expected 7 fields per line, got {rec}")
            l, sm, role, event, tile, blocks, clock = (int(x) for x in rec)
            launches.add(l)
            rows[l, sm, role].append((clock, event, tile, blocks))
    if not launches:
        raise SystemExit(f"{path}: no stamps")
    chosen = max(launches) if launch is None else launch
    if chosen not in launches:
        raise SystemExit(f"{path}: no launch {chosen} (launches {min(launches)}..{max(launches)})")
    return chosen, {(sm, role): sorted(v) for (l, sm, role), v in rows.items() if l == chosen}


def consumer_tiles(stamps):
    """A warpgroup's stamps cut into tiles: a list of {event: clock} with 'blocks'. A tile starts at
    its TILE_START (the announcement is read, then the tile set up while its Q may still load:
    Q_READY follows)."""
    tiles = []
    for clock, event, tile, blocks in stamps:
        if event == TILE_START:
            tiles.append({"blocks": blocks, "tile": tile})
        if tiles and event not in tiles[-1]:
            tiles[-1][event] = clock
    return tiles


def parts_of(tiles):
    """Per-tile spans (cycles) and, between consecutive tiles, the boundary."""
    out = collections.defaultdict(list)
    for i, t in enumerate(tiles):
        have = lambda *events: all(e in t for e in events)
        if have(FIRST_S_READY, LAST_PV_DONE) and t["blocks"] > 1:
            out["KV step in the loop"].append((t[LAST_PV_DONE] - t[FIRST_S_READY]) / t["blocks"])
        if have(TILE_START, FIRST_K_READY):
            out["tile start -> first K landed"].append(t[FIRST_K_READY] - t[TILE_START])
        if have(FIRST_K_READY, FIRST_S_READY):
            out["first Q K^T alone (K landed -> S ready)"].append(t[FIRST_S_READY] - t[FIRST_K_READY])
        if have(LAST_PV_DONE, EPILOGUE_DONE):
            out["epilogue (last P V done -> stored)"].append(t[EPILOGUE_DONE] - t[LAST_PV_DONE])
        if have(LAST_PV_DONE, O_STAGED):
            out["  of it: last P V done -> O staged"].append(t[O_STAGED] - t[LAST_PV_DONE])
        if have(PART_TICKETED, PARTS_COMBINED):
            out["  split: ticket drawn -> parts combined"].append(t[PARTS_COMBINED] - t[PART_TICKETED])
        if have(PART_TICKETED, COMBINE_LOADS_ISSUED, COMBINE_ROUND_SUMMED, PARTS_COMBINED):
            out["    combine: ticket drawn -> first loads issued"].append(t[COMBINE_LOADS_ISSUED] - t[PART_TICKETED])
            out["    combine: first loads issued -> summed"].append(t[COMBINE_ROUND_SUMMED] - t[COMBINE_LOADS_ISSUED])
            out["    combine: first round summed -> combined"].append(t[PARTS_COMBINED] - t[COMBINE_ROUND_SUMMED])
        if have(LAST_PV_DONE, PART_TICKETED):
            out["  split: last P V done -> ticket drawn"].append(t[PART_TICKETED] - t[LAST_PV_DONE])
        if have(TILE_START, Q_READY):
            out["announcement read -> Q landed"].append(t[Q_READY] - t[TILE_START])
        nxt = tiles[i + 1] if i + 1 < len(tiles) else None
        landed = Q_READY if nxt is not None and Q_READY in nxt else TILE_START
        if nxt is not None and EPILOGUE_DONE in t and landed in nxt:
            out["epilogue done -> next tile's Q landed"].append(nxt[landed] - t[EPILOGUE_DONE])
        if nxt is not None and LAST_PV_DONE in t and FIRST_S_READY in nxt:
            out["boundary (last P V done -> next S ready)"].append(nxt[FIRST_S_READY] - t[LAST_PV_DONE])
        if nxt is not None and LAST_PV_DONE in t and LAST_PV_DONE in nxt:
            period = nxt[LAST_PV_DONE] - t[LAST_PV_DONE]
            # Every period with the blocks of the tile it ends, for the fit of main(): tiles of
            # many lengths (causal masks, tail shares) give each block's and each tile's cost.
            out["periods by blocks"].append((nxt["blocks"], period))
            if nxt["blocks"] == t["blocks"]:
                # A tile's whole period, and its blocks, for the loop's share of it (main()).
                out["tile period (last P V to last P V)"].append(period)
                out["blocks per tile"].append(nxt["blocks"])
    return out


def period_fit(pairs):
    """Least squares of a tile's period on its block count, over (blocks, cycles) pairs: (cycles per
    block, cycles per tile beyond its blocks), or None where the tiles are of fewer than two lengths."""
    if len({b for b, _ in pairs}) < 2:
        return None
    mean_b = statistics.fmean(b for b, _ in pairs)
    mean_c = statistics.fmean(c for _, c in pairs)
    var = sum((b - mean_b) ** 2 for b, _ in pairs)
    slope = sum((b - mean_b) * (c - mean_c) for b, c in pairs) / var
    return slope, mean_c - slope * mean_b


def print_period_fit(pairs):
    """A tile's cost as per-block and per-tile parts, fitted over its tiles of every length, and the
    median period at a few lengths against the fit: a per-tile cost that the short tiles of a causal
    launch pay more often than a full mask's long ones (the boundary, the masked diagonal block)."""
    fit = period_fit(pairs)
    if fit is None:
        return
    per_block, per_tile = fit
    if per_block <= 0:  # periods that do not grow with the blocks: no step to count in
        print(f"  {'period fit over tile lengths':<44} {per_block:9.0f} cycles per block: no fit ({len(pairs)} periods)")
        return
    print(f"  {'period fit over tile lengths':<44} {per_block:9.0f} cycles per block + {per_tile:.0f} per tile"
          f" ({per_tile / per_block:.2f} blocks; {len(pairs)} periods)")
    by_len = collections.defaultdict(list)
    for b, c in pairs:
        by_len[b].append(c)
    lengths = sorted(by_len)
    shown = sorted({lengths[round(q * (len(lengths) - 1))] for q in (0, 0.1, 0.25, 0.5, 0.75, 1)})
    for b in shown:
        med = statistics.median(by_len[b])
        print(f"    {b:4d} blocks: median {med:9.0f} cycles over {len(by_len[b]):5d}, "
              f"{(med - per_block * b) / per_block:+.2f} blocks beyond its blocks at the fitted step")


def producer_parts(stamps):
    """The producer's wait for each Q buffer and the gap from a tile's last load to the next Q issue."""
    out = collections.defaultdict(list)
    wait_start = last_load = None
    for clock, event, _tile, _blocks in stamps:
        if event == Q_WAIT_START:
            wait_start = clock
        elif event == Q_ISSUED and wait_start is not None:
            out["producer: Q buffer wait"].append(clock - wait_start)
            if last_load is not None:
                out["producer: last K/V issued -> next Q issued"].append(clock - last_load)
            wait_start = None
        elif event == LAST_LOAD_ISSUED:
            last_load = clock
    return out


def timeline(stamps):
    """Each role's events around a tile boundary, as offsets from the nearest of warpgroup 0's
    "last P V done" stamps on the same SM (negative: before it; the first of each (role, event) per
    boundary): {name: [cycles]}."""
    out = collections.defaultdict(list)
    for sm in {sm for sm, _ in stamps}:
        events = sorted((clock, role, event) for (s, role), v in stamps.items() if s == sm
                        for clock, event, _tile, _blocks in v)
        anchors = [clock for clock, role, event in events if role == 0 and event == LAST_PV_DONE]
        if not anchors:
            continue
        # Stamps further than half a tile from every anchor (a CTA's first tile) belong to none.
        reach = statistics.median(b - a for a, b in zip(anchors, anchors[1:])) / 2 if len(anchors) > 1 else math.inf
        seen = set()
        for clock, role, event in events:
            i = bisect.bisect_left(anchors, clock)
            near = min((j for j in (i - 1, i) if 0 <= j < len(anchors)), key=lambda j: abs(anchors[j] - clock))
            if (near, role, event) in seen or (role == 0 and event == LAST_PV_DONE) or abs(clock - anchors[near]) > reach:
                continue
            seen.add((near, role, event))
            who = "producer" if role == PRODUCER else f"warpgroup {role}"
            out[f"{who}: {NAMES.get(event, event)}"].append(clock - anchors[near])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--launch", type=int, default=None, help="launch index in the file (default: the last)")
    args = ap.parse_args()
    launch, stamps = read(args.trace, args.launch)
    by_role = collections.defaultdict(lambda: collections.defaultdict(list))
    tile_count = collections.Counter()
    for (sm, role), v in stamps.items():
        if role == PRODUCER:
            parts = producer_parts(v)
        else:
            tiles = consumer_tiles(v)
            tile_count[role] += len(tiles)
            parts = parts_of(tiles)
        for name, values in parts.items():
            by_role[role][name] += values
    sms = len({sm for sm, _ in stamps})
    print(f"launch {launch}: {sms} SMs, tiles per consumer warpgroup {dict(sorted(tile_count.items()))}")
    for role in sorted(by_role):
        parts = by_role[role]
        step = statistics.median(parts["KV step in the loop"]) if parts.get("KV step in the loop") else None
        print("producer" if role == PRODUCER else f"consumer warpgroup {role}")
        blocks = parts.pop("blocks per tile", None)
        periods = parts.pop("periods by blocks", None)
        for name, values in parts.items():
            med = statistics.median(values)
            in_steps = f"  ({med / step:.2f} steps)" if step and name != "KV step in the loop" else ""
            print(f"  {name:<44} median {med:9.0f} cycles over {len(values):6d}{in_steps}")
        if step and blocks and parts.get("tile period (last P V to last P V)"):
            # What a tile costs beyond its blocks at the loop's pace: the boundary, plus any
            # block the loop runs slower than its median (a masked or partial one).
            period, count = statistics.median(parts["tile period (last P V to last P V)"]), statistics.median(blocks)
            print(f"  {'period beyond its blocks at the loop step':<44} median {period - count * step:9.0f} cycles"
                  f" ({count:.0f} blocks of {step:.0f}; the loop's share {count * step / period:.1%})")
        if periods:
            print_period_fit(periods)
    if not by_role:
        sys.exit("no tiles in the launch")
    print("the boundary, cycles after warpgroup 0's last P V done (median, p10-p90)")
    for name, v in sorted(timeline(stamps).items(), key=lambda kv: statistics.median(kv[1])):
        v = sorted(v)
        print(f"  {name:<44} {statistics.median(v):8.0f}  ({v[len(v) // 10]}-{v[9 * len(v) // 10]}, {len(v)})")


if __name__ == "__main__":
    main()
