#!/usr/bin/env python3
"""The soak's table, verdict and plot (bench/soak.sh, issue 45 item 3).

  python3 bench/soak_report.py [--png FILE] [--after 2000] [--keep-last 3] [--every N] LABEL=RUN_DIR ...

Reads each run's `resources` records (log.resources_interval) from metrics.jsonl and prints one
markdown table per run (every rank's resident memory, open descriptors, threads; the run
directory's and the checkpoints' MiB), then the verdict: after step AFTER every sample of memory,
descriptors and threads within 2% of the sample at AFTER (descriptors and threads before the
last sample, which is taken while the last checkpoint is being written), and the checkpoints within keep_last + 1
checkpoints (the one being written beside the kept ones). Exit 1 when a run fails it.
"""
import argparse
import json
import sys


def load(run_dir):
    rows = []
    with open(f"{run_dir}/metrics.jsonl") as f:
        for line in f:
            j = json.loads(line)
            if "resources" in j:
                rows.append((j["step"], j["resources"]))
    return rows


def verdict(rows, after, keep_last):
    base = next(((s, r) for s, r in rows if s >= after), None)
    if base is None:
        return [f"no sample at or after step {after}"]
    failures = []
    s0, r0 = base
    end = rows[-1][0]
    for key in ("rss_mib", "open_fds", "threads"):
        for rank, v0 in enumerate(r0[key]):
            # The last sample is taken while the last step's checkpoint is written, at once, by the
            # writer's thread (with its file open): descriptors and threads are judged before it.
            judged = [r for s, r in rows if s >= s0 and (key == "rss_mib" or s < end)]
            worst = max((abs(r[key][rank] - v0) / v0 for r in judged), default=0)
            print(f"- {key} of rank {rank}: {v0} at step {s0}, at most {100 * worst:.2f}% away after it "
                  f"(bound 2%)")
            if worst > 0.02:
                failures.append(f"{key} of rank {rank} moved {100 * worst:.2f}% after step {s0}")
    one = next((r["checkpoints_mib"] for s, r in rows if r["checkpoints_mib"] > 0), 0)
    most = max(r["checkpoints_mib"] for s, r in rows)
    print(f"- checkpoints: at most {most:.2f} MiB, one checkpoint {one:.2f} MiB, bound "
          f"{(keep_last + 1) * one:.2f} MiB (keep_last {keep_last} + the one being written)")
    if most > (keep_last + 1) * one + 1e-9:
        failures.append(f"checkpoints reached {most:.2f} MiB")
    first, last = rows[0], rows[-1]
    print(f"- the run directory: {first[1]['run_dir_mib']:.2f} MiB at step {first[0]}, {last[1]['run_dir_mib']:.2f} "
          f"at step {last[0]} (metrics.jsonl, the log and TensorBoard grow with the steps logged)")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="LABEL=RUN_DIR")
    ap.add_argument("--png")
    ap.add_argument("--after", type=int, default=2000)
    ap.add_argument("--keep-last", type=int, default=3)
    ap.add_argument("--every", type=int, default=0, help="table rows only at multiples of this step (and the last)")
    a = ap.parse_args()
    runs = [(r.split("=", 1)[0], load(r.split("=", 1)[1])) for r in a.runs]
    failed = []
    for label, rows in runs:
        ranks = len(rows[0][1]["rss_mib"]) if rows else 0
        print(f"\n### {label}\n")
        head = " | ".join(f"rank {k}: resident MiB, descriptors, threads" for k in range(ranks))
        print(f"| step | {head} | run directory MiB | checkpoints MiB |")
        print("|---:|" + "---|" * ranks + "---:|---:|")
        for step, r in rows:
            if a.every and step % a.every and step != rows[-1][0]:
                continue
            cells = " | ".join(f"{r['rss_mib'][k]:.1f}, {r['open_fds'][k]:.0f}, {r['threads'][k]:.0f}" for k in range(ranks))
            print(f"| {step} | {cells} | {r['run_dir_mib']:.2f} | {r['checkpoints_mib']:.2f} |")
        print()
        failed += [f"{label}: {f}" for f in verdict(rows, a.after, a.keep_last)]
    if a.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(2, 2, figsize=(11, 7))
        for ax, key, title in zip(axes.flat, ("rss_mib", "open_fds", "threads", "checkpoints_mib"),
                                  ("resident memory, MiB", "open file descriptors", "threads", "checkpoints, MiB")):
            for label, rows in runs:
                steps = [s for s, _ in rows]
                if key == "checkpoints_mib":
                    ax.plot(steps, [r[key] for _, r in rows], label=label)
                else:
                    for k in range(len(rows[0][1][key])):
                        ax.plot(steps, [r[key][k] for _, r in rows], label=f"{label}, rank {k}")
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.axvline(a.after, color="grey", lw=0.5)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(a.png, dpi=90)
        print(f"plot: {a.png}")
    if failed:
        print("soak: FAILED: " + "; ".join(failed))
        sys.exit(1)
    print("soak: every run stays within its bounds after step", a.after)


if __name__ == "__main__":
    main()
