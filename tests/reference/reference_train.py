"""Reference optimizer step of docs/MODEL_MATH.md ("Loss" and "Optimizer step").

Uses torch.optim.AdamW itself because the contract defines the trainer's AdamW
as "exactly torch.optim.AdamW"; the reference must not re-derive it.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reference_model import cfg_get


@dataclass
class TrainSpec:
    steps: int
    grad_clip: float
    lr: float
    min_lr: float
    warmup_steps: int
    schedule: str
    decay_steps: int
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    optimizer: str


def train_spec_from_config(cfg):
    o = lambda key, default: cfg_get(cfg, "optim." + key, default)  # noqa: E731
    steps = int(cfg_get(cfg, "train.steps", 100))
    spec = TrainSpec(
        steps=steps,
        grad_clip=float(cfg_get(cfg, "train.grad_clip", 1.0)),
        lr=float(o("lr", 3e-4)),
        min_lr=float(o("min_lr", 0.0)),
        warmup_steps=int(o("warmup_steps", 0)),
        schedule=str(o("schedule", "cosine")),
        decay_steps=int(o("decay_steps", 0)) or steps,
        beta1=float(o("beta1", 0.9)),
        beta2=float(o("beta2", 0.95)),
        eps=float(o("eps", 1e-8)),
        weight_decay=float(o("weight_decay", 0.1)),
        optimizer=str(o("name", "adamw")),
    )
    if spec.optimizer != "adamw":
        raise ValueError(f"the reference implements only optim.name=adamw, got {spec.optimizer!r}")
    if spec.schedule not in ("cosine", "linear", "constant"):
        raise ValueError(f"unknown optim.schedule {spec.schedule!r}")
    return spec


def lr_at(step, ts):
    """Learning rate of 0-based optimizer step `step`."""
    W, S = ts.warmup_steps, ts.decay_steps
    if step < W:
        return ts.lr * (step + 1) / W
    if ts.schedule == "constant":
        return ts.lr
    # S <= W leaves no decay interval; the contract's formula divides by zero
    # there, and "already fully decayed" is its limit from above.
    r = 1.0 if S <= W else min(max((step - W) / (S - W), 0.0), 1.0)
    if ts.schedule == "cosine":
        return ts.min_lr + 0.5 * (ts.lr - ts.min_lr) * (1.0 + math.cos(math.pi * r))
    return ts.lr - (ts.lr - ts.min_lr) * r


class ReferenceTrainer:
    def __init__(self, model, ts):
        self.model = model
        self.ts = ts
        params = list(model.params.values())
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": ts.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=ts.lr, betas=(ts.beta1, ts.beta2), eps=ts.eps)

    def forward_backward(self, inputs, targets, keep_first_logits=False):
        """Accumulate gradients of one optimizer step's loss over M micro-batches.

        inputs/targets: [M, B, T]. Returns (lm_loss, aux_loss, first_logits, stats)."""
        model, spec = self.model, self.model.spec
        M, B, T = inputs.shape
        total_tokens = M * B * T
        for p in model.params.values():
            p.grad = None
        lm_sum = 0.0
        aux_sum = 0.0
        first_logits = None
        stats = {"min_margin": float("inf"), "dropped": 0}
        for m in range(M):
            logits, aux = model.forward(inputs[m])
            if keep_first_logits and m == 0:
                first_logits = logits.detach().clone()
            ce_sum = F.cross_entropy(logits, targets[m].reshape(-1).long(), reduction="sum")
            # Per-micro-batch pieces of lm_loss + coeff * aux_loss, so that the
            # accumulated gradient is exactly that of the step's loss.
            loss = ce_sum / total_tokens + spec.aux_loss_coeff * aux / M
            loss.backward()
            lm_sum += float(ce_sum.detach())
            aux_sum += float(aux.detach())
            st = model.last_stats
            if "min_margin" in st:
                stats["min_margin"] = min(stats["min_margin"], st["min_margin"])
                stats["dropped"] += st["dropped"]
        for p in model.params.values():
            if p.grad is None:  # e.g. an expert no token reached: gradient is zero
                p.grad = torch.zeros_like(p)
        return lm_sum / total_tokens, aux_sum / M, first_logits, stats

    def grads(self):
        return {name: p.grad.detach().clone() for name, p in self.model.params.items()}

    def step(self, s, inputs, targets, keep_first_logits=False, keep_grads=False):
        """One full optimizer step; returns a record like one entry of losses.json."""
        lm, aux, first_logits, stats = self.forward_backward(inputs, targets, keep_first_logits)
        grads = self.grads() if keep_grads else None  # before clipping, as dumped
        params = list(self.model.params.values())
        norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in params))
        if self.ts.grad_clip > 0:
            scale = min(1.0, self.ts.grad_clip / (norm + 1e-6))
            for p in params:
                p.grad.mul_(scale)
        lr = lr_at(s, self.ts)
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.opt.step()
        return {"lm_loss": lm, "aux_loss": aux, "lr": lr, "grad_norm": norm,
                "logits": first_logits, "grads": grads, "stats": stats}
