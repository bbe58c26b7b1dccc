#!/usr/bin/python3
"""Compare a trainer reference dump (trainer --dump-reference DIR) with the
independent PyTorch reference.

usage: compare.py DIR

Exit 0 when every check passes; 1 otherwise, with a line naming the failed
checks. Error metrics (a = trainer, b = reference in float64):

  tensor error  max|a - b| / max(max|b|, floor)   per tensor
  scalar error  |a - b| / max(|b|, floor)

Normalising by the tensor's largest magnitude, not element by element, keeps
entries that happen to be near zero from turning float32 rounding into huge
relative errors, while a wrong formula still shows up at O(1).
"""
import argparse
import json
import math
import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import safetensors_io  # noqa: E402
from reference_model import (ReferenceModel, cfg_get, check_param_names, load_dump_config,  # noqa: E402
                             model_spec_from_config)
from reference_train import ReferenceTrainer, train_spec_from_config  # noqa: E402

TOL_LOGITS = 1e-5       # one float32 forward vs float64: ~1e-6 expected
TOL_STEP0_LOSS = 1e-5
TOL_GRAD = 1e-4         # backward compounds rounding over more ops than forward
TOL_GRAD_NORM0 = 1e-4
TOL_LOSS_CURVE = 1e-4   # float32 trajectory drifts from the float64 one step by step
TOL_AUX_CURVE = 1e-4
TOL_LR = 1e-6           # pure double arithmetic; slack for printed decimals
TOL_GRAD_NORM = 1e-3    # norms of later steps see the drifted weights twice over
TOL_FINAL = 1e-3        # Adam divides by sqrt(v): relative gradient error becomes update error

# MoE routing is discontinuous. When a top-k decision (or, with a capacity,
# the order inside the top k) is closer to a tie than float32 rounding can
# resolve, the trainer may legitimately route differently from the float64
# reference, and from then on the runs differ at O(1e-4..1e-3) in the loss
# and more in the weights. Trajectory checks that first fail at or after a
# step holding such a near-tie are reported as EXCUSED instead of failing, as
# long as the loss stays within LOOSE_* (a gross error still fails). Step-0
# forward/backward checks are never excused: at step 0 both sides see the same
# weights, so only a tie closer than ~1e-7 in p could flip, which is rare.
NEAR_TIE_P = 1e-4       # ~10x the largest float32-vs-float64 drift of p seen over 20 steps
LOOSE_LOSS = 1e-2
LOOSE_AUX_GRAD_NORM = 1e-1

LOGITS_FLOOR = 1e-3
TENSOR_FLOOR = 1e-6
SCALAR_FLOOR = 1e-12

# The loss is exactly invariant to these (softmax over keys ignores a constant
# added to every score, and q.b_k is such a constant), so their gradient is
# zero in exact arithmetic and the trainer's value is float32 rounding noise
# that Adam rescales to lr-sized steps. Their final values carry no information.
GAUGE_INVARIANT_SUFFIXES = ("attn.wk.bias",)


def tensor_err(a, b, floor):
    a, b = a.double(), b.double()
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    return float((a - b).abs().max() / max(float(b.abs().max()), floor))


def scalar_err(a, b, floor=SCALAR_FLOOR):
    return abs(float(a) - float(b)) / max(abs(float(b)), floor)


class Report:
    def __init__(self):
        self.failed = []
        self.excused = []
        self.count = 0

    def check(self, name, err, tol, detail=""):
        ok = err <= tol  # False for NaN, which must fail
        self.count += 1
        if not ok:
            self.failed.append(name)
        extra = f"  {detail}" if detail else ""
        print(f"{'PASS' if ok else 'FAIL'}  {name:<44} err={err:.3e}  tol={tol:.0e}{extra}")
        return ok

    def fail(self, name, why):
        self.count += 1
        self.failed.append(name)
        print(f"FAIL  {name:<44} {why}")

    def excuse(self, name, err, tol, detail):
        self.count += 1
        self.excused.append(name)
        print(f"EXCUSED {name:<42} err={err:.3e}  tol={tol:.0e}  {detail}")

    def info(self, name, text):
        print(f"info  {name:<44} {text}")


def compare(dump_dir):
    rep = Report()
    path = lambda f: os.path.join(dump_dir, f)  # noqa: E731

    # --- load -------------------------------------------------------------
    try:
        cfg = load_dump_config(dump_dir)
        spec = model_spec_from_config(cfg)
        ts = train_spec_from_config(cfg)
        init = safetensors_io.load(path("init.safetensors"))
        batches = safetensors_io.load(path("batches.safetensors"))
        step0 = safetensors_io.load(path("step0.safetensors"))
        final = safetensors_io.load(path("final.safetensors"))
        with open(path("losses.json")) as f:
            losses = json.load(f)
    except Exception as e:  # any unreadable piece makes every later check meaningless
        rep.fail("load", f"{type(e).__name__}: {e}")
        return rep
    print(f"dump {dump_dir}: arch={spec.arch} layers={spec.n_layers} d_model={spec.d_model} "
          f"heads={spec.n_heads}/{spec.n_kv_heads} d_ff={spec.d_ff} vocab={spec.vocab_size} "
          f"tied={spec.tied} experts={spec.num_experts} top_k={spec.top_k} "
          f"capacity_factor={spec.capacity_factor}")

    problems = check_param_names(spec, init, "init.safetensors")
    problems += [f"init.safetensors: {n} is {t.dtype}, expected F32"
                 for n, t in init.items() if t.dtype != torch.float32]
    if problems:
        for p in problems:
            print("      " + p)
        rep.fail("init.names", f"{len(problems)} problem(s) with parameter names/shapes")
        return rep

    inputs, targets = batches.get("inputs"), batches.get("targets")
    if inputs is None or targets is None or inputs.dim() != 4 or inputs.shape != targets.shape:
        rep.fail("batches.shape", "need inputs and targets of equal shape [steps, M, B, T]; got "
                 f"{None if inputs is None else list(inputs.shape)} / "
                 f"{None if targets is None else list(targets.shape)}")
        return rep
    S, M, B, T = inputs.shape
    print(f"batches: steps={S} micro_batches={M} micro_batch={B} seq={T}")
    if S != ts.steps or S == 0:
        rep.fail("batches.steps", f"batches hold {S} steps, config train.steps={ts.steps}")
        if S == 0:
            return rep
    # With one data-parallel rank the shape follows from the config alone; a
    # wrong accumulation count would otherwise only show up as a loss mismatch.
    micro = int(cfg_get(cfg, "train.micro_batch_size", B))
    glob = int(cfg_get(cfg, "train.global_batch_size", 0)) or micro
    seq = int(cfg_get(cfg, "train.seq_len", T))
    if int(cfg_get(cfg, "parallel.dp", 0)) in (0, 1) and (B, T, M) != (micro, seq, glob // micro):
        rep.fail("batches.shape", f"[M, B, T] = [{M}, {B}, {T}], config implies "
                 f"[{glob // micro}, {micro}, {seq}] (global/micro, micro_batch_size, seq_len)")
    lo, hi = int(min(inputs.min(), targets.min())), int(max(inputs.max(), targets.max()))
    if lo < 0 or hi >= spec.vocab_size:
        rep.fail("batches.range", f"token ids span [{lo}, {hi}], vocab_size={spec.vocab_size}")
        return rep

    for key in ("lm_loss", "aux_loss", "lr", "grad_norm"):
        values = losses.get(key) if isinstance(losses, dict) else None
        if not isinstance(values, list) or len(values) != S:
            n = len(values) if isinstance(values, list) else "no"
            rep.fail(f"losses.{key}", f"losses.json has {n} entries, expected {S}")
            return rep
        bad = [i for i, v in enumerate(values) if isinstance(v, bool) or not isinstance(v, (int, float))]
        if bad:
            rep.fail(f"losses.{key}", f"entry {bad[0]} is {values[bad[0]]!r}, not a number")
            return rep

    # --- run the reference on the same batches ---------------------------
    model = ReferenceModel(spec, init, dtype=torch.float64)
    trainer = ReferenceTrainer(model, ts)
    records = []
    for s in range(S):
        records.append(trainer.step(s, inputs[s], targets[s],
                                    keep_first_logits=(s == 0), keep_grads=(s == 0)))
    r0 = records[0]

    # --- step 0: forward --------------------------------------------------
    if "logits" not in step0:
        rep.fail("step0.logits", "missing from step0.safetensors")
    elif tuple(step0["logits"].shape) != tuple(r0["logits"].shape):
        rep.fail("step0.logits", f"shape {list(step0['logits'].shape)}, "
                 f"expected {list(r0['logits'].shape)} ([B*T, V])")
    else:
        rep.check("step0.logits", tensor_err(step0["logits"], r0["logits"], LOGITS_FLOOR),
                  TOL_LOGITS, f"max|a-b|/max(max|ref|,{LOGITS_FLOOR:g})")
    rep.check("step0.lm_loss", scalar_err(losses["lm_loss"][0], r0["lm_loss"]), TOL_STEP0_LOSS,
              f"trainer={losses['lm_loss'][0]:.8g} ref={r0['lm_loss']:.8g}")
    rep.check("step0.aux_loss", scalar_err(losses["aux_loss"][0], r0["aux_loss"]), TOL_STEP0_LOSS,
              f"trainer={losses['aux_loss'][0]:.8g} ref={r0['aux_loss']:.8g}")

    # --- step 0: backward -------------------------------------------------
    worst = (0.0, None)
    for name, ref_g in r0["grads"].items():
        key = "grad." + name
        if key not in step0:
            rep.fail(key, "missing from step0.safetensors")
            continue
        if tuple(step0[key].shape) != tuple(ref_g.shape):
            rep.fail(key, f"shape {list(step0[key].shape)}, expected {list(ref_g.shape)}")
            continue
        floor, note = TENSOR_FLOOR, ""
        if name.endswith(GAUGE_INVARIANT_SUFFIXES):
            # Exactly zero, so the trainer's value is rounding noise of the
            # size of its sibling weight's gradient times float32 epsilon.
            sibling = name[:-len("bias")] + "weight"
            floor = max(floor, float(r0["grads"][sibling].abs().max()))
            note = f"  (exactly 0 in exact math; scaled by max|grad {sibling}|)"
        err = tensor_err(step0[key], ref_g, floor)
        rep.check(key, err, TOL_GRAD, f"max|ref|={float(ref_g.abs().max()):.2e}{note}")
        if not err <= worst[0]:
            worst = (err, name)
    extra = sorted(k for k in step0 if k.startswith("grad.") and k[5:] not in r0["grads"])
    for k in extra:
        rep.fail(k, "unexpected gradient in step0.safetensors")
    if worst[1]:
        rep.info("step0.grad (worst)", f"{worst[1]} err={worst[0]:.3e}")
    rep.check("step0.grad_norm", scalar_err(losses["grad_norm"][0], r0["grad_norm"]), TOL_GRAD_NORM0,
              f"trainer={losses['grad_norm'][0]:.8g} ref={r0['grad_norm']:.8g}")

    # --- the whole run ----------------------------------------------------
    margins = [r["stats"]["min_margin"] for r in records]
    tie_step = next((s for s in range(S) if margins[s] < NEAR_TIE_P), None)
    if spec.num_experts > 0:
        rep.info("moe", f"dropped assignments over the run: {sum(r['stats']['dropped'] for r in records)}; "
                 f"smallest routing margin in p: {min(margins):.3e} at step {margins.index(min(margins))}")
        if tie_step is not None:
            rep.info("moe", f"first routing near-tie (margin < {NEAR_TIE_P:g}) at step {tie_step}: "
                     f"margin {margins[tie_step]:.3e}")

    def curve(key, tol, loose=None):
        errs = [scalar_err(losses[key][s], records[s][key]) for s in range(S)]
        s_max = max(range(S), key=lambda s: errs[s] if errs[s] == errs[s] else math.inf)
        detail = f"worst step {s_max}: trainer={losses[key][s_max]:.8g} ref={records[s_max][key]:.8g}"
        bad = [s for s in range(S) if not errs[s] <= tol]
        if (bad and loose is not None and tie_step is not None and bad[0] >= tie_step
                and all(errs[s] <= loose for s in range(tie_step, S))):
            rep.excuse(f"steps.{key}", errs[s_max], tol,
                       f"first exceeded at step {bad[0]}, after the routing near-tie at step {tie_step}; "
                       f"within {loose:g} ({detail})")
        else:
            if bad:
                detail += f"; first exceeded at step {bad[0]}"
            rep.check(f"steps.{key}", errs[s_max], tol, detail)

    curve("lm_loss", TOL_LOSS_CURVE, LOOSE_LOSS)
    curve("aux_loss", TOL_AUX_CURVE, LOOSE_AUX_GRAD_NORM)
    curve("lr", TOL_LR)
    curve("grad_norm", TOL_GRAD_NORM, LOOSE_AUX_GRAD_NORM)
    rep.info("lm_loss", f"step 0 {records[0]['lm_loss']:.5f} -> step {S - 1} {records[-1]['lm_loss']:.5f}")
    clipped = sum(1 for r in records if ts.grad_clip > 0 and r["grad_norm"] > ts.grad_clip)
    rep.info("grad_clip", f"clipping active in {clipped}/{S} steps (clip={ts.grad_clip:g})")

    problems = check_param_names(spec, final, "final.safetensors")
    for p in problems:
        rep.fail("final.names", p)
    worst = (0.0, None)
    for name, p in model.params.items():
        if name not in final or tuple(final[name].shape) != tuple(p.shape):
            continue
        err = tensor_err(final[name], p.detach(), TENSOR_FLOOR)
        if name.endswith(GAUGE_INVARIANT_SUFFIXES):
            rep.info("final." + name, f"not checked, the loss is invariant to it: trainer max|value| "
                     f"{float(final[name].abs().max()):.1e}, reference {float(p.detach().abs().max()):.1e}")
            continue
        # The max-element error is what is checked; Adam can amplify rounding in
        # a single element whose gradient nearly cancels, so the norm-wise error
        # is printed beside it to tell one such element from a systematic error.
        ref = p.detach()
        fro = float((final[name].double() - ref).norm() / max(float(ref.norm()), TENSOR_FLOOR))
        if not err <= TOL_FINAL and tie_step is not None:
            rep.excuse("final." + name, err, TOL_FINAL, f"routing near-tie at step {tie_step}; "
                       f"norm-wise {fro:.1e}")
        else:
            rep.check("final." + name, err, TOL_FINAL, f"norm-wise {fro:.1e}")
        if not err <= worst[0]:
            worst = (err, name)
    if worst[1]:
        rep.info("final (worst)", f"{worst[1]} err={worst[0]:.3e}")

    if rep.failed and spec.num_experts > 0 and min(margins) < NEAR_TIE_P:
        print("note: routing margins below ~1e-6 can flip under float32 rounding even at step 0; "
              "if a failure starts at such a step, suspect the tie before the code.")
    return rep


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dump_dir")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # the reference is tiny; determinism beats speed
    try:
        rep = compare(args.dump_dir)
    except Exception:  # a malformed dump must still end in one clear FAILED line
        traceback.print_exc()
        print("compare: FAILED: internal error while comparing (traceback above)")
        return 1
    if rep.failed:
        print(f"compare: FAILED {len(rep.failed)} of {rep.count} checks: " + ", ".join(rep.failed))
        return 1
    extra = f" ({len(rep.excused)} excused by MoE routing near-ties)" if rep.excused else ""
    print(f"compare: all {rep.count} checks passed{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
