#!/usr/bin/env python3
"""The table of docs/PLANNING.md "ZeRO against DeepSpeed's formulas": per-GPU
bytes of parameters + gradients + optimizer state that `trainer plan` predicts
for four models at ZeRO 0-3 over pure data parallelism, next to the ZeRO
paper's mixed-precision Adam formulas (16 Psi, 4 Psi + 12 Psi/N,
2 Psi + 14 Psi/N, 16 Psi/N). Predictions, not measurements.

  scripts/plan_zero_table.py build-cpu/trainer [--gpus 64]
"""
import argparse
import re
import subprocess
import sys

MODELS = {
    "GPT-2 124M": ["model.arch=gpt2", "model.vocab_size=50257", "model.d_model=768", "model.n_layers=12",
                   "model.n_heads=12", "model.d_ff=3072", "model.max_seq_len=1024", "train.seq_len=1024"],
    "LLaMA-7B": [],  # configs/plan_7b.yaml as it is
    "LLaMA-70B": ["model.d_model=8192", "model.n_layers=80", "model.n_heads=64", "model.n_kv_heads=8",
                  "model.d_ff=28672"],
    "Mixtral 8x7B": ["model.n_kv_heads=8", "model.d_ff=14336", "model.moe.num_experts=8", "model.moe.top_k=2"],
}
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def plan(trainer, gpus, sets):
    args = [trainer, "plan", "--config", "configs/plan_7b.yaml", "--world", str(gpus),
            "--set", "parallel.tp=1", "--set", "parallel.sp=false", "--set", f"parallel.dp={gpus}"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(args)}: {out.stderr.strip()}")
    text = out.stdout
    psi = float(re.search(r"([0-9.]+)M parameters", text).group(1)) * 1e6
    total = 0.0
    for row in ("parameters", "gradients", "optimizer"):
        m = re.search(rf"^  {row} +([0-9.]+) (B|KiB|MiB|GiB|TiB)", text, re.M)
        total += float(m.group(1)) * UNITS[m.group(2)]
    return psi, total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trainer")
    ap.add_argument("--gpus", type=int, default=64)
    a = ap.parse_args()
    n = a.gpus
    formulas = [lambda p: 16 * p, lambda p: 4 * p + 12 * p / n, lambda p: 2 * p + 14 * p / n, lambda p: 16 * p / n]
    print(f"| model | Psi | " + " | ".join(f"ZeRO {z}: plan / DeepSpeed" for z in range(4)) + " |")
    print("|---|---|" + "---|" * 4)
    for name, sets in MODELS.items():
        cells = []
        psi = 0
        for z in range(4):
            psi, got = plan(a.trainer, n, sets + [f"parallel.zero_stage={z}"])
            want = formulas[z](psi)
            cells.append(f"{got / 2**30:.2f} / {want / 2**30:.2f} GiB ({100 * (got / want - 1):+.1f}%)")
        print(f"| {name} | {psi / 1e9:.3f} B | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
