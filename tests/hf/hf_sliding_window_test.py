#!/usr/bin/env python3
"""Sliding-window attention (model.sliding_window) against transformers 4.40.

The window rule is transformers' own (its eager and sdpa masks, the paths
that run on a CPU): query i sees keys i - W .. i. Checked here on tiny models
that transformers builds and initialises itself, with a window much shorter
than the 32-token sequence:
  1. a MistralForCausalLM (sliding_window 4) saved by transformers starts a
     run here (model.init_from): the trainer's step-0 logits equal
     transformers' under both attn_implementation="eager" and "sdpa" (rel
     1e-4) and its step-0 loss (rel 1e-5); the same model without the window
     differs (so the check is not blind);
  2. the same for a MixtralForCausalLM with sliding_window 4;
  3. the same Mistral directory with model.sliding_window=0, and a Llama
     directory with model.sliding_window=4, are refused (exit 2, naming
     sliding_window): the run would train a different model;
  4. a Mistral whose window covers the sequence (sliding_window 31 = seq_len
     - 1, and the default 4096) is full causal attention: it imports into a
     model without a window and matches transformers;
  5. `trainer export` of a llama trained with model.sliding_window 4 writes a
     MistralForCausalLM with sliding_window 4 that transformers loads with
     logits equal to the trainer's; export -> init_from -> export gives
     identical tensors; a Mixtral-style MoE exports sliding_window 4; a gpt2
     with a window is refused (GPT-2 has none).

Usage: hf_sliding_window_test.py TRAINER SOURCE_DIR WORK_DIR. Exit 77 when
transformers cannot be imported (ctest: skipped).
"""
import json
import os
import shutil
import subprocess
import sys

try:
    import torch
    import transformers
    from safetensors.torch import load_file
except ImportError as e:  # the package comes from PyPI (scripts/setup.sh)
    print(f"hf_sliding_window_test: skipped: {e}")
    sys.exit(77)

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
TRAINER, SRC, WORK = sys.argv[1:4]
failures = []
SEQ = 32
WINDOW = 4

LLAMA = ("{arch: llama, vocab_size: 256, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, "
         "max_seq_len: 32%s}")
MOE = ("{arch: llama, vocab_size: 256, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, max_seq_len: 32, "
       "moe: {num_experts: 4, top_k: 2, d_ff: 32}%s}")


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def run(args, expect=0):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([TRAINER] + args, capture_output=True, text=True, env=env)
    if expect is not None and p.returncode != expect:
        print(p.stdout[-3000:], p.stderr[-3000:])
        raise SystemExit(f"trainer {' '.join(args)}: exit {p.returncode}, expected {expect}")
    return p


def window_key(w):
    return f", sliding_window: {w}" if w else ""


def write_config(path, model, tokens, steps):
    with open(path, "w") as f:
        f.write(f"model: {model}\n"
                f"train: {{device: cpu, steps: {steps}, seq_len: {SEQ}, micro_batch_size: 2, global_batch_size: 4}}\n"
                "optim: {lr: 3.0e-3, warmup_steps: 0}\n"
                f"data: {{train: [{tokens}]}}\n"
                f"checkpoint: {{interval: {steps}}}\n"
                "log: {interval: 1, progress: lines}\n")


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def trainer_step0(cfg, run_dir, hf_dir, extra=()):
    """The trainer's step-0 dump of a run started from hf_dir."""
    dump = run_dir + "_dump"
    run(["--config", cfg, "--set", f"run.dir={run_dir}", "--set", f"model.init_from={hf_dir}", "--set",
         "train.steps=1", "--set", "checkpoint.interval=0", "--dump-reference", dump] + list(extra))
    return dump


def hf_logits(hf_dir, inputs, attn, override=None):
    kw = {"attn_implementation": attn}
    if override is not None:
        kw["config"] = override
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32, **kw)
    model.eval()
    with torch.no_grad():
        return [model(input_ids=inputs[m]).logits.float() for m in range(inputs.shape[0])]


def attn_paths():
    """eager always; sdpa where transformers can run it (torch >= 2.1.1)."""
    return ("eager", "sdpa") if transformers.utils.is_torch_sdpa_available() else ("eager",)


def sdpa_mask_is_eager_mask(T, W):
    """transformers' sdpa path masks with the 4-d mask of its eager path
    (mask building only, so it runs with any torch)."""
    from transformers.modeling_attn_mask_utils import (_prepare_4d_causal_attention_mask,
                                                       _prepare_4d_causal_attention_mask_for_sdpa)
    x = torch.zeros(1, T, 8)
    eager = _prepare_4d_causal_attention_mask(None, (1, T), x, 0, sliding_window=W)[0, 0] == 0
    sdpa = _prepare_4d_causal_attention_mask_for_sdpa(None, (1, T), x, 0, sliding_window=W)
    sdpa = torch.ones(T, T).tril().bool() if sdpa is None else sdpa[0, 0] == 0  # None: plain is_causal
    i = torch.arange(T)
    ours = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] <= W)  # key j seen by query i
    return bool(torch.equal(eager, ours)), bool(torch.equal(sdpa, ours))


def compare(hf_dir, dump, label, attns=None):
    attns = attns or attn_paths()
    batches = load_file(os.path.join(dump, "batches.safetensors"))
    inputs, targets = batches["inputs"][0].long(), batches["targets"][0].long()  # [micro, B, T]
    ours = load_file(os.path.join(dump, "step0.safetensors"))["logits"]
    with open(os.path.join(dump, "losses.json")) as f:
        step0 = json.load(f)["lm_loss"][0]
    for attn in attns:
        logits = hf_logits(hf_dir, inputs, attn)
        err = rel(logits[0].reshape(-1, logits[0].shape[-1]), ours)
        check(err < 1e-4, f"{label} ({attn}): transformers logits vs the trainer's: rel {err:.2e} (tol 1e-4)")
        ce = torch.nn.functional.cross_entropy
        loss = torch.stack([ce(lg.reshape(-1, lg.shape[-1]), targets[m].reshape(-1)) for m, lg in enumerate(logits)])
        lerr = abs(float(loss.mean()) - step0) / abs(step0)
        check(lerr < 1e-5, f"{label} ({attn}): step-0 loss {step0:.7f} vs transformers {float(loss.mean()):.7f}: "
                           f"rel {lerr:.2e} (tol 1e-5)")
    return inputs, ours


def expect_refused(cfg, hf_dir, label, needle, extra=()):
    p = run(["--config", cfg, "--set", f"run.dir={WORK}/refused", "--set", f"model.init_from={hf_dir}",
             "--set", "train.steps=1"] + list(extra), expect=None)
    ok = p.returncode == 2 and needle in p.stderr
    check(ok, f"{label}: exit {p.returncode} (want 2), names '{needle}'")
    if not ok:
        print(p.stderr[-2000:])


def saved(name, config):
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(config)
    d = os.path.join(WORK, name)
    m.save_pretrained(d, safe_serialization=True)
    return d


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    text = open("/usr/share/common-licenses/GPL-3", "rb").read()
    tokens = os.path.join(WORK, "tokens.bin")
    torch.tensor(list(text), dtype=torch.int16).numpy().tofile(tokens)  # bytes < 256: uint16 == int16
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    if "sdpa" not in attn_paths():
        print(f"note: torch {torch.__version__} cannot run transformers' sdpa attention (torch >= 2.1.1): logits are "
              "compared on the eager path, and the sdpa path's mask is compared directly")
    for T, W in ((SEQ, WINDOW), (SEQ, SEQ - 1), (SEQ, SEQ), (SEQ, 100)):
        e, d = sdpa_mask_is_eager_mask(T, W)
        check(e and d, f"transformers' masks for T={T}, sliding_window={W}: eager == ours: {e}, sdpa == ours: {d} "
                       "(query i sees keys i - W .. i)")
    common = dict(vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=SEQ, rms_norm_eps=1e-5, tie_word_embeddings=False, rope_theta=10000.0)

    # 1. Mistral saved by transformers, window 4 of 32.
    mistral = saved("mistral", transformers.MistralConfig(intermediate_size=64, sliding_window=WINDOW, **common))
    cfg_w = os.path.join(WORK, "llama_w.yaml")
    write_config(cfg_w, LLAMA % window_key(WINDOW), tokens, 2)
    dump = trainer_step0(cfg_w, f"{WORK}/mistral_run", mistral)
    inputs, ours = compare(mistral, dump, f"Mistral sliding_window={WINDOW}, saved by transformers, run here")
    unwindowed = transformers.AutoConfig.from_pretrained(mistral)
    unwindowed.sliding_window = None
    full = hf_logits(mistral, inputs, "eager", unwindowed)[0].reshape(-1, ours.shape[-1])
    gap = rel(full, ours)
    check(gap > 1e-2, f"the same Mistral without its window differs from the trainer's logits: rel {gap:.2e} "
                      "(want > 1e-2: the window is what is being compared)")

    # 2. Mixtral with a window.
    mixtral = saved("mixtral", transformers.MixtralConfig(intermediate_size=32, num_local_experts=4,
                                                          num_experts_per_tok=2, sliding_window=WINDOW, **common))
    cfg_moe = os.path.join(WORK, "moe_w.yaml")
    write_config(cfg_moe, MOE % window_key(WINDOW), tokens, 2)
    dump = trainer_step0(cfg_moe, f"{WORK}/mixtral_run", mixtral)
    compare(mixtral, dump, f"Mixtral sliding_window={WINDOW}, saved by transformers, run here")

    # 3. A window the model keys do not have, and one they have but the file does not.
    cfg_plain = os.path.join(WORK, "llama.yaml")
    write_config(cfg_plain, LLAMA % "", tokens, 2)
    # The configuration writes the window it wants: a key it leaves unset would be taken from config.json.
    expect_refused(cfg_plain, mistral, "Mistral sliding_window=4 into model.sliding_window=0",
                   "sliding_window=4 in config.json (MistralForCausalLM), model.sliding_window = 0",
                   extra=("--set", "model.sliding_window=0"))
    expect_refused(cfg_moe, mixtral, "Mixtral sliding_window=4 into model.sliding_window=6",
                   "sliding_window=4 in config.json (MixtralForCausalLM), model.sliding_window = 6",
                   ["--set", "model.sliding_window=6"])
    llama = saved("llama", transformers.LlamaConfig(intermediate_size=64, **common))
    expect_refused(cfg_w, llama, "Llama (no window) into model.sliding_window=4",
                   "model.sliding_window = 4: at train.seq_len=32 they mask different keys")

    # 4. Windows that cover the sequence are full causal attention.
    for w in (SEQ - 1, None):  # None: MistralConfig's default, 4096
        kw = {} if w is None else {"sliding_window": w}
        d = saved(f"mistral_full_{w}", transformers.MistralConfig(intermediate_size=64, **kw, **common))
        if w is None:
            cj = json.load(open(f"{d}/config.json"))
            check(cj.get("sliding_window") == 4096, f"MistralConfig's default window is 4096: {cj.get('sliding_window')}")
        dump = trainer_step0(cfg_plain, f"{WORK}/mistral_full_{w}_run", d)
        compare(d, dump, f"Mistral sliding_window={w or 4096} >= seq_len - 1 into a model without a window",
                attns=("eager",))

    # 5. Export of a windowed llama and MoE; gpt2 has no window to export.
    run(["--config", cfg_w, "--set", f"run.dir={WORK}/trained"])
    exported = f"{WORK}/exported"
    run(["export", "--checkpoint", f"{WORK}/trained/ckpt", "--out", exported])
    cj = json.load(open(f"{exported}/config.json"))
    check(cj["architectures"] == ["MistralForCausalLM"] and cj.get("model_type") == "mistral" and
          cj.get("sliding_window") == WINDOW,
          f"export of a llama with sliding_window {WINDOW}: {cj['architectures']}, model_type "
          f"{cj.get('model_type')}, sliding_window {cj.get('sliding_window')}")
    dump = trainer_step0(cfg_w, f"{WORK}/exported_run", exported)
    compare(exported, dump, f"llama trained with sliding_window={WINDOW} here, exported")
    run(["--config", cfg_w, "--set", f"run.dir={WORK}/again", "--set", f"model.init_from={exported}",
         "--set", "train.steps=1", "--set", "optim.lr=1e-30", "--set", "checkpoint.interval=1"])
    run(["export", "--checkpoint", f"{WORK}/again/ckpt", "--out", f"{WORK}/exported_again"])
    a, b = load_file(f"{exported}/model.safetensors"), load_file(f"{WORK}/exported_again/model.safetensors")
    same = set(a) == set(b) and all(torch.equal(a[n], b[n]) for n in a)
    cj2 = json.load(open(f"{WORK}/exported_again/config.json"))
    check(same and cj2 == cj, f"export -> init_from -> export: {len(a)} tensors identical: {same}, config.json equal: "
                              f"{cj2 == cj}")

    run(["--config", cfg_moe, "--set", f"run.dir={WORK}/trained_moe", "--set", "train.steps=1",
         "--set", "checkpoint.interval=1"])
    run(["export", "--checkpoint", f"{WORK}/trained_moe/ckpt", "--out", f"{WORK}/exported_moe"])
    cj = json.load(open(f"{WORK}/exported_moe/config.json"))
    check(cj["architectures"] == ["MixtralForCausalLM"] and cj.get("sliding_window") == WINDOW,
          f"export of a MoE llama with sliding_window {WINDOW}: {cj['architectures']}, sliding_window "
          f"{cj.get('sliding_window')}")

    cfg_gpt2 = os.path.join(WORK, "gpt2_w.yaml")
    write_config(cfg_gpt2, "{arch: gpt2, vocab_size: 256, d_model: 32, n_layers: 1, n_heads: 4, max_seq_len: 32, "
                           f"sliding_window: {WINDOW}}}", tokens, 1)
    run(["--config", cfg_gpt2, "--set", f"run.dir={WORK}/gpt2_w"])
    p = run(["export", "--checkpoint", f"{WORK}/gpt2_w/ckpt", "--out", f"{WORK}/gpt2_w_hf"], expect=None)
    check(p.returncode == 2 and "GPT2LMHeadModel has no sliding-window attention" in p.stderr,
          f"export of a gpt2 with a window: exit {p.returncode}, explained")

    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all sliding-window Hugging Face checks passed")


if __name__ == "__main__":
    main()
