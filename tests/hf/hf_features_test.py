#!/usr/bin/env python3
"""config.json features of model.init_from against transformers' own logits.

For each feature a tiny model is built in transformers with that key
(random init, seed 0; biases, which transformers initialises to 0, drawn at
random too), saved, trained here for one step with model.init_from and
--dump-reference, and transformers' logits on the trainer's first
micro-batch compared with the trainer's (rel 1e-4, fp32). The same model
without the feature (RoPE unscaled, biases zeroed) must differ by far more,
so that each comparison can fail. Then `trainer export` of the run's
checkpoint (lr 1e-30: the weights unchanged) must write the same feature
keys back and the same tensors.
  - Llama rope_scaling linear (factor 4);
  - Llama rope_scaling llama3 (Llama 3.1's formula). transformers 4.40
    predates it (4.43 added it), so there the model is built unscaled and
    each layer's rotary inv_freq is replaced by the llama3 frequencies
    computed here, and config.json gets the rope_scaling key; a newer
    transformers builds it natively;
  - Llama attention_bias: true (q, k, v and o biases);
  - Qwen2ForCausalLM (q, k, v biases, no o bias; use_sliding_window false);
  - Mixtral router_aux_loss_coef 0.02: taken when the configuration does
    not set model.moe.aux_loss_coeff, the run's value when it does.
Then refusals: every key this trainer refuses, with a value that changes
the model, and an unknown key exit 2 naming the key and its value.

Usage: hf_features_test.py TRAINER SOURCE_DIR WORK_DIR. Exit 77 when
transformers cannot be imported (ctest: skipped).
"""
import json
import math
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_interop_test as base  # noqa: E402  (exits 77 without transformers)

torch, transformers = base.torch, base.transformers
load_file = base.load_file
check, run, rel = base.check, base.run, base.rel
WORK = base.WORK
TOL = 1e-4

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-5, rope_theta=100.0,
              tie_word_embeddings=False, initializer_range=0.2)
# The same model in our keys. theta 100 and head_dim 16: every RoPE pair
# turns noticeably within the 32 positions; initializer_range 0.2 (not 0.02)
# makes attention far from uniform: so a scaling shows in the logits.
OURS = ("{arch: llama, vocab_size: 256, d_model: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 96, "
        "max_seq_len: 32, rope_theta: 100.0%s}")
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def llama3_inv_freq(head_dim, theta, s):
    """Llama 3.1's frequencies, as transformers (>= 4.43) computes them in fp32."""
    f = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    orig, lo, hi, factor = (s["original_max_position_embeddings"], s["low_freq_factor"], s["high_freq_factor"],
                            s["factor"])
    wavelen = 2 * math.pi / f
    out = torch.where(wavelen > orig / lo, f / factor, f)
    smooth = (orig / wavelen - lo) / (hi - lo)
    mixed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < orig / hi) * ~(wavelen > orig / lo)
    return torch.where(medium, mixed, out)


def set_inv_freq(model, inv_freq):
    for layer in model.model.layers:
        layer.self_attn.rotary_emb.inv_freq = inv_freq.clone()


def randomize_biases(model):
    g = torch.Generator().manual_seed(1)
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
                n += 1
    return n


def zero_biases(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.zero_()


def logits_of(model, dump):
    """transformers' logits on the dump's first micro-batch, [B*T, V]."""
    batches = load_file(os.path.join(dump, "batches.safetensors"))
    inputs = batches["inputs"][0].long()  # [micro, B, T]
    with torch.no_grad():
        out = model(input_ids=inputs[0]).logits.float()
    return out.reshape(-1, out.shape[-1])


def compare(model, plain, dump, label, what_plain):
    """The trainer's logits against the model's, and against the model without the feature."""
    ours = load_file(os.path.join(dump, "step0.safetensors"))["logits"]
    err = rel(logits_of(model, dump), ours)
    off = rel(logits_of(plain, dump), ours)
    check(err < TOL, f"{label}: transformers logits vs the trainer's: rel {err:.2e} (tol {TOL:.0e})")
    check(off > 100 * TOL, f"{label}: {what_plain} differs from the trainer's by rel {off:.2e} (must be > "
                           f"{100 * TOL:.0e}, or the comparison above could not fail)")


def train_from(name, hf_dir, model, extra=()):
    """One step from hf_dir with the reference dump and a checkpoint of unchanged weights; returns (dump, stdout)."""
    d = os.path.join(WORK, name)
    os.makedirs(d, exist_ok=True)
    cfg = os.path.join(d, "run.yaml")
    base.write_config(cfg, model, TOKENS, 1)
    p = run(["--config", cfg, "--set", f"run.dir={d}/run", "--set", f"model.init_from={hf_dir}",
             "--set", "optim.lr=1e-30", "--set", "checkpoint.interval=1", "--dump-reference", f"{d}/dump"]
            + list(extra))
    return f"{d}/dump", p.stdout


def export_round_trip(name, hf_dir, keys):
    """`trainer export` of the run writes the feature's keys and the tensors back."""
    out = os.path.join(WORK, name, "exported")
    run(["export", "--checkpoint", os.path.join(WORK, name, "run", "ckpt"), "--out", out])
    src = json.load(open(os.path.join(hf_dir, "config.json")))
    got = json.load(open(os.path.join(out, "config.json")))
    for k in keys:
        a, b = src.get(k), got.get(k)
        if isinstance(a, dict) and isinstance(b, dict):  # "type" and "rope_type" are one key
            a = {("rope_type" if f == "type" else f): v for f, v in a.items()}
            b = {("rope_type" if f == "type" else f): v for f, v in b.items()}
        check(a == b, f"{name}: export writes {k}={json.dumps(got.get(k))} (source {json.dumps(src.get(k))})")
    base.same_tensors(hf_dir, out, f"{name}: init_from -> export")
    return out


def save(model, name):
    d = os.path.join(WORK, name + "_hf")
    model.save_pretrained(d, safe_serialization=True)
    return d


def edit_config(hf_dir, **keys):
    path = os.path.join(hf_dir, "config.json")
    cj = json.load(open(path))
    cj.update(keys)
    json.dump(cj, open(path, "w"), indent=2)


def main():
    global TOKENS
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    text = open("/usr/share/common-licenses/GPL-3", "rb").read()
    TOKENS = os.path.join(WORK, "tokens.bin")
    torch.tensor(list(text), dtype=torch.int16).numpy().tofile(TOKENS)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    head_dim = COMMON["hidden_size"] // COMMON["num_attention_heads"]

    # rope_scaling linear.
    torch.manual_seed(0)
    lin = transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON, rope_scaling={"type": "linear",
                                                                                          "factor": 4.0})).eval()
    plain = transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON)).eval()
    plain.load_state_dict(lin.state_dict())
    d = save(lin, "linear")
    dump, _ = train_from("linear", d, OURS % ", rope_scaling: {type: linear, factor: 4.0}")
    compare(lin, plain, dump, "rope_scaling linear x4", "the unscaled model")
    export_round_trip("linear", d, ["architectures", "rope_scaling", "rope_theta"])

    # rope_scaling llama3.
    torch.manual_seed(0)
    try:
        l3 = transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON, rope_scaling=dict(LLAMA3))).eval()
        how = "built by transformers itself"
    except (ValueError, KeyError) as e:
        l3 = transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON)).eval()
        set_inv_freq(l3, llama3_inv_freq(head_dim, COMMON["rope_theta"], LLAMA3))
        how = f"this transformers refuses it ({str(e)[:60]}...): unscaled model, inv_freq replaced"
    print(f"llama3 RoPE: {how}")
    plain = transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON)).eval()
    plain.load_state_dict(l3.state_dict())
    d = save(l3, "llama3")
    edit_config(d, rope_scaling=dict(LLAMA3))
    dump, _ = train_from("llama3", d, OURS % (", rope_scaling: {type: llama3, factor: 8.0, low_freq_factor: 1.0, "
                                             "high_freq_factor: 4.0, original_max_seq_len: 64}"))
    compare(l3, plain, dump, "rope_scaling llama3", "the unscaled model")
    export_round_trip("llama3", d, ["architectures", "rope_scaling", "rope_theta"])

    # Llama attention_bias: q, k, v and o biases.
    torch.manual_seed(0)
    lb = transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON, attention_bias=True)).eval()
    nb = randomize_biases(lb)
    check(nb == 8, f"llama attention_bias: {nb} bias tensors (q, k, v, o x 2 layers)")
    plain = transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON, attention_bias=True)).eval()
    plain.load_state_dict(lb.state_dict())
    zero_biases(plain)
    d = save(lb, "llama_bias")
    dump, _ = train_from("llama_bias", d, OURS % ", attn_bias: qkvo")
    compare(lb, plain, dump, "llama attention_bias true", "the model with its biases zeroed")
    export_round_trip("llama_bias", d, ["architectures", "attention_bias"])

    # Qwen2: q, k, v biases, no o bias.
    qcfg = {k: v for k, v in COMMON.items()}
    torch.manual_seed(0)
    qw = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**qcfg, use_sliding_window=False)).eval()
    nb = randomize_biases(qw)
    check(nb == 6, f"qwen2: {nb} bias tensors (q, k, v x 2 layers)")
    plain = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**qcfg, use_sliding_window=False)).eval()
    plain.load_state_dict(qw.state_dict())
    zero_biases(plain)
    d = save(qw, "qwen2")
    dump, _ = train_from("qwen2", d, OURS % ", attn_bias: qkv")
    compare(qw, plain, dump, "Qwen2ForCausalLM", "the model with its biases zeroed")
    exported = export_round_trip("qwen2", d, ["architectures", "model_type", "use_sliding_window"])
    again = transformers.AutoModelForCausalLM.from_pretrained(exported, torch_dtype=torch.float32).eval()
    compare(again, plain, dump, "Qwen2ForCausalLM exported by the trainer, loaded by transformers",
            "the model with its biases zeroed")

    # Mixtral's router_aux_loss_coef.
    torch.manual_seed(0)
    mx = transformers.MixtralForCausalLM(transformers.MixtralConfig(
        vocab_size=256, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-5, num_local_experts=4,
        num_experts_per_tok=2, tie_word_embeddings=False, rope_theta=10000.0, router_aux_loss_coef=0.02)).eval()
    d = save(mx, "mixtral")
    moe = base.MODELS["mixtral"]
    dump, out = train_from("mixtral", d, moe)
    dumped = open(os.path.join(dump, "config.yaml")).read()
    check("aux_loss_coeff: 0.02" in dumped and "leaves unset:" in out and " model.moe.aux_loss_coeff=0.02" in out,
          "mixtral: router_aux_loss_coef 0.02 of config.json is the run's model.moe.aux_loss_coeff, said at start-up")
    export_round_trip("mixtral", d, ["architectures", "router_aux_loss_coef"])
    _, out = train_from("mixtral_set", d, moe, ["--set", "model.moe.aux_loss_coeff=0.05"])
    check("model.moe.aux_loss_coeff=0.05 (set in the configuration) wins over router_aux_loss_coef=0.02" in out,
          "mixtral: a coefficient set in the configuration wins, said at start-up")

    # Refusals: exit 2, the key and its value named.
    llama_dir = os.path.join(WORK, "linear_hf")
    cfg = os.path.join(WORK, "linear", "run.yaml")
    refusals = [
        ("an unknown key", {"frobnicate": 3}, "frobnicate=3 in config.json is not known to this trainer"),
        ("rope_scaling yarn", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "'yarn' is not implemented"),
        ("rope_scaling dynamic", {"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "'dynamic' is not implemented"),
        ("rope_scaling longrope", {"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0],
                                                    "long_factor": [1.0]}}, "'longrope' is not implemented"),
        ("mlp_bias", {"mlp_bias": True}, "mlp_bias=true in config.json: MLP biases are not implemented"),
        ("head_dim", {"head_dim": 32}, "head_dim=32 in config.json"),
        ("partial_rotary_factor", {"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5 in config.json"),
        ("quantization_config", {"quantization_config": {"quant_method": "awq"}}, "quantization_config="),
        ("auto_map", {"auto_map": {"AutoModelForCausalLM": "m.M"}}, "auto_map="),
        ("pruned_heads", {"pruned_heads": {"0": [1]}}, "pruned_heads="),
        ("add_cross_attention", {"add_cross_attention": True}, "add_cross_attention=true"),
        ("is_encoder_decoder", {"is_encoder_decoder": True}, "is_encoder_decoder=true"),
        # The configuration writes the key (a key it leaves unset is taken from config.json).
        ("attention_bias vs model.attn_bias", {"attention_bias": True},
         "attention_bias=true in config.json, model.attn_bias = none", ["--set", "model.attn_bias=none"]),
        ("rope_scaling vs model.rope_scaling (linear x4)", {"rope_scaling": {"type": "linear", "factor": 2.0}},
         "rope_scaling={\"type\":\"linear\",\"factor\":2.0} in config.json, model.rope_scaling"),
    ]
    for i, (label, keys, needle, *extra) in enumerate(refusals):
        bad = os.path.join(WORK, f"refused_{i}")
        os.makedirs(bad)
        os.symlink(os.path.join(llama_dir, "model.safetensors"), os.path.join(bad, "model.safetensors"))
        shutil.copy(os.path.join(llama_dir, "config.json"), bad)
        edit_config(bad, **keys)
        p = run(["--config", cfg, "--set", f"run.dir={WORK}/refused_run", "--set", f"model.init_from={bad}"] +
                (extra[0] if extra else []), expect=None)
        ok = p.returncode == 2 and needle in p.stderr and bad in p.stderr
        check(ok, f"refused, {label}: exit {p.returncode} (want 2), names '{needle}' and the directory")
        if not ok:
            print(p.stderr[-2000:])
    # Qwen2's window counts only with use_sliding_window: true.
    qwen_dir = os.path.join(WORK, "qwen2_hf")
    qcfg_path = os.path.join(WORK, "qwen2", "run.yaml")
    for use, code in ((False, 0), (True, 2)):
        bad = os.path.join(WORK, f"qwen2_window_{use}")
        os.makedirs(bad)
        os.symlink(os.path.join(qwen_dir, "model.safetensors"), os.path.join(bad, "model.safetensors"))
        shutil.copy(os.path.join(qwen_dir, "config.json"), bad)
        edit_config(bad, sliding_window=8, use_sliding_window=use)
        p = run(["--config", qcfg_path, "--set", f"run.dir={WORK}/qwen2_window_run_{use}",
                 "--set", f"model.init_from={bad}"], expect=None)
        ok = p.returncode == code and (code == 0 or "per-layer sliding window" in p.stderr)
        check(ok, f"qwen2 sliding_window 8 with use_sliding_window {use}: exit {p.returncode} (want {code})")
        if not ok:
            print(p.stderr[-2000:])

    if base.failures:
        print(f"{len(base.failures)} check(s) failed")
        sys.exit(1)
    print("all Hugging Face feature checks passed")


if __name__ == "__main__":
    main()
