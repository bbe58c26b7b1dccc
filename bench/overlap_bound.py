#!/usr/bin/env python3
"""Overlap against its bound, from two runs of one layout (issue 44 item 3).

  python3 bench/overlap_bound.py BASELINE_RUN_DIR OVERLAP_RUN_DIR GROUP RATE_MBIT LABEL
  python3 bench/overlap_bound.py --ring BASELINE_RUN_DIR OVERLAP_RUN_DIR LABEL

--ring (the context-parallel ring): the overlapped step against max(compute, communication),
compute the overlapped run's forward + backward + optimizer, communication the wire time of
every collective, send and receive of the baseline's timeline (each ran alone on the link there).

BASELINE_RUN_DIR: parallel.overlap false, log.trace on some steps; OVERLAP_RUN_DIR: overlap true.
Both logged every step. From the baseline's timeline (rank 0) every collective of GROUP is
classified by the compute span it was issued in (forward, backward, or outside both: the
optimizer and the end of the step), and the bound on what overlap can leave exposed is:

  gradient reductions hide behind the backward only:     max(R - B, r_last)
  ZeRO-3's gathers in the forward hide behind it:        max(Gf - F, g_first)
  gathers in the backward share the backward with R:     counted with R
  ZeRO 1-2's gathers after the update hide behind the
  next step's forward, each needed at its unit's forward: max(A - F, a_first)
  other collectives outside forward and backward:        not hidden

with R, Gf the baseline's wire times of those collectives per step, F and B its forward and
backward compute, r_last the last reduction of the step and g_first its first gather. Prints
one markdown row: the baseline's step and its communication share, the bound, the measured
exposure with overlap, their difference in points of the baseline step, and the check that a
reduction's CPU time (its bytes summed by numpy here) is under a tenth of its wire time.
"""
import json
import sys
import time


def windows(run_dir):
    rows = [json.loads(l) for l in open(f"{run_dir}/metrics.jsonl")]
    steps = [r for r in rows if "ms_per_step" in r][2:]
    times = [r for r in rows if "time_ms" in r][2:]
    return steps, times


def mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def rank0_spans(trace_path):
    """Rank 0's spans by track; sends and receives (async begin/end pairs) become spans too."""
    t = json.load(open(trace_path))
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in t["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    spans = [e for e in t["traceEvents"] if e.get("ph") == "X" and e["pid"] == 0]
    begun = {}
    for e in t["traceEvents"]:
        if e.get("pid") != 0 or e.get("ph") not in ("b", "e"):
            continue
        if e["ph"] == "b":
            begun[e["id"]] = e
        elif e["id"] in begun:
            b = begun.pop(e["id"])
            spans.append(dict(b, ph="X", dur=e["ts"] - b["ts"]))
    by_track = {}
    for e in spans:
        by_track.setdefault(names[(0, e["tid"])], []).append(e)
    return by_track


def phase_at(compute, ts):
    """The outermost forward/backward span of the compute track containing ts, else 'other'."""
    for e in compute:
        if e["cat"] in ("forward", "backward") and e["ts"] <= ts <= e["ts"] + e["dur"]:
            return e["cat"]
    return "other"


def ring(base, over, label):
    by_track = rank0_spans(f"{base}/trace.json")
    n = len([e for e in by_track["compute"] if e["cat"] == "step"])
    # In the baseline every collective, send and receive is waited for as
    # soon as it is issued: each span is its time on the link.
    wire = {t: sum(e["dur"] for e in spans) / 1e3 / n for t, spans in by_track.items()
            if t.startswith("comm ") or t.startswith("p2p ")}
    comm = sum(wire.values())
    o_steps, o_times = windows(over)
    b_steps, _ = windows(base)
    compute = mean(r["time_ms"]["forward"] + r["time_ms"]["backward"] + r["time_ms"]["optimizer"] for r in o_times)
    step_on = mean(r["ms_per_step"] for r in o_steps)
    step_off = mean(r["ms_per_step"] for r in b_steps)
    parts = ", ".join(f"{g} {ms:.0f}" for g, ms in sorted(wire.items()))
    print(f"| {label} | {step_off:.0f} | {parts} | {comm:.0f} | {compute:.0f} | {step_on:.0f} | "
          f"{step_on / max(comm, compute):.2f}x |")


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--ring":
        return ring(*sys.argv[2:])
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    base, over, group, rate_mbit, label = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
    by_track = rank0_spans(f"{base}/trace.json")
    compute = sorted(by_track["compute"], key=lambda e: e["ts"])
    steps = [e for e in compute if e["cat"] == "step"]
    n = len(steps)
    comm = sorted(by_track.get(f"comm {group}", []), key=lambda e: e["ts"])
    # The trace's collective spans of the baseline: wire time by phase and kind.
    per = {"R": 0.0, "Gf": 0.0, "A": 0.0, "other": 0.0}
    first_gather, first_after, last_reduction, biggest = {}, {}, {}, 0
    for e in comm:
        kind = e["name"].split()[0]
        phase = phase_at(compute, e["ts"])
        step = next((s["name"] for s in steps if s["ts"] <= e["ts"] <= s["ts"] + s["dur"]), None)
        ms = e["dur"] / 1e3
        if kind in ("reduce_scatter", "all_reduce") and phase != "forward" and phase != "other":
            per["R"] += ms
            last_reduction[step] = ms
            biggest = max(biggest, e.get("args", {}).get("bytes", 0))
        elif kind == "all_gather" and phase == "forward":
            per["Gf"] += ms
            first_gather.setdefault(step, ms)
        elif kind == "all_gather" and phase == "backward":
            per["R"] += ms  # re-gathers share the backward with the reductions
        elif kind == "all_gather" and phase == "other":
            per["A"] += ms  # the updated weights, needed again by the next forward
            first_after.setdefault(step, ms)
        else:
            per["other"] += ms
    per = {k: v / n for k, v in per.items()}
    r_last = mean(last_reduction.values())
    g_first = mean(first_gather.values())
    a_first = mean(first_after.values())
    b_steps, b_times = windows(base)
    o_steps, o_times = windows(over)
    F = mean(r["time_ms"]["forward"] for r in b_times)
    B = mean(r["time_ms"]["backward"] for r in b_times)
    step_off = mean(r["ms_per_step"] for r in b_steps)
    exposed_off = mean(r["time_ms"]["comm_" + group] for r in b_times)
    step_on = mean(r["ms_per_step"] for r in o_steps)
    exposed_on = mean(r["time_ms"]["comm_" + group] for r in o_times)
    bound = (max(per["R"] - B, r_last) + (max(per["Gf"] - F, g_first) if per["Gf"] > 0 else 0) +
             (max(per["A"] - F, a_first) if per["A"] > 0 else 0) + per["other"])
    points = 100 * (exposed_on - bound) / step_off
    # A reduction's CPU time: summing its bytes once (what Gloo's reduction does per chunk and hop).
    try:
        import numpy as np
        a = np.ones(max(biggest // 4, 1), dtype=np.float32)
        b = np.ones_like(a)
        t0 = time.perf_counter()
        for _ in range(5):
            a += b
        cpu_ms = (time.perf_counter() - t0) / 5 * 1e3
    except ImportError:
        cpu_ms = float("nan")
    wire_ms = biggest * 8 / (rate_mbit * 1e6) * 1e3
    print(f"| {label} | {step_off:.0f} | {exposed_off:.0f} ({100 * exposed_off / step_off:.0f}%) | "
          f"F {F:.0f}, B {B:.0f}; R {per['R']:.0f}, Gf {per['Gf']:.0f}, after the update {per['A']:.0f}, outside {per['other']:.0f} | "
          f"{bound:.0f} | {step_on:.0f} | {exposed_on:.0f} | {points:+.1f} | "
          f"{biggest / 1e6:.2f} MB: CPU {cpu_ms:.2f} ms, wire {wire_ms:.0f} ms |")


if __name__ == "__main__":
    main()
