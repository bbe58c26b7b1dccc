#!/usr/bin/env python3
"""TensorBoard's own reader on the trainer's event files (log.tensorboard).

tests/test_tensorboard.cpp checks the files with a reader written from the
format description; this one loads them with the `tensorboard` package
(installed from PyPI into .venv-tensorboard by scripts/setup.sh when it can
be) and compares every scalar with metrics.jsonl. Without the package it
exits 77, which ctest reports as skipped, saying why.

usage: tensorboard_reader_test.py TRAINER SOURCE_DIR WORK_DIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except Exception as e:  # noqa: BLE001 - any import failure means "not available"
    print(f"tensorboard_reader: skipped: the tensorboard package cannot be imported by {sys.executable} ({e}); "
          "scripts/setup.sh installs it into .venv-tensorboard when PyPI is reachable")
    sys.exit(77)

trainer, source, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)

# Byte tokens of a license text, as uint16.
with open("/usr/share/common-licenses/GPL-3", "rb") as f:
    text = f.read()
tokens = os.path.join(work, "tokens.bin")
with open(tokens, "wb") as f:
    f.write(struct.pack(f"<{len(text)}H", *text))

run_dir = os.path.join(work, "run")
cmd = [trainer, "--config", os.path.join(source, "configs/tiny.yaml"),
       "--set", "train.steps=12", "--set", "train.eval_interval=6", "--set", "log.interval=3",
       "--set", "log.tensorboard=true", "--set", f"run.dir={run_dir}", "--set", "train.device=cpu",
       "--set", f"data.train={tokens}", "--set", f"data.valid={tokens}", "--set", "log.progress=lines"]
subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)

steps, evals, times = [], [], []
with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    for line in f:
        j = json.loads(line)
        if "val_loss" in j:
            evals.append(j)
        elif "loss" in j:  # time_ms and expert-load records share the file
            steps.append(j)
        elif "time_ms" in j:
            times.append(j)

acc = EventAccumulator(os.path.join(run_dir, "tensorboard"))
acc.Reload()
tags = acc.Tags()["scalars"]
want_tags = {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/tflops_per_device", "val/loss"}
# Each logged window's time per step: its parts, and each group's exposed and
# busy communication (observe/step_time.h step_time_scalars).
want_tags |= {f"time/{p}_ms" for p in ("forward", "backward", "optimizer", "data", "checkpoint", "other")}
want_tags |= {f"comm/{g}_{k}_ms" for g in times[0]["comm_busy_ms"] for k in ("exposed", "busy")}
if set(tags) != want_tags:
    sys.exit(f"tensorboard_reader: tags {sorted(tags)}, expected {sorted(want_tags)}")


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


compared = 0
for tag, rows, key in [("train/loss", steps, "loss"), ("train/lr", steps, "lr"),
                       ("train/grad_norm", steps, "grad_norm"), ("train/tokens_per_s", steps, "tokens_per_s"),
                       ("train/tflops_per_device", steps, "tflops_per_device"), ("val/loss", evals, "val_loss")]:
    got = [(e.step, e.value) for e in acc.Scalars(tag)]
    want = [(r["step"], f32(r[key])) for r in rows]
    if got != want:
        sys.exit(f"tensorboard_reader: {tag}: tensorboard read {got}, metrics.jsonl has {want}")
    compared += len(got)
for tag in sorted(t for t in want_tags if t.startswith(("time/", "comm/"))):
    name = tag.split("/", 1)[1][:-3]
    if tag.startswith("time/"):
        want = [(r["step"], r["time_ms"][name]) for r in times]
    elif name.endswith("_exposed"):
        want = [(r["step"], r["time_ms"]["comm_" + name[:-8]]) for r in times]
    else:
        want = [(r["step"], r["comm_busy_ms"][name[:-5]]) for r in times]
    got = [(e.step, e.value) for e in acc.Scalars(tag)]
    # metrics.jsonl keeps 4 decimals of the milliseconds.
    if [s for s, _ in got] != [s for s, _ in want] or any(abs(a - b) > 6e-5 + 1e-6 * abs(b) for (_, a), (_, b) in zip(got, want)):
        sys.exit(f"tensorboard_reader: {tag}: tensorboard read {got}, metrics.jsonl has {want}")
    compared += len(got)
last = acc.Scalars("train/loss")[-1]
print(f"tensorboard_reader: tensorboard's EventAccumulator read {len(tags)} tags, {compared} scalars, all equal "
      f"to metrics.jsonl's (train/loss at step {last.step}: {last.value:.4f})")
