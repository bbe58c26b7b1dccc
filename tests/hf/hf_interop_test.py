#!/usr/bin/env python3
"""Hugging Face interoperability against the real client (transformers).

For a llama with grouped-query attention, a tied gpt2 and a Mixtral-style MoE:
  1. train a few steps, `trainer export`, load the directory with
     AutoModelForCausalLM.from_pretrained and compare its logits on the
     trainer's own batch with the trainer's logits (the dump of a run started
     from the exported directory with model.init_from): rel 1e-4, fp32;
  2. export -> init_from -> export gives identical tensors, in one process and
     from a tp 2 x dp 2 ZeRO-3 checkpoint (4 processes);
  3. bf16 export equals the fp32 tensors rounded to bf16; a sharded export
     (index.json) loads and holds the same tensors;
  4. a model transformers initialised and saved (save_pretrained) trains here
     with transformers' step-0 loss (rel 1e-5) and logits (rel 1e-4);
  5. the data's SentencePiece tokenizer is exported with it and AutoTokenizer
     encodes a text as SentencePiece does.
Then bad inputs: unknown architecture, missing tensor, wrong shape, a model
without a Hugging Face twin, an existing output directory.

Usage: hf_interop_test.py TRAINER SOURCE_DIR WORK_DIR. Exit 77 when
transformers cannot be imported (ctest: skipped).
"""
import json
import os
import random
import shutil
import socket
import subprocess
import time
import sys
import tempfile

try:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
except ImportError as e:  # the package comes from PyPI (scripts/setup.sh)
    print(f"hf_interop_test: skipped: {e}")
    sys.exit(77)

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
TRAINER, SRC, WORK = sys.argv[1:4]
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def run(args, env_extra=None, expect=0):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.update(env_extra or {})
    p = subprocess.run([TRAINER] + args, capture_output=True, text=True, env=env)
    if expect is not None and p.returncode != expect:
        print(p.stdout[-3000:], p.stderr[-3000:])
        raise SystemExit(f"trainer {' '.join(args)}: exit {p.returncode}, expected {expect}")
    return p


def free_port():
    # Outside Linux's ephemeral range (from 32768), where any concurrent test's
    # outgoing connection or Gloo listener could take the port before rank 0's
    # store binds it; random so parallel tests rarely pick the same one.
    rng = random.Random(os.getpid() ^ time.time_ns())
    for _ in range(2000):
        port = rng.randrange(20001, 32001)
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
    raise SystemExit("no free port in 20001..32000")


def run_ranks(world, args, timeout_s=300):
    port = free_port()
    procs, logs = [], []
    for r in range(world):
        # As torchrun's c10d rendezvous does: the store takes the port found free.
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="False",
                   OMP_NUM_THREADS="1")
        # Files, not pipes: a rank must never block on output nobody reads yet.
        logs.append(tempfile.TemporaryFile(mode="w+"))
        procs.append(subprocess.Popen([TRAINER] + args, stdout=logs[-1], stderr=subprocess.STDOUT, text=True, env=env))
    # One rank failing leaves the others waiting for it until parallel.timeout_s:
    # stop them at once, as a launcher would, so the failure is reported now.
    deadline = time.monotonic() + timeout_s
    failed = None
    while any(p.poll() is None for p in procs) and failed is None and time.monotonic() < deadline:
        failed = next((r for r, p in enumerate(procs) if p.poll() not in (None, 0)), None)
        time.sleep(0.1)
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()
    first = [failed] if failed is not None else []
    for r in first + [r for r in range(world) if r not in first]:  # the rank that failed speaks first
        p = procs[r]
        if p.returncode != 0:
            logs[r].seek(0)
            print(logs[r].read()[-3000:])
            raise SystemExit(f"rank {r} of {world}: exit {p.returncode}"
                             + (f" (the ranks ran past {timeout_s} s)" if failed is None else ""))


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


MODELS = {
    "llama": "{arch: llama, vocab_size: 256, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, "
             "max_seq_len: 32}",
    "gpt2": "{arch: gpt2, vocab_size: 256, d_model: 32, n_layers: 2, n_heads: 4, max_seq_len: 32, tie_embeddings: true}",
    "mixtral": "{arch: llama, vocab_size: 256, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, max_seq_len: 32, "
               "moe: {num_experts: 4, top_k: 2, d_ff: 32}}",
}


def write_config(path, model, tokens, steps, extra=""):
    with open(path, "w") as f:
        f.write(f"model: {model}\n"
                f"train: {{device: cpu, steps: {steps}, seq_len: 32, micro_batch_size: 2, global_batch_size: 4}}\n"
                "optim: {lr: 3.0e-3, warmup_steps: 0}\n"
                f"data: {{train: [{tokens}]}}\n"
                f"checkpoint: {{interval: {steps}}}\n"
                "log: {interval: 1, progress: lines}\n" + extra)


def hf_logits_vs_dump(hf_dir, dump, label):
    """The Hugging Face model's logits and loss on the dump's first step."""
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    model.eval()
    batches = load_file(os.path.join(dump, "batches.safetensors"))
    inputs, targets = batches["inputs"][0].long(), batches["targets"][0].long()  # [micro, B, T]
    ours = load_file(os.path.join(dump, "step0.safetensors"))["logits"]
    with torch.no_grad():
        logits = [model(input_ids=inputs[m]).logits.float() for m in range(inputs.shape[0])]
    theirs = logits[0].reshape(-1, logits[0].shape[-1])
    err = rel(theirs, ours)
    check(err < 1e-4, f"{label}: transformers logits vs the trainer's: rel {err:.2e} (tol 1e-4)")
    ce = torch.nn.functional.cross_entropy
    loss = torch.stack([ce(logits[m].reshape(-1, logits[m].shape[-1]), targets[m].reshape(-1))
                        for m in range(len(logits))]).mean()
    with open(os.path.join(dump, "losses.json")) as f:
        step0 = json.load(f)["lm_loss"][0]
    lerr = abs(float(loss) - step0) / abs(step0)
    check(lerr < 1e-5, f"{label}: step-0 loss {step0:.7f} vs transformers {float(loss):.7f}: rel {lerr:.2e} (tol 1e-5)")


def tensors_of(hf_dir):
    out = {}
    for name in sorted(os.listdir(hf_dir)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(hf_dir, name)))
    return out


def same_tensors(a, b, label):
    ta, tb = tensors_of(a), tensors_of(b)
    differ = [n for n in ta if n not in tb or ta[n].dtype != tb[n].dtype or not torch.equal(ta[n], tb[n])]
    check(set(ta) == set(tb) and not differ,
          f"{label}: {len(ta)} tensors, {len(differ)} differ, names equal: {set(ta) == set(tb)} (want identical)")


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    text = open("/usr/share/common-licenses/GPL-3", "rb").read()
    tokens = os.path.join(WORK, "tokens.bin")
    torch.tensor(list(text), dtype=torch.int16).numpy().tofile(tokens)  # bytes < 256: uint16 == int16
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")

    for name, model in MODELS.items():
        d = os.path.join(WORK, name)
        os.makedirs(d)
        cfg = os.path.join(d, "run.yaml")
        write_config(cfg, model, tokens, 6)
        run(["--config", cfg, "--set", f"run.dir={d}/train"])
        exported = f"{d}/hf"
        out = run(["export", "--checkpoint", f"{d}/train/ckpt", "--out", exported]).stdout
        print(out.strip())
        cj = json.load(open(f"{exported}/config.json"))
        check(cj["architectures"] == [{"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel",
                                        "mixtral": "MixtralForCausalLM"}[name]], f"{name}: config.json architectures")
        # The trainer's own logits from the exported directory (model.init_from
        # and the reference dump of step 0), against transformers'.
        run(["--config", cfg, "--set", f"run.dir={d}/from_hf", "--set", f"model.init_from={exported}",
             "--set", "train.steps=1", "--set", "checkpoint.interval=0", "--dump-reference", f"{d}/dump"])
        hf_logits_vs_dump(exported, f"{d}/dump", f"{name} trained 6 steps, exported")
        # export -> init_from -> export. A learning rate of 1e-30 moves no
        # weight by an ulp (AdamW's step is lr x O(1)), so the step-1
        # checkpoint holds exactly the imported weights.
        frozen = ["--set", f"model.init_from={exported}", "--set", "train.steps=1", "--set", "optim.lr=1e-30",
                  "--set", "checkpoint.interval=1"]
        run(["--config", cfg, "--set", f"run.dir={d}/again"] + frozen)
        run(["export", "--checkpoint", f"{d}/again/ckpt", "--out", f"{d}/hf_again"])
        same_tensors(exported, f"{d}/hf_again", f"{name}: export -> init_from -> export")
        if name == "llama":
            # The same through a tp 2 x dp 2 ZeRO-3 checkpoint of 4 processes.
            run_ranks(4, ["--config", cfg, "--set", f"run.dir={d}/sharded", "--set", "parallel.tp=2",
                          "--set", "parallel.zero_stage=3"] + frozen)
            meta = json.load(open(f"{d}/sharded/ckpt/step_00000001/manifest.json"))
            run(["export", "--checkpoint", f"{d}/sharded/ckpt", "--out", f"{d}/hf_sharded"])
            same_tensors(exported, f"{d}/hf_sharded",
                         f"llama: export of a {meta.get('layout', '?')} checkpoint == export of one process")
            # bf16 and sharded files.
            run(["export", "--checkpoint", f"{d}/train/ckpt", "--out", f"{d}/hf_bf16", "--dtype", "bf16"])
            t32, t16 = tensors_of(exported), tensors_of(f"{d}/hf_bf16")
            bad = [n for n in t32 if not torch.equal(t32[n].to(torch.bfloat16), t16[n])]
            check(not bad and all(t.dtype == torch.bfloat16 for t in t16.values()),
                  f"llama: bf16 export == fp32 tensors rounded to bf16 ({len(bad)} differ)")
            transformers.AutoModelForCausalLM.from_pretrained(f"{d}/hf_bf16")
            run(["export", "--checkpoint", f"{d}/train/ckpt", "--out", f"{d}/hf_shards", "--max-shard-size", "20KB"])
            index = json.load(open(f"{d}/hf_shards/model.safetensors.index.json"))
            files = sorted(set(index["weight_map"].values()))
            check(len(files) > 1 and not os.path.exists(f"{d}/hf_shards/model.safetensors"),
                  f"llama: --max-shard-size 20KB wrote {len(files)} shards and an index")
            same_tensors(exported, f"{d}/hf_shards", "llama: sharded export")
            model_s = transformers.AutoModelForCausalLM.from_pretrained(f"{d}/hf_shards")
            check(sum(p.numel() for p in model_s.parameters()) > 0, "llama: transformers loads the sharded export")

    # A model transformers initialised and saved, trained here.
    hf_configs = {
        "llama": transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                          rms_norm_eps=1e-5, tie_word_embeddings=False),
        "gpt2": transformers.GPT2Config(vocab_size=256, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                                        layer_norm_epsilon=1e-5, activation_function="gelu_new"),
        "mixtral": transformers.MixtralConfig(vocab_size=256, hidden_size=32, intermediate_size=32,
                                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                              max_position_embeddings=32, rms_norm_eps=1e-5, num_local_experts=4,
                                              num_experts_per_tok=2, tie_word_embeddings=False, rope_theta=10000.0),
    }
    for name, hc in hf_configs.items():
        torch.manual_seed(0)
        m = transformers.AutoModelForCausalLM.from_config(hc)
        saved = os.path.join(WORK, f"saved_{name}")
        m.save_pretrained(saved, safe_serialization=True)
        cfg = os.path.join(WORK, f"saved_{name}.yaml")
        write_config(cfg, MODELS[name], tokens, 1)
        run(["--config", cfg, "--set", f"run.dir={WORK}/saved_{name}_run", "--set", f"model.init_from={saved}",
             "--set", "checkpoint.interval=0", "--dump-reference", f"{WORK}/saved_{name}_dump"])
        hf_logits_vs_dump(saved, f"{WORK}/saved_{name}_dump", f"{name} saved by transformers, trained here")

    # The data's SentencePiece tokenizer goes with the export, and
    # transformers' AutoTokenizer encodes as SentencePiece does.
    sp_data = os.path.join(WORK, "sp_data")
    subprocess.run(["/usr/bin/python3", os.path.join(SRC, "scripts/prepare_text.py"), "--out-dir", sp_data,
                    "--tokenizer", "sentencepiece", "--vocab-size", "400", "/usr/share/common-licenses/GPL-3"],
                   check=True, capture_output=True)
    cfg = os.path.join(WORK, "sp.yaml")
    write_config(cfg, MODELS["llama"].replace("vocab_size: 256", "vocab_size: 400"), f"{sp_data}/train.bin", 2)
    run(["--config", cfg, "--set", f"run.dir={WORK}/sp_run"])
    run(["export", "--checkpoint", f"{WORK}/sp_run/ckpt", "--out", f"{WORK}/sp_hf"])
    try:
        import sentencepiece
        sp = sentencepiece.SentencePieceProcessor(model_file=f"{sp_data}/tokenizer.model")
        tok = transformers.AutoTokenizer.from_pretrained(f"{WORK}/sp_hf", use_fast=False)
        text = open("/usr/share/common-licenses/LGPL-2.1").read()[:20000]
        a, b = tok.encode(text, add_special_tokens=False), sp.encode(text)
        check(a == b, f"SentencePiece export: AutoTokenizer ({type(tok).__name__}) encodes {len(b)} tokens of another "
                      f"text as SentencePiece does: {a == b}")
    except ImportError as e:
        check(False, f"SentencePiece export: python sentencepiece missing ({e}); scripts/setup.sh installs it")

    # Bad inputs.
    cfg = os.path.join(WORK, "llama", "run.yaml")
    good = os.path.join(WORK, "llama", "hf")

    def expect_error(label, hf_dir, code, needle, extra=()):
        p = run(["--config", cfg, "--set", f"run.dir={WORK}/bad", "--set", f"model.init_from={hf_dir}",
                 "--set", "train.steps=1"] + list(extra), expect=None)
        ok = p.returncode == code and needle in p.stderr
        check(ok, f"bad input, {label}: exit {p.returncode} (want {code}), names '{needle}'")
        if not ok:
            print(p.stderr[-2000:])

    falcon = os.path.join(WORK, "bad_arch")
    shutil.copytree(good, falcon)
    cj = json.load(open(f"{falcon}/config.json"))
    cj["architectures"] = ["FalconForCausalLM"]
    json.dump(cj, open(f"{falcon}/config.json", "w"))
    expect_error("unsupported architecture", falcon, 2, "FalconForCausalLM")
    missing = os.path.join(WORK, "bad_missing")
    shutil.copytree(good, missing)
    t = load_file(f"{missing}/model.safetensors")
    del t["model.layers.1.mlp.up_proj.weight"]
    save_file(t, f"{missing}/model.safetensors", metadata={"format": "pt"})
    expect_error("missing tensor", missing, 2, "missing tensor model.layers.1.mlp.up_proj.weight")
    reshaped = os.path.join(WORK, "bad_shape")
    shutil.copytree(good, reshaped)
    t = load_file(f"{reshaped}/model.safetensors")
    t["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(32, 32)  # GQA: [2 heads x 8, 32]
    save_file(t, f"{reshaped}/model.safetensors", metadata={"format": "pt"})
    expect_error("a tensor of the wrong shape", reshaped, 2,
                 "model.layers.0.self_attn.k_proj.weight has shape [32, 32], the model configuration needs [16, 32]")
    expect_error("config.json against the model keys", good, 2, "hidden_size=32 in config.json, model.d_model", ["--set", "model.d_model=64"])
    expect_error("not a directory", os.path.join(WORK, "nowhere"), 1, "nowhere")
    p = run(["export", "--checkpoint", f"{WORK}/llama/train/ckpt", "--out", good], expect=None)
    check(p.returncode == 1 and "exists" in p.stderr, f"export into an existing directory: exit {p.returncode}, refused")
    moe_gpt2 = os.path.join(WORK, "gpt2moe.yaml")
    write_config(moe_gpt2, "{arch: gpt2, d_model: 32, n_layers: 1, n_heads: 4, max_seq_len: 32, "
                           "moe: {num_experts: 2, top_k: 1, d_ff: 32}}", tokens, 1)
    run(["--config", moe_gpt2, "--set", f"run.dir={WORK}/gpt2moe"])
    p = run(["export", "--checkpoint", f"{WORK}/gpt2moe/ckpt", "--out", f"{WORK}/gpt2moe_hf"], expect=None)
    check(p.returncode == 2 and "GPT-2-style MoE" in p.stderr, f"export of a gpt2 MoE: exit {p.returncode}, explained")

    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all Hugging Face interoperability checks passed")


if __name__ == "__main__":
    main()
