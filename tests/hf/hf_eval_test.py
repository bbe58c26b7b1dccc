#!/usr/bin/env python3
"""Multiple-choice evaluation (trainer eval, train.eval_task) against transformers.

A tiny llama learns eight sentences by heart (a byte-level BPE tokenizer.json
trained here, the text repeated; 150 steps). The task: each sentence's first
half as the context, its own second half and three others' as the endings,
so every answer is known. Then:
  - `trainer eval` with the raw task refuses it (the binary cannot encode
    with a tokenizer.json), naming scripts/prepare_task.py;
  - with the ids prepare_task.py adds, acc and acc_norm are 1 (it learned
    them), and every example's log-likelihood of every ending equals the
    one transformers computes on `trainer export`'s directory from the same
    ids, within 1e-4 relative;
  - train.eval_task scored the task at each evaluation of the run, and its
    last acc in metrics.jsonl is the one `trainer eval` gives.

Usage: hf_eval_test.py TRAINER SOURCE_DIR WORK_DIR. Exit 77 when
transformers cannot be imported (ctest: skipped).
"""
import json
import os
import random
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_interop_test as base  # noqa: E402  (exits 77 without transformers)

torch, transformers = base.torch, base.transformers
check, run = base.check, base.run
TRAINER, SRC, WORK = base.TRAINER, base.SRC, base.WORK
SENTENCES = [
    "the quick brown fox jumps over the lazy dog near the river bank",
    "a license grants permission to copy and change the program freely",
    "seven bakers sold warm bread to the village every single morning",
    "rain fell on the old stone bridge while the train passed slowly",
    "she wrote the letter twice because the first copy got lost",
    "our small garden grows tomatoes beans and a single tall sunflower",
    "the committee voted to repaint the library in a bright shade of blue",
    "every winter the lake freezes and children skate across it for hours",
]


def write_inputs():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    os.makedirs(f"{WORK}/text")
    rng = random.Random(3)
    lines = []
    for _ in range(300):
        lines.append(rng.choice(SENTENCES) + ".")
    open(f"{WORK}/text/corpus.txt", "w").write(" ".join(lines) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([f"{WORK}/text/corpus.txt"], trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                               show_progress=False))
    tok.save(f"{WORK}/tokenizer.json")
    with open(f"{WORK}/task.jsonl", "w") as f:
        for i, s in enumerate(SENTENCES):
            words = s.split()
            ctx, true = " ".join(words[:6]), " ".join(words[6:])
            others = [" ".join(SENTENCES[(i + k) % len(SENTENCES)].split()[6:]) for k in (1, 3, 5)]
            endings = others[:i % 4] + [true] + others[i % 4:]
            f.write(json.dumps({"ctx": ctx, "endings": endings, "label": str(i % 4)}) + "\n")
    return tok


def train():
    p = subprocess.run([sys.executable, f"{SRC}/scripts/prepare_text.py", "--out-dir", f"{WORK}/data",
                        "--tokenizer-json", f"{WORK}/tokenizer.json", "--valid-fraction", "0.1",
                        f"{WORK}/text/corpus.txt"], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(p.stdout + p.stderr)
    cfg = f"{WORK}/run.yaml"
    open(cfg, "w").write(
        "model: {arch: llama, vocab_size: 320, d_model: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, max_seq_len: 64}\n"
        "train: {steps: 150, seq_len: 64, micro_batch_size: 8, global_batch_size: 8, eval_interval: 75, "
        f"eval_steps: 1, eval_task: {WORK}/task.ids.jsonl}}\n"
        "optim: {lr: 1.0e-2, warmup_steps: 10}\n"
        f"data: {{train: [{WORK}/data/train.bin], valid: [{WORK}/data/valid.bin]}}\n"
        f"checkpoint: {{interval: 150}}\nlog: {{interval: 50, progress: lines}}\nrun: {{dir: {WORK}/run}}\n")
    p = run(["--config", cfg])
    check("eval task: " in p.stdout and "task_acc" in open(f"{WORK}/run/metrics.jsonl").read(),
          "train.eval_task is read at start-up and scored at the evaluations (metrics.jsonl task_acc)")
    return [json.loads(l) for l in open(f"{WORK}/run/metrics.jsonl") if "task_acc" in l]


def transformers_loglik(model, ctx_ids, end_ids):
    ids = torch.tensor([ctx_ids + end_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
    n = len(ctx_ids)
    return sum(logp[n - 1 + k, t].item() for k, t in enumerate(end_ids))


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    write_inputs()
    p = subprocess.run([sys.executable, f"{SRC}/scripts/prepare_task.py", f"{WORK}/task.jsonl", "--tokenizer-json",
                        f"{WORK}/tokenizer.json", "--out", f"{WORK}/task.ids.jsonl"], capture_output=True, text=True)
    check(p.returncode == 0 and "8 examples" in p.stdout, "prepare_task.py adds the ids")
    logged = train()
    ckpt = f"{WORK}/run/ckpt"
    bad = run(["eval", "--checkpoint", ckpt, "--task", f"{WORK}/task.jsonl"], expect=1)
    check("scripts/prepare_task.py" in bad.stderr, "a raw task with a tokenizer.json is refused, naming prepare_task.py")
    ok = run(["eval", "--checkpoint", ckpt, "--task", f"{WORK}/task.ids.jsonl", "--scores", f"{WORK}/scores.jsonl"])
    print(ok.stdout.strip())
    check("acc 1.0000, acc_norm 1.0000" in ok.stdout, "the memorized task: acc and acc_norm 1")
    check(abs(logged[-1]["task_acc"] - 1.0) < 1e-12, f"train.eval_task's last acc ({logged[-1]['task_acc']}) is "
          "trainer eval's")
    run(["export", "--checkpoint", ckpt, "--out", f"{WORK}/hf"])
    model = transformers.AutoModelForCausalLM.from_pretrained(f"{WORK}/hf", torch_dtype=torch.float32)
    worst = 0.0
    rows = [json.loads(l) for l in open(f"{WORK}/task.ids.jsonl")]
    for row, sc in zip(rows, (json.loads(l) for l in open(f"{WORK}/scores.jsonl"))):
        for ends, ours in zip(row["endings_ids"], sc["loglik"]):
            theirs = transformers_loglik(model, row["context_ids"], ends)
            worst = max(worst, abs(ours - theirs) / max(abs(theirs), 1e-9))
    print(f"per-example log-likelihoods vs transformers: worst rel {worst:.1e} over {4 * len(rows)} endings")
    check(worst < 1e-4, f"every ending's log-likelihood equals transformers' within 1e-4 (worst {worst:.1e})")
    if base.failures:
        print(f"{len(base.failures)} check(s) failed")
        sys.exit(1)
    print("hf_eval: all checks passed")


main()
