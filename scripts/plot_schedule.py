#!/usr/bin/env python3
"""Draws the timeline of `trainer schedule` as a PNG: one row per pipeline
rank, forwards, backwards and idle time in their own colours, micro-batch
numbers in the boxes, and the bubble in the title.

  build/trainer schedule --config run.yaml [--set ...] > schedule.txt
  /usr/bin/python3 scripts/plot_schedule.py schedule.txt schedule.png

Uses Debian's python3-matplotlib (installed by scripts/setup.sh).
"""
import re
import sys

import matplotlib

matplotlib.use("Agg")  # files only: works without a display
import matplotlib.pyplot as plt  # noqa: E402

ROW = re.compile(r"^\s*rank (\d+) \|(.*)\|\s*$")
TITLE = re.compile(r"^timeline with equal stages .*bubble ([0-9.]+%)")
COLOURS = {"F": "#4c72b0", "B": "#dd8452", "I": "#55a868", "W": "#8172b3"}


def parse(text):
    rows, bubble, header = {}, None, ""
    for line in text.splitlines():
        if line.startswith("pipeline: "):
            header = line[len("pipeline: "):]
        m = TITLE.match(line)
        if m:
            bubble = m.group(1)
        m = ROW.match(line)
        if m:
            rows[int(m.group(1))] = [c.strip() for c in m.group(2).split("|")]
    if not rows:
        raise SystemExit("plot_schedule: no 'rank N |...|' timeline rows in the input (run trainer schedule)")
    return rows, bubble, header


def main(argv):
    if len(argv) != 3:
        raise SystemExit(__doc__)
    with open(argv[1]) as f:
        rows, bubble, header = parse(f.read())
    cells = max(len(r) for r in rows.values())
    fig, ax = plt.subplots(figsize=(max(6, cells * 0.35), 0.6 * len(rows) + 1.2))
    for rank, row in rows.items():
        # A multi-unit action repeats its label in consecutive cells: draw one box.
        start = 0
        while start < len(row):
            label = row[start]
            end = start + 1
            while end < len(row) and row[end] == label and label != ".":
                end += 1
            if label != ".":
                ax.add_patch(plt.Rectangle((start, -rank - 0.4), end - start, 0.8,
                                           color=COLOURS.get(label[0], "#999999"), ec="white"))
                ax.text((start + end) / 2, -rank, label[1:], ha="center", va="center", fontsize=7, color="white")
            start = end
    ax.set_xlim(0, cells)
    ax.set_ylim(-len(rows) + 0.4, 0.6)
    ax.set_yticks([-r for r in sorted(rows)])
    ax.set_yticklabels([f"rank {r}" for r in sorted(rows)])
    ax.set_xlabel("time (forward = 1 unit)")
    ax.set_title(f"{header}  (bubble {bubble})" if bubble else header, fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    ax.legend(handles, ["forward", "backward", "input grad", "weight grad"], loc="upper right", fontsize=7,
              ncol=4, frameon=False, bbox_to_anchor=(1, 1.25))
    fig.tight_layout()
    fig.savefig(argv[2], dpi=120)
    print(f"plot_schedule: {len(rows)} ranks, {cells} time units -> {argv[2]}")


if __name__ == "__main__":
    main(sys.argv)
