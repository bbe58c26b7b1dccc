#!/usr/bin/python3
"""Self-test of the reference, usable before the trainer can dump anything.

1. Unit checks of the pieces whose contract is easy to get subtly wrong
   (top-k ties, k-major capacity admission, RoPE pairing, LR schedule, file I/O).
2. For each config of run_reference_tests.py (plus a gpt2 MoE variant), a fake
   dump made by this reference run in float32 -- a stand-in for the float32
   trainer, so it also tells whether the tolerances leave room for honest
   float32 rounding. compare.py must pass on it.
3. Corrupted dumps and dumps from deliberately wrong models ("mutants") must
   make compare.py fail, naming the right check: the tolerances have to be
   tight enough to catch realistic bugs, not just loose enough to pass.

usage: selftest.py [--workdir DIR] [--keep]
"""
import argparse
import copy
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import reference_model  # noqa: E402
import reference_train  # noqa: E402
import safetensors_io  # noqa: E402
from reference_model import (ReferenceModel, model_spec_from_config, moe_route,  # noqa: E402
                             parse_simple_yaml, random_params, rope)
from reference_train import ReferenceTrainer, lr_at, train_spec_from_config  # noqa: E402
from compare import NEAR_TIE_P  # noqa: E402
from run_reference_tests import CONFIGS, make_config, to_yaml, write_tokens  # noqa: E402

COMPARE = os.path.join(HERE, "compare.py")
failures = []


def expect(cond, what):
    print(f"{'ok  ' if cond else 'FAIL'}  {what}")
    if not cond:
        failures.append(what)


# ---------------------------------------------------------------------------
# 1. unit checks
# ---------------------------------------------------------------------------


def unit_checks(tmp):
    # Routing: token 1 has a tie (lower index must win); capacity 2 with k-major
    # admission drops token 3's first choice and token 1's second choice --
    # token-major admission would drop different ones.
    p = torch.tensor([[0.5, 0.3, 0.2], [0.4, 0.4, 0.2], [0.2, 0.5, 0.3], [0.6, 0.1, 0.3]],
                     dtype=torch.float64)
    experts, w, keep, counts, cap, _ = moe_route(p, 2, 0.75, True)
    expect(cap == 2, f"capacity ceil(0.75*4*2/3) == 2 (got {cap})")
    expect(experts.tolist() == [[0, 1], [0, 1], [1, 2], [0, 2]], f"top-k with ties lower index first: {experts.tolist()}")
    expect(keep.tolist() == [[True, True], [True, False], [True, True], [False, True]],
           f"k-major admission: {keep.tolist()}")
    expect(counts.tolist() == [3, 3, 2], f"counts before dropping: {counts.tolist()}")
    expect(torch.allclose(w[0], torch.tensor([0.5 / 0.8, 0.3 / 0.8], dtype=torch.float64)),
           "normalize_topk divides by the sum of the selected p")
    _, w_raw, _, _, cap0, _ = moe_route(p, 2, 0.0, False)
    expect(cap0 is None and torch.equal(w_raw[0], torch.tensor([0.5, 0.3], dtype=torch.float64)),
           "dropless and unnormalised weights")
    ties = torch.tensor([[0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    e3, _, _, _, _, _ = moe_route(ties, 3, 0.0, True)
    expect(e3.tolist() == [[0, 1, 2]], f"all-equal p picks experts 0,1,2 (got {e3.tolist()})")

    # RoPE: explicit half-split formula for D=4 at t=1, and the relative-position
    # property that makes it RoPE at all.
    theta = 10000.0
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64).reshape(1, 1, 1, 4).repeat(1, 2, 1, 1)
    y = rope(x, theta)[0, 1, 0]
    a0, a1 = 1.0, theta ** (-2.0 / 4)
    want = [1 * math.cos(a0) - 3 * math.sin(a0), 2 * math.cos(a1) - 4 * math.sin(a1),
            1 * math.sin(a0) + 3 * math.cos(a0), 2 * math.sin(a1) + 4 * math.cos(a1)]
    expect(torch.allclose(y, torch.tensor(want, dtype=torch.float64), atol=1e-14, rtol=0),
           "RoPE half-split pairs (i, i+D/2) with angle t*theta^(-2i/D)")
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 1, 1, 8, generator=g, dtype=torch.float64).repeat(1, 12, 1, 1)
    k = torch.randn(1, 1, 1, 8, generator=g, dtype=torch.float64).repeat(1, 12, 1, 1)
    rq, rk = rope(q, theta)[0, :, 0], rope(k, theta)[0, :, 0]
    expect(abs(float(rq[5] @ rk[2] - rq[9] @ rk[6])) < 1e-12, "RoPE scores depend only on t - s")
    # Scaled frequencies, hand-computed for D = 8, theta = 100: f = 1, 0.316,
    # 0.1, 0.0316 (wavelengths 6.3, 19.9, 62.8, 199). llama3 with O = 64,
    # lo = 1, hi = 4: keeps w < 16, divides w > 64, ramps between.
    f = [100.0 ** (-2.0 * i / 8) for i in range(4)]
    sc = {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_seq_len": 64.0}
    ramp = [(64.0 * fi / (2 * math.pi) - 1.0) / 3.0 for fi in f]
    want3 = [f[0], (1 - ramp[1]) * f[1] / 8 + ramp[1] * f[1], (1 - ramp[2]) * f[2] / 8 + ramp[2] * f[2], f[3] / 8]
    got3 = reference_model.rope_inv_freq(8, 100.0, sc)
    expect(torch.allclose(got3, torch.tensor(want3, dtype=torch.float64), rtol=1e-14, atol=0),
           f"llama3 RoPE scaling: {got3.tolist()} vs {want3}")
    got_lin = reference_model.rope_inv_freq(8, 100.0, {"type": "linear", "factor": 4.0})
    expect(torch.allclose(got_lin, torch.tensor(f, dtype=torch.float64) / 4, rtol=1e-14, atol=0),
           "linear RoPE scaling divides every frequency")

    # LR schedule against hand-computed values.
    ts = reference_train.TrainSpec(steps=20, grad_clip=1.0, lr=1e-2, min_lr=1e-3, warmup_steps=3,
                                   schedule="cosine", decay_steps=20, beta1=0.9, beta2=0.95,
                                   eps=1e-8, weight_decay=0.1, optimizer="adamw")
    expect(abs(lr_at(0, ts) - 1e-2 / 3) < 1e-18 and abs(lr_at(2, ts) - 1e-2) < 1e-18, "warmup (s+1)/W")
    expect(abs(lr_at(3, ts) - 1e-2) < 1e-17, "cosine starts at lr right after warmup")
    r = (19 - 3) / 17
    expect(abs(lr_at(19, ts) - (1e-3 + 0.5 * 9e-3 * (1 + math.cos(math.pi * r)))) < 1e-18, "cosine at s=19")
    lin = dataclasses.replace(ts, schedule="linear")
    expect(abs(lr_at(11, lin) - (1e-2 - 9e-3 * 8 / 17)) < 1e-18, "linear at s=11")
    expect(abs(lr_at(40, lin) - 1e-3) < 1e-18, "schedule clamps at min_lr after decay_steps")

    # Files: safetensors round trip, and the fallback YAML parser agrees with PyYAML.
    tensors = {"a": torch.randn(3, 4), "b": torch.arange(24, dtype=torch.int32).reshape(2, 3, 4),
               "c": torch.randn(5, dtype=torch.float64), "d": torch.tensor(1.5), "e": torch.zeros(0, 3)}
    path = os.path.join(tmp, "rt.safetensors")
    safetensors_io.save(path, tensors)
    back = safetensors_io.load(path)
    expect(set(back) == set(tensors) and all(back[k].dtype == tensors[k].dtype and torch.equal(back[k], tensors[k])
                                             for k in tensors), "safetensors round trip (F32, I32, F64, 0-d, empty)")
    with open(path, "rb") as f:
        hlen = int.from_bytes(f.read(8), "little")
    expect((8 + hlen) % 8 == 0, "safetensors data section 8-byte aligned")
    cfg = make_config("llama_moe", "/tmp/w", "/tmp/w/tokens.bin")
    text = to_yaml(cfg) + "\ndata2:\n  train:\n  - /x/a.bin\n  - '/x/b # c.bin'  # comment\n  dtype: uint16\n"
    try:
        import yaml
        expect(parse_simple_yaml(text) == yaml.safe_load(text), "fallback YAML parser == PyYAML")
    except ImportError:
        print("skip  fallback YAML parser vs PyYAML (PyYAML missing)")
    expect(model_spec_from_config(parse_simple_yaml(text)).num_experts == 4, "moe keys read under model.moe")
    top = dict(cfg)
    top["moe"] = top["model"].pop("moe")
    expect(model_spec_from_config(top).num_experts == 4, "moe keys read at top level too")


# ---------------------------------------------------------------------------
# 2. fake dumps
# ---------------------------------------------------------------------------

SELFTEST_CONFIGS = dict(CONFIGS)
# Dropless, unnormalised top-k and a dense layer between MoE layers: the
# options the trainer configs leave at one value.
SELFTEST_CONFIGS["gpt2_moe"] = {
    "model": {"arch": "gpt2", "vocab_size": 256, "d_model": 32, "n_layers": 2, "n_heads": 4,
              "max_seq_len": 16, "tie_embeddings": False,
              "moe": {"num_experts": 4, "top_k": 2, "every": 2, "capacity_factor": 0.0,
                      "aux_loss_coeff": 0.05, "normalize_topk": False}},
    # Gentler than the trainer configs: without warmup, lr 1e-2 sends this one's
    # gradient norm past 100 and float32-vs-float64 drift grows past 1e-4.
    "optim": {"lr": 5e-3, "warmup_steps": 2, "schedule": "constant", "weight_decay": 0.1},
}
# Each dump's seed is 100 + its place here: the sliding-window case goes last
# so the older cases keep the seeds their checks were tuned on.
SELFTEST_CONFIGS["llama_window"] = SELFTEST_CONFIGS.pop("llama_window")


def config_for(name, tmp):
    if name in CONFIGS:
        return make_config(name, tmp, os.path.join(tmp, "tokens.bin"))
    saved = CONFIGS[name] if name in CONFIGS else None
    CONFIGS[name] = SELFTEST_CONFIGS[name]
    try:
        return make_config(name, tmp, os.path.join(tmp, "tokens.bin"))
    finally:
        if saved is None:
            del CONFIGS[name]


_TOKENS = {}


def text_tokens(vocab_size):
    if vocab_size not in _TOKENS:
        with tempfile.TemporaryDirectory() as d:
            write_tokens(os.path.join(d, "t.bin"), vocab_size)
            _TOKENS[vocab_size] = torch.from_numpy(
                np.fromfile(os.path.join(d, "t.bin"), dtype="<u2").astype(np.int64))
    return _TOKENS[vocab_size]


def write_fake_dump(dump, cfg, seed, dtype=torch.float32, tokens=None):
    """What the trainer would write, produced by this reference at `dtype`."""
    os.makedirs(dump, exist_ok=True)
    with open(os.path.join(dump, "config.yaml"), "w") as f:
        f.write(to_yaml(cfg) + "\n")
    spec, ts = model_spec_from_config(cfg), train_spec_from_config(cfg)
    init = random_params(spec, seed=seed, std=float(cfg["model"].get("init_std", 0.02)))
    t = cfg["train"]
    M = t["global_batch_size"] // t["micro_batch_size"]
    # Windows of the same text the trainer test trains on: its statistics
    # (and so the size of float32 drift over 20 steps) match the real run.
    if tokens is None:
        tokens = text_tokens(spec.vocab_size)
    g = torch.Generator().manual_seed(seed + 1)
    n_seq, T = ts.steps * M * t["micro_batch_size"], t["seq_len"]
    starts = torch.randint(0, len(tokens) - T - 1, (n_seq,), generator=g)
    seq = torch.stack([tokens[s:s + T + 1] for s in starts.tolist()])
    seq = seq.reshape(ts.steps, M, t["micro_batch_size"], T + 1).to(torch.int32)
    inputs, targets = seq[..., :-1].contiguous(), seq[..., 1:].contiguous()
    model = ReferenceModel(spec, init, dtype=dtype)
    trainer = ReferenceTrainer(model, ts)
    recs = [trainer.step(s, inputs[s], targets[s], keep_first_logits=(s == 0), keep_grads=(s == 0))
            for s in range(ts.steps)]
    safetensors_io.save(os.path.join(dump, "init.safetensors"), init)
    safetensors_io.save(os.path.join(dump, "batches.safetensors"), {"inputs": inputs, "targets": targets})
    step0 = {"logits": recs[0]["logits"].float()}
    step0.update({"grad." + k: v.float() for k, v in recs[0]["grads"].items()})
    safetensors_io.save(os.path.join(dump, "step0.safetensors"), step0)
    safetensors_io.save(os.path.join(dump, "final.safetensors"),
                        {k: p.detach().float() for k, p in model.params.items()})
    with open(os.path.join(dump, "losses.json"), "w") as f:
        json.dump({k: [float(r[k]) for r in recs] for k in ("lm_loss", "aux_loss", "lr", "grad_norm")}, f)
    return recs


def run_compare(dump):
    r = subprocess.run([sys.executable, COMPARE, dump], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def failed_checks(output):
    return [line.split()[1] for line in output.splitlines() if line.startswith("FAIL")]


def mutate(src, dst, fn):
    shutil.copytree(src, dst)
    fn(dst)


def edit_tensor(dump, file, name, fn):
    path = os.path.join(dump, file)
    d = safetensors_io.load(path)
    d[name] = fn(d[name].clone())
    safetensors_io.save(path, d)


def edit_losses(dump, key, step, factor):
    path = os.path.join(dump, "losses.json")
    with open(path) as f:
        d = json.load(f)
    d[key][step] = None if factor is None else d[key][step] * factor
    with open(path, "w") as f:
        json.dump(d, f)


def edit_text(dump, file, old, new):
    path = os.path.join(dump, file)
    with open(path) as f:
        text = f.read()
    assert old in text, (file, old)
    with open(path, "w") as f:
        f.write(text.replace(old, new, 1))


def bump_max(t, rel):
    i = int(t.abs().argmax())
    t.view(-1)[i] += rel * float(t.abs().max())
    return t


# Mutant models: realistic bugs a C++ implementation could have.
def interleaved_rope(x, theta, scaling=None):
    B, T, H, D = x.shape
    inv = reference_model.rope_inv_freq(D, theta, scaling)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang).to(x.dtype)[None, :, None, :], torch.sin(ang).to(x.dtype)[None, :, None, :]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).reshape(x.shape)


def unscaled_rope(x, theta, scaling=None):
    return ORIG["rope"](x, theta)


def token_major_route(p, top_k, capacity_factor, normalize_topk):
    experts, w, keep, counts, capacity, margin = ORIG["moe_route"](p, top_k, capacity_factor, normalize_topk)
    if capacity is not None:
        fill = [0] * p.shape[1]
        keep = torch.zeros_like(keep)
        for n in range(p.shape[0]):
            for k in range(top_k):
                e = int(experts[n, k])
                if fill[e] < capacity:
                    fill[e] += 1
                    keep[n, k] = True
    return experts, w, keep, counts, capacity, margin


def flip_route(mode, calls_per_step):
    """moe_route that, once from step 1 on, swaps one token's K-th and (K+1)-th
    choices: the one nearest a tie ("near_tie", what float32 rounding could do
    to an honest trainer), or the one farthest from it ("forced", a bug)."""
    state = {"calls": 0, "done": False}

    def route(p, top_k, capacity_factor, normalize_topk):
        call = state["calls"]
        state["calls"] += 1
        if not state["done"] and call >= calls_per_step:
            sp, idx = torch.sort(p.detach(), dim=-1, descending=True, stable=True)
            gap = sp[:, top_k - 1] - sp[:, top_k]
            n = int(gap.argmin() if mode == "near_tie" else gap.argmax())
            if mode != "near_tie" or float(gap[n]) < NEAR_TIE_P:
                a, b = int(idx[n, top_k - 1]), int(idx[n, top_k])
                perm = torch.arange(p.shape[1])
                perm[a], perm[b] = b, a
                p = torch.cat([p[:n], p[n:n + 1][:, perm], p[n + 1:]])
                state["done"] = True
                state["step"] = call // calls_per_step
        return ORIG["moe_route"](p, top_k, capacity_factor, normalize_topk)

    route.state = state
    return route


def modulo_gqa_attention(q, k, v, window=0):
    # Query head j reads kv head j % Hkv instead of j // (Hq/Hkv).
    group = q.shape[2] // k.shape[2]
    return ORIG["causal_attention"](q, k.repeat(1, 1, group, 1), v.repeat(1, 1, group, 1), window)


def window_one_short_attention(q, k, v, window=0):
    # A window of W keys including the query's own instead of W + 1 (the
    # other reading of "sliding_window").
    return ORIG["causal_attention"](q, k, v, window - 1 if window > 1 else window)


def renormalize_after_drop_route(p, top_k, capacity_factor, normalize_topk):
    # Normalises over the kept assignments instead of all K selected ones.
    experts, w, keep, counts, capacity, margin = ORIG["moe_route"](p, top_k, capacity_factor, False)
    kept = torch.gather(p, 1, experts) * keep
    w = kept / kept.sum(-1, keepdim=True).clamp_min(1e-30)
    return experts, w, keep, counts, capacity, margin


def erf_gelu(x):
    return F.gelu(x)


ORIG = {"rope": reference_model.rope, "moe_route": reference_model.moe_route,
        "gelu_tanh": reference_model.gelu_tanh, "causal_attention": reference_model.causal_attention}


class DecayEverything(ReferenceTrainer):
    def __init__(self, model, ts):
        super().__init__(model, ts)
        self.opt = torch.optim.AdamW(list(model.params.values()), lr=ts.lr,
                                     betas=(ts.beta1, ts.beta2), eps=ts.eps, weight_decay=ts.weight_decay)


class TokenMeanPerMicroBatch(ReferenceTrainer):
    """Sums per-micro-batch means instead of averaging over the step."""

    def forward_backward(self, inputs, targets, keep_first_logits=False):
        M = inputs.shape[0]
        lm, aux, logits, stats = super().forward_backward(inputs, targets, keep_first_logits)
        for p in self.model.params.values():
            p.grad.mul_(M)
        return lm, aux, logits, stats


def mutant_dump(dump, cfg, seed, patch_module=None, patch=None, trainer_cls=None):
    saved = {}
    try:
        if patch:
            for attr, fn in patch.items():
                saved[attr] = getattr(patch_module, attr)
                setattr(patch_module, attr, fn)
        if trainer_cls:
            saved_cls = globals()["ReferenceTrainer"]
            globals()["ReferenceTrainer"] = trainer_cls
        try:
            write_fake_dump(dump, cfg, seed)
        finally:
            if trainer_cls:
                globals()["ReferenceTrainer"] = saved_cls
    finally:
        for attr, fn in saved.items():
            setattr(patch_module, attr, fn)


STUB_TRAINER = """#!/usr/bin/python3
# Stand-in for the C++ trainer: takes the same command line and writes the
# dump with the float32 reference, reading the tokens the driver wrote.
import argparse, sys
import numpy as np, torch
sys.path.insert(0, %(here)r)
import selftest
from reference_model import load_yaml
ap = argparse.ArgumentParser()
ap.add_argument("--config", required=True)
ap.add_argument("--dump-reference", required=True)
a = ap.parse_args()
if %(fail)r:
    sys.stderr.write("trainer: config error: model.d_model: must be positive\\n")
    sys.exit(2)
cfg = load_yaml(a.config)
assert cfg["data"]["dtype"] == "uint16" and cfg["train"]["precision"] == "fp32"
tokens = torch.from_numpy(np.fromfile(cfg["data"]["train"][0], dtype="<u2").astype(np.int64))
selftest.write_fake_dump(a.dump_reference, cfg, seed=int(cfg["run"]["seed"]), tokens=tokens)
print("trainer: done")
"""


def driver_checks(tmp):
    driver = os.path.join(HERE, "run_reference_tests.py")
    for fail in (False, True):
        stub = os.path.join(tmp, f"stub_trainer_{'fail' if fail else 'ok'}.py")
        with open(stub, "w") as f:
            f.write(STUB_TRAINER % {"here": HERE, "fail": fail})
        os.chmod(stub, 0o755)
        work = os.path.join(tmp, f"driver_{'fail' if fail else 'ok'}")
        r = subprocess.run([sys.executable, driver, "--trainer", stub, "--source", os.path.dirname(os.path.dirname(HERE)),
                            "--workdir", work], capture_output=True, text=True)
        lines = r.stdout.strip().splitlines()
        last = lines[-1] if lines else ""
        if fail:
            expect(r.returncode == 1 and last == f"0 passed, {len(CONFIGS)} failed"
                   and "model.d_model: must be positive" in r.stdout,
                   f"failing trainer: exit {r.returncode}, summary {last!r}, its stderr shown")
        else:
            if r.returncode != 0:
                print(r.stdout[-4000:], r.stderr[-2000:])
            expect(r.returncode == 0 and last == f"{len(CONFIGS)} passed, 0 failed",
                   f"stand-in trainer: exit {r.returncode}, summary {last!r}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", help="where to write the fake dumps (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the fake dumps")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    tmp = args.workdir or tempfile.mkdtemp(prefix="reference_selftest_")
    if args.workdir:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)
        os.makedirs(tmp)
    print(f"workdir {tmp}")

    print("--- unit checks")
    unit_checks(tmp)

    print("--- honest float32 dumps must pass")
    dumps = {}
    for i, name in enumerate(SELFTEST_CONFIGS):
        cfg = config_for(name, tmp)
        dump = os.path.join(tmp, name, "dump")
        recs = write_fake_dump(dump, cfg, seed=100 + i)
        rc, out = run_compare(dump)
        print(out if rc != 0 else "\n".join(l for l in out.splitlines()
                                             if not l.startswith("PASS") or "steps." in l or "logits" in l))
        clipped = sum(r["grad_norm"] > cfg["train"]["grad_clip"] for r in recs)
        expect(rc == 0, f"{name}: compare.py passes on a float32 dump (clipped {clipped}/{len(recs)} steps)")
        dumps[name] = (dump, cfg, 100 + i)

    print("--- corrupted dumps must fail, naming the check")
    base, cfg, seed = dumps["llama_dense"]
    cases = [
        ("grad.layers.0.attn.wq.weight", lambda d: edit_tensor(
            d, "step0.safetensors", "grad.layers.0.attn.wq.weight", lambda t: bump_max(t, 1e-3))),
        ("step0.logits", lambda d: edit_tensor(d, "step0.safetensors", "logits", lambda t: bump_max(t, 1e-4))),
        ("steps.lm_loss", lambda d: edit_losses(d, "lm_loss", 10, 1 + 1e-3)),
        ("steps.lr", lambda d: edit_losses(d, "lr", 7, 1 + 1e-5)),
        ("steps.grad_norm", lambda d: edit_losses(d, "grad_norm", 12, 1 + 1e-2)),
        ("final.layers.1.mlp.w_up.weight", lambda d: edit_tensor(
            d, "final.safetensors", "layers.1.mlp.w_up.weight", lambda t: bump_max(t, 1e-2))),
        ("grad.final_norm.weight", lambda d: edit_tensor(
            d, "step0.safetensors", "grad.final_norm.weight", lambda t: t[:-1])),
        ("init.names", lambda d: edit_tensor(d, "init.safetensors", "layers.1.mlp.w_up.weight", lambda t: t.t())),
        ("batches.shape", lambda d: edit_text(d, "config.yaml", "global_batch_size: 4", "global_batch_size: 8")),
        ("losses.lm_loss", lambda d: edit_losses(d, "lm_loss", 3, None)),
    ]
    for i, (check, fn) in enumerate(cases):
        d = os.path.join(tmp, f"corrupt_{i}")
        mutate(base, d, fn)
        rc, out = run_compare(d)
        bad = failed_checks(out)
        expect(rc == 1 and bad and bad[0] == check and "compare: FAILED" in out,
               f"corrupted {check}: exit {rc}, failed {bad[:3]}")
    moe_dump, moe_cfg, moe_seed = dumps["llama_moe"]
    d = os.path.join(tmp, "corrupt_moe")
    # Step 1 precedes this seed's first routing near-tie, so 1e-3 must fail
    # there; after a near-tie only the loose bound applies, so a 50% error
    # in the last step must still fail.
    for step, factor in ((1, 1 + 1e-3), (cfg["train"]["steps"] - 1, 1.5)):
        d = os.path.join(tmp, f"corrupt_moe_{step}")
        mutate(moe_dump, d, lambda d: edit_losses(d, "aux_loss", step, factor))
        rc, out = run_compare(d)
        expect(rc == 1 and failed_checks(out) == ["steps.aux_loss"], f"corrupted steps.aux_loss at step "
               f"{step} by {factor:g}x: exit {rc}, failed {failed_checks(out)[:3]}")

    print("--- MoE at the default init_std 0.02 (near-ties likely) must pass, excused or not")
    for name in ("llama_moe", "gpt2_moe"):
        for seed in (200, 201, 202):
            c = copy.deepcopy(dumps[name][1])
            c["model"]["init_std"] = 0.02
            d = os.path.join(tmp, f"ties_{name}_{seed}")
            write_fake_dump(d, c, seed)
            rc, out = run_compare(d)
            excused = sum(1 for line in out.splitlines() if line.startswith("EXCUSED"))
            if rc != 0:
                print(out)
            expect(rc == 0, f"{name} seed {seed} at init_std 0.02: exit {rc}, {excused} check(s) excused")

    print("--- a routing flip at a near-tie is excused, one far from any tie is not")
    _, mcfg, mseed = dumps["llama_moe"]
    calls = 2 * 2  # micro-batches x MoE layers per step
    for mode in ("near_tie", "forced"):
        route = flip_route(mode, calls)
        d = os.path.join(tmp, f"flip_{mode}")
        mutant_dump(d, mcfg, mseed, patch_module=reference_model, patch={"moe_route": route})
        rc, out = run_compare(d)
        bad = failed_checks(out)
        excused = [line.split()[1] for line in out.splitlines() if line.startswith("EXCUSED")]
        where = f"flipped at step {route.state.get('step')}"
        if mode == "near_tie":
            expect(route.state["done"] and rc == 0, f"near-tie flip ({where}): exit {rc}, excused {excused[:4]}")
        else:
            expect(rc == 1 and "steps.lm_loss" in bad, f"forced flip ({where}): exit {rc}, failed {bad[:4]}")

    print("--- dumps from wrong models must fail")
    mutants = [
        ("interleaved RoPE", "llama_dense", dict(patch_module=reference_model, patch={"rope": interleaved_rope}),
         "step0.logits"),
        ("RoPE scaling ignored", "llama_dense", dict(patch_module=reference_model, patch={"rope": unscaled_rope}),
         "step0.logits"),
        ("token-major capacity admission", "llama_moe",
         dict(patch_module=reference_model, patch={"moe_route": token_major_route}), "step0.logits"),
        ("GQA head j reads kv head j % Hkv", "llama_dense",
         dict(patch_module=reference_model, patch={"causal_attention": modulo_gqa_attention}), "step0.logits"),
        ("sliding window one key short", "llama_window",
         dict(patch_module=reference_model, patch={"causal_attention": window_one_short_attention}), "step0.logits"),
        ("top-k weights renormalised after dropping", "llama_moe",
         dict(patch_module=reference_model, patch={"moe_route": renormalize_after_drop_route}), "step0.logits"),
        ("erf GELU instead of tanh", "gpt2_dense",
         dict(patch_module=reference_model, patch={"gelu_tanh": erf_gelu}), "step0.logits"),
        ("weight decay on norms and biases", "gpt2_dense", dict(trainer_cls=DecayEverything), None),
        ("micro-batch losses summed, not averaged", "llama_dense", dict(trainer_cls=TokenMeanPerMicroBatch),
         "grad.tok_embed.weight"),
    ]
    for what, name, kw, first in mutants:
        _, mcfg, mseed = dumps[name]
        d = os.path.join(tmp, "mutant_" + what.split()[0].lower() + "_" + name)
        mutant_dump(d, mcfg, mseed, **kw)
        rc, out = run_compare(d)
        bad = failed_checks(out)
        ok = rc == 1 and bool(bad) and (first is None or bad[0] == first)
        expect(ok, f"mutant '{what}' ({name}): exit {rc}, failed {bad[:4]}")

    print("--- run_reference_tests.py end to end, with a stand-in trainer")
    driver_checks(tmp)

    if not args.keep and not args.workdir:
        shutil.rmtree(tmp)
    if failures:
        print(f"selftest: FAILED {len(failures)}: " + "; ".join(failures))
        return 1
    print("selftest: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
