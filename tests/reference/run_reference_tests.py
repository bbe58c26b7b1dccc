#!/usr/bin/python3
"""Run the C++ trainer with --dump-reference on small configs and check each
dump against the independent PyTorch reference (compare.py).

usage: run_reference_tests.py --trainer BIN --source SRC --workdir WORK [--only NAME ...]

Prints compare.py's measurements per config and ends with `N passed, M failed`.
"""
import argparse
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# Small enough to run in seconds on a CPU, big enough that every code path
# matters: GQA (4 query heads on 2 kv heads), M = global/micro = 2 micro-batches
# of gradient accumulation, warmup + decay, clipping, weight decay.
COMMON_TRAIN = {
    "steps": 20,
    "seq_len": 16,
    "micro_batch_size": 2,
    "global_batch_size": 4,
    "grad_clip": 1.0,
}

CONFIGS = {
    # Llama 3.1's RoPE scaling with a pretraining context of 16 (D = 8: pair 0
    # on the ramp, pairs 1-3 divided by the factor) and q/k/v/o biases; the
    # MoE case keeps plain RoPE and no biases.
    "llama_dense": {
        "model": {"arch": "llama", "vocab_size": 256, "d_model": 32, "n_layers": 2,
                  "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 16, "attn_bias": "qkvo",
                  "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_seq_len": 16}},
        "optim": {"lr": 1e-2, "warmup_steps": 3, "schedule": "cosine", "weight_decay": 0.1},
    },
    # Tied embeddings (auto for gpt2), LayerNorm, biases, learned positions;
    # max_seq_len > seq_len leaves pos_embed rows that only weight decay moves.
    # init_std 0.1 puts GELU inputs at O(1): at the default 0.02 they are so
    # small that gelu_tanh and erf-GELU agree to ~1e-7 and a mix-up would pass.
    "gpt2_dense": {
        "model": {"arch": "gpt2", "vocab_size": 256, "d_model": 32, "n_layers": 2,
                  "n_heads": 4, "max_seq_len": 32, "tie_embeddings": "auto", "init_std": 0.1},
        "optim": {"lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 3, "schedule": "linear",
                  "weight_decay": 0.1},
    },
    # capacity_factor 1.0 with top_k 2 of 4 experts: capacity = N*K/E, so any
    # imbalance drops assignments and the k-major admission order matters.
    # init_std 0.1 spreads the router logits so fewer decisions are near-ties.
    "llama_moe": {
        "model": {"arch": "llama", "vocab_size": 256, "d_model": 32, "n_layers": 2,
                  "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 16, "init_std": 0.1,
                  "moe": {"num_experts": 4, "top_k": 2, "every": 1, "capacity_factor": 1.0,
                          "aux_loss_coeff": 0.01, "d_ff": 64, "normalize_topk": True}},
        "optim": {"lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 3, "schedule": "cosine",
                  "weight_decay": 0.1},
    },
    # Sliding-window attention: each query sees itself and the 5 keys before
    # it, well inside the 16-token sequence.
    "llama_window": {
        "model": {"arch": "llama", "vocab_size": 256, "d_model": 32, "n_layers": 2,
                  "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 16, "sliding_window": 5},
        "optim": {"lr": 1e-2, "warmup_steps": 3, "schedule": "cosine", "weight_decay": 0.1},
    },
}


def yaml_scalar(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(yaml_scalar(x) for x in v) + "]"
    s = str(v)
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_yaml(d, indent=0):
    lines = []
    for k, v in d.items():
        if isinstance(v, dict):
            lines.append(" " * indent + f"{k}:")
            lines.append(to_yaml(v, indent + 2))
        else:
            lines.append(" " * indent + f"{k}: {yaml_scalar(v)}")
    return "\n".join(lines)


def make_config(name, workdir, tokens_path, device="cpu"):
    spec = CONFIGS[name]
    return {
        "run": {"name": f"reference_{name}", "dir": os.path.join(workdir, name, "run"), "seed": 1234},
        "model": dict(spec["model"]),
        # fp32 on purpose: the tolerances are for float32 arithmetic.
        "train": dict(COMMON_TRAIN, device=device, precision="fp32"),
        "optim": dict(spec["optim"]),
        "data": {"train": [tokens_path], "dtype": "uint16"},
        "log": {"interval": 1, "progress": "lines"},
    }


def write_tokens(path, vocab_size):
    """uint16 tokens: bytes of a fixed text (real text gives a learnable signal)."""
    src = "/usr/share/common-licenses/GPL-3"
    if os.path.exists(src):
        with open(src, "rb") as f:
            raw = f.read()
    else:
        # Deterministic fallback so the test never depends on the host's files.
        raw = bytes((i * 2654435761 >> 13) % 251 for i in range(40000))
    import numpy as np
    tokens = (np.frombuffer(raw, dtype=np.uint8).astype(np.uint16) % vocab_size).astype("<u2")
    tokens.tofile(path)
    return len(tokens)


def tail(text, n=4000):
    return text if len(text) <= n else "...\n" + text[-n:]


def run_one(name, args, compare_py, tokens_path):
    work = os.path.join(args.workdir, name)
    dump = os.path.join(work, "dump")
    # Stale dumps from an earlier run must never be compared by mistake.
    if os.path.isdir(work):
        shutil.rmtree(work)
    os.makedirs(work)
    cfg_path = os.path.join(work, "config.yaml")
    with open(cfg_path, "w") as f:
        f.write(to_yaml(make_config(name, args.workdir, tokens_path, args.device)) + "\n")

    cmd = [args.trainer, "--config", cfg_path, "--dump-reference", dump]
    print(f"=== {name}: {' '.join(cmd)}", flush=True)
    try:
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as e:
        print(f"trainer timed out after {args.timeout}s")
        print(tail((e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")))
        return False
    except OSError as e:
        print(f"cannot run trainer: {e}")
        return False
    if proc.returncode != 0:
        print(f"trainer failed with exit code {proc.returncode}; stderr:")
        print(tail(proc.stderr) or "(empty)")
        print("stdout tail:")
        print(tail(proc.stdout, 1500) or "(empty)")
        return False

    result = subprocess.run([sys.executable, compare_py, dump], capture_output=True, text=True)
    sys.stdout.write(result.stdout)
    if result.stderr:
        sys.stdout.write(result.stderr)
    ok = result.returncode == 0
    print(f"=== {name}: {'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainer", required=True, help="trainer binary")
    ap.add_argument("--source", default=os.path.dirname(os.path.dirname(HERE)),
                    help="source tree root (compare.py is taken from SRC/tests/reference)")
    ap.add_argument("--workdir", required=True, help="scratch directory (per-config subfolders are replaced)")
    ap.add_argument("--only", nargs="*", choices=sorted(CONFIGS), help="run only these configs")
    ap.add_argument("--device", default="cpu", help="train.device for the trainer (default cpu)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per trainer run")
    args = ap.parse_args(argv)

    compare_py = os.path.join(args.source, "tests", "reference", "compare.py")
    if not os.path.exists(compare_py):
        compare_py = os.path.join(HERE, "compare.py")
    args.trainer = os.path.abspath(args.trainer)
    args.workdir = os.path.abspath(args.workdir)
    os.makedirs(args.workdir, exist_ok=True)
    vocab = {CONFIGS[n]["model"]["vocab_size"] for n in CONFIGS}
    tokens_path = os.path.join(args.workdir, "tokens.bin")
    n_tokens = write_tokens(tokens_path, min(vocab))
    print(f"tokens: {tokens_path} ({n_tokens} uint16 tokens)")

    names = args.only or list(CONFIGS)
    passed = failed = 0
    for name in names:
        if run_one(name, args, compare_py, tokens_path):
            passed += 1
        else:
            failed += 1
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
