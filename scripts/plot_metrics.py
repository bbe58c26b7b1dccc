#!/usr/bin/python3
"""Plot one or more metrics.jsonl files (loss, val loss, lr, grad norm, tokens/s) into a PNG.

usage: plot_metrics.py runs/a/metrics.jsonl [runs/b/metrics.jsonl ...] -o curves.png
Each file becomes one labelled line per panel (label: the run directory name).
Uses Debian's python3-matplotlib (installed by scripts/setup.sh).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only: works without a display
import matplotlib.pyplot as plt  # noqa: E402

PANELS = [("loss", "loss (train, and val dashed)"), ("lr", "learning rate"),
          ("grad_norm", "gradient norm"), ("tokens_per_s", "tokens / s")]


def read(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not a JSON line ({e.msg})")
    if not rows:
        sys.exit(f"{path}: no metrics rows")
    return rows


def series(rows, key):
    pts = [(r["step"], r[key]) for r in rows if key in r and r[key] is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("-o", "--output", default="metrics.png")
    a = ap.parse_args()
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for path in a.files:
        rows = read(path)
        label = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
        for ax, (key, title) in zip(axes.flat, PANELS):
            x, y = series(rows, key)
            line, = ax.plot(x, y, label=label)
            if key == "loss":
                vx, vy = series(rows, "val_loss")
                if vx:
                    ax.plot(vx, vy, "--o", color=line.get_color(), markersize=3, label=f"{label} val")
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
    axes.flat[0].legend()
    axes.flat[2].set_yscale("log")
    fig.tight_layout()
    fig.savefig(a.output, dpi=100)
    print(f"plot_metrics: wrote {a.output}")


if __name__ == "__main__":
    main()
