#!/usr/bin/env python3
"""Render a window of a trainer trace (log.trace's trace.json, or `trainer schedule --trace`) to PNG.

One row per thread of every rank (compute, each group's communication, sends and receives),
spans coloured by category; a span inside another is drawn thinner on top of it, so the waits
inside a forward show as the forward's gaps. Needs matplotlib (Debian: python3-matplotlib).

  python3 scripts/trace_png.py runs/x/trace.json --out step.png [--from-ms A --to-ms B] [--step N]

--step N picks the window of rank 0's span "step N"; without a window the whole trace is drawn.
"""
import argparse
import json
import sys

COLOURS = {
    "step": "#eeeeee", "forward": "#4c78a8", "backward": "#f58518", "optimizer": "#54a24b",
    "data": "#b279a2", "checkpoint": "#9d755d", "eval": "#bab0ac", "wait": "#e45756", "comm": "#72b7b2",
    "log": "#888888",
}


def load(path):
    with open(path) as f:
        doc = json.load(f)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def rows_of(events):
    """(pid, tid) -> row label, ordered by pid then tid."""
    procs, threads = {}, {}
    for e in events:
        if e.get("ph") != "M":
            continue
        if e["name"] == "process_name":
            procs[e["pid"]] = e["args"]["name"]
        elif e["name"] == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    keys = sorted({(e["pid"], e["tid"]) for e in events if e.get("ph") in ("X", "b", "e")})
    return [(k, f"{procs.get(k[0], k[0])}: {threads.get(k, k[1])}") for k in keys]


def spans_of(events):
    """Complete spans, plus async b/e pairs turned into spans (flagged)."""
    out, open_async = [], {}
    for e in events:
        ph = e.get("ph")
        if ph == "X":
            out.append((e["pid"], e["tid"], e["ts"], e["dur"], e.get("cat", ""), e["name"], False))
        elif ph == "b":
            open_async[e["id"]] = e
        elif ph == "e" and e["id"] in open_async:
            b = open_async.pop(e["id"])
            out.append((b["pid"], b["tid"], b["ts"], e["ts"] - b["ts"], b.get("cat", ""), b["name"], True))
    return out


def depths(spans):
    """Nesting depth of each complete span within its thread."""
    depth = {}
    by_thread = {}
    for i, s in enumerate(spans):
        by_thread.setdefault((s[0], s[1]), []).append(i)
    for idx in by_thread.values():
        idx.sort(key=lambda i: (spans[i][2], -spans[i][3]))
        stack = []
        for i in idx:
            while stack and spans[stack[-1]][2] + spans[stack[-1]][3] <= spans[i][2]:
                stack.pop()
            depth[i] = 0 if spans[i][6] else len(stack)
            if not spans[i][6]:
                stack.append(i)
    return depth


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--out", required=True)
    ap.add_argument("--from-ms", type=float)
    ap.add_argument("--to-ms", type=float)
    ap.add_argument("--step", type=int, help="draw rank 0's step N")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        sys.exit("trace_png: needs matplotlib (apt-get install python3-matplotlib)")
    events = load(a.trace)
    spans = spans_of(events)
    lo, hi = a.from_ms, a.to_ms
    if a.step is not None:
        st = [s for s in spans if s[0] == 0 and s[4] == "step" and s[5] == f"step {a.step}"]
        if not st:
            sys.exit(f"trace_png: {a.trace} has no span 'step {a.step}' on rank 0 (log.trace covers other steps)")
        lo, hi = st[0][2] / 1e3, (st[0][2] + st[0][3]) / 1e3
    if lo is None:
        lo = min(s[2] for s in spans) / 1e3
    if hi is None:
        hi = max(s[2] + s[3] for s in spans) / 1e3
    rows = rows_of(events)
    row_of = {k: i for i, (k, _) in enumerate(rows)}
    depth = depths(spans)
    fig, ax = plt.subplots(figsize=(14, 0.45 * len(rows) + 1.5))
    for i, s in enumerate(spans):
        t0, t1 = s[2] / 1e3, (s[2] + s[3]) / 1e3
        if t1 < lo or t0 > hi or (s[0], s[1]) not in row_of:
            continue
        d = depth[i]
        h = 0.8 * (0.75 ** d) if not s[6] else 0.25
        y = row_of[(s[0], s[1])] - h / 2
        ax.broken_barh([(t0, max(t1 - t0, 1e-4))], (y, h), facecolors=COLOURS.get(s[4], "#999999"),
                       edgecolor="white", linewidth=0.4, zorder=2 + d)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for _, label in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(lo, hi)
    ax.set_xlabel("ms (rank 0's clock)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()], loc="upper center",
              bbox_to_anchor=(0.5, -0.12 if len(rows) > 6 else -0.25), ncol=len(COLOURS), fontsize=8)
    ax.set_title(a.title or a.trace, fontsize=10)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"trace_png: {len(rows)} rows, {lo:.1f}-{hi:.1f} ms -> {a.out}")


if __name__ == "__main__":
    main()
