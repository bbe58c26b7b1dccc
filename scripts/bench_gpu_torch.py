#!/usr/bin/env python3
"""The GPU benchmarks of bench/bench_kernels.cu, done through PyTorch, plus
end-to-end training throughput of the two bench models; and the summary table
that compares them with this trainer.

    bench_gpu_torch.py kernels --json FILE [--quick] [--deadline S]
    bench_gpu_torch.py train   --json FILE --config configs/bench_gpt2_124m.yaml [--modes eager,compile]
    bench_gpu_torch.py all     --json FILE [--deadline S]      # kernels, then both models
        (--resume: keep FILE's results and measure only what it lacks; gpu-check.sh
         runs the benchmark during its build, stops it, and resumes it at the end)
    bench_gpu_torch.py summary --ours F --torch F [--trainer NAME=CONFIG:METRICS ...] [--out F]
    bench_gpu_torch.py selftest [--paths]                      # CPU: model sizes vs the FLOP formula;
                                                               # --paths: every benchmark at tiny shapes

Each measurement prints a line
    RESULT impl=torch name=attn_fwd backend=flash seq=4096 d=128 ... ms=0.12 tflops=456.7
with the same names, shapes and FLOP/byte counts as bench_kernels, and the
JSON file is rewritten after every measurement so a run cut short keeps what
it measured.

Counting conventions (shared with bench_kernels.cu so ratios are time ratios):
- causal attention FLOPs = 4*B*H*T*T*D/2 forward, 2.5x that backward;
- memory-bound ops report useful bytes (each input read once, each output
  written once) over time, whatever the implementation really moves;
- MFU = model FLOPs per token * tokens/s / 989e12 (H100/H200 SXM dense bf16
  peak, NVIDIA datasheet), model FLOPs per token = 6 * matmul parameters
  (head included, lookup tables excluded) + 6 * layers * seq * d_model
  (causal attention, forward and backward).
"""
import argparse
import json
import math
import os
import shlex
import statistics
import sys
import time

PEAK_BF16_FLOPS = 989e12  # H100/H200 SXM dense bf16, NVIDIA datasheet
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The device and the problem sizes. bench_kernels.cu uses the same sizes;
# `selftest` swaps in the CPU and tiny sizes to run every code path here.
DEV = "cuda"
SIZES = {
    "copy_numel": 1 << 29,          # bf16 elements: 1 GiB each way
    "gemm": 8192,                   # M = N = K
    "rms_bytes": 256 << 20,         # bf16 input bytes per call
    "rms_widths": (768, 2048, 4096),
    "adamw_params": 128 << 20,
    "ce_tokens": 8192,
    "ce_vocabs": (32000, 50304),
    "attn_tokens": 16384,           # B * T
    "attn_width": 2048,             # H * D
    "attn_seqs": (1024, 2048, 4096, 8192, 16384),
    "attn_seqs_quick": (1024, 4096, 16384),
    "attn_dims": (64, 128),
}


class _HostEvent:
    """torch.cuda.Event's timing interface for the CPU self-test."""

    def record(self):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def event(torch):
    return torch.cuda.Event(enable_timing=True) if DEV == "cuda" else _HostEvent()


def sync(torch):
    if DEV == "cuda":
        torch.cuda.synchronize()


def free_cache(torch):
    if DEV == "cuda":
        torch.cuda.empty_cache()

# ---------------------------------------------------------------------------
# results


class Report:
    def __init__(self, path, impl="torch", resume=False):
        self.path = path
        self.impl = impl
        self.device = {}
        self.results = []
        if resume and path and os.path.exists(path):
            # What a run stopped earlier measured stays; what it skipped for
            # its deadline is measured now.
            try:
                with open(path) as f:
                    old = json.load(f)
                self.results = [r for r in old.get("results", []) if r.get("status") != "skipped"]
            except (OSError, ValueError) as e:
                print(f"bench_gpu_torch: --resume: {path} unreadable ({e}); starting over", file=sys.stderr)
            print(f"bench_gpu_torch: resuming with {len(self.results)} results from {path}", flush=True)

    def done(self, name, **shape):
        """A measurement of this name and shape is already in the results."""
        return any(r.get("name") == name and all(r.get(k) == v for k, v in shape.items()) for r in self.results)

    def emit(self, **fields):
        fields = {"impl": fields.pop("impl", self.impl), **fields}
        parts = []
        for k, v in fields.items():
            if isinstance(v, float):
                v = f"{v:.6g}"
            v = str(v)
            parts.append(f"{k}={shlex.quote(v) if (' ' in v or not v) else v}")
        print("RESULT " + " ".join(parts), flush=True)
        self.results.append(fields)
        self.write()

    def write(self):
        # Written in place, not through a temporary file: $OUT brings back at
        # most 8 files, and a stray .tmp left by a kill would push one out.
        if self.path:
            with open(self.path, "w") as f:
                json.dump({"impl": self.impl, "device": self.device, "results": self.results}, f, indent=1)


class Deadline:
    """Wall-clock budget of the whole run: sections that would not finish are
    skipped (and reported as skipped) instead of being killed mid-way."""

    def __init__(self, seconds):
        self.end = time.time() + seconds if seconds else None

    def left(self):
        return float("inf") if self.end is None else self.end - time.time()


# ---------------------------------------------------------------------------
# model shapes and FLOPs, from the trainer's YAML configs


def load_model_config(path):
    import yaml

    with open(path) as f:
        cfg = yaml.safe_load(f)
    m = dict(cfg.get("model", {}))
    t = dict(cfg.get("train", {}))
    arch = m.get("arch", "llama")
    d = int(m["d_model"])
    H = int(m["n_heads"])
    Hkv = int(m.get("n_kv_heads", 0) or H)
    F = int(m.get("d_ff", 0) or 0)
    if F == 0:
        F = 4 * d if arch == "gpt2" else (8 * d // 3 + 31) // 32 * 32
    tie = str(m.get("tie_embeddings", "auto")).lower()
    tied = (arch == "gpt2") if tie == "auto" else tie == "true"
    return {
        "name": os.path.splitext(os.path.basename(path))[0],
        "arch": arch, "vocab": int(m["vocab_size"]), "d": d, "layers": int(m["n_layers"]),
        "heads": H, "kv_heads": Hkv, "d_ff": F, "max_seq": int(m.get("max_seq_len", t.get("seq_len", 1024))),
        "tied": tied, "eps": float(m.get("norm_eps", 1e-5)), "rope_theta": float(m.get("rope_theta", 10000.0)),
        "seq": int(t.get("seq_len", 1024)), "micro_batch": int(t.get("micro_batch_size", 1)),
        "global_batch": int(t.get("global_batch_size", 0) or t.get("micro_batch_size", 1)),
        "grad_clip": float(t.get("grad_clip", 1.0)),
    }


def model_flops(mc):
    """(FLOPs per token for one training step, matmul parameters, all parameters)."""
    d, L, V, H, Hkv, F, T = mc["d"], mc["layers"], mc["vocab"], mc["heads"], mc["kv_heads"], mc["d_ff"], mc["seq"]
    D = d // H
    attn = d * H * D + 2 * d * Hkv * D + H * D * d
    mlp = (2 if mc["arch"] == "gpt2" else 3) * d * F
    matmul = L * (attn + mlp) + d * V
    total = matmul
    if mc["arch"] == "gpt2":
        total += mc["max_seq"] * d                         # position table
        total += L * (3 * d + d + F + d) + L * 4 * d + 2 * d  # biases, 2 LayerNorms per layer, final LN
    else:
        total += L * 2 * d + d                             # RMSNorm weights
    if not mc["tied"]:
        total += V * d                                     # separate input embedding
    return 6 * matmul + 6 * L * T * d, matmul, total


# ---------------------------------------------------------------------------
# timing


def time_cuda(torch, fn, warmup=3, reps=20, target_ms=1500.0):
    """Median and min of reps calls, each timed by CUDA events. Slow calls get
    fewer warm-ups and reps so one measurement stays near target_ms."""
    start, stop = event(torch), event(torch)
    first = 0.0
    for i in range(max(1, warmup)):
        start.record()
        fn(i)
        stop.record()
        stop.synchronize()
        first = start.elapsed_time(stop)
        if first > 0.1 * target_ms:
            break
    n = max(3, min(reps, int(target_ms / max(first, 1e-3))))
    ts = []
    for i in range(n):
        start.record()
        fn(i)
        stop.record()
        stop.synchronize()
        ts.append(start.elapsed_time(stop))
    return statistics.median(ts), min(ts), n


def rotation_copies(torch, bytes_per_call):
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20) if DEV == "cuda" else 1 << 20
    return max(1, -(-4 * l2 // int(bytes_per_call)))


def nonfinite(torch, *tensors):
    bad = []
    for name, t in tensors:
        n = int((~torch.isfinite(t.float())).sum().item())
        if n:
            bad.append(f"{name}:{n}/{t.numel()}")
    return ",".join(bad) if bad else "none"


# ---------------------------------------------------------------------------
# kernels


def bench_kernels(torch, rep, dl, quick=False, reps=20):
    import torch.nn.functional as F

    dev = DEV
    bf16 = torch.bfloat16

    def run(name, fn, **shape):
        """fn() returns a list of dicts, the fields of one RESULT each; an
        exception becomes one error RESULT, and the next measurement runs."""
        if rep.done(name, **shape):
            return
        try:
            for rec in fn():
                rep.emit(name=name, **shape, **rec)
        except Exception as e:  # one failing backend must not end the run
            msg = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            print(f"bench_gpu_torch: {name} {shape} failed: {msg}", file=sys.stderr, flush=True)
            rep.emit(name=name, **shape, status="error", error=msg)
        finally:
            free_cache(torch)

    def bw(ms, mn, n, nbytes, copies, bad, **extra):
        return dict(extra, ms=ms, min_ms=mn, reps=n, bytes=float(nbytes), gbps=nbytes / (ms * 1e-3) / 1e9,
                    copies=copies, nonfinite=bad, status="ok" if bad == "none" else "nonfinite")

    # --- ceilings: copy and GEMM ---
    def copy():
        n = SIZES["copy_numel"]
        src = torch.empty(n, dtype=bf16, device=dev).uniform_(-1, 1)
        dst = torch.full((n,), float("nan"), dtype=bf16, device=dev)
        dst.copy_(src)
        bad = nonfinite(torch, ("dst", dst))
        ms, mn, r = time_cuda(torch, lambda i: dst.copy_(src), reps=reps)
        return [bw(ms, mn, r, 2 * n * 2, 1, bad, what="Tensor.copy_ D2D", numel=n)]

    def gemm():
        M = N = K = SIZES["gemm"]
        a = torch.empty(M, K, dtype=bf16, device=dev).uniform_(-1, 1)
        w = torch.empty(N, K, dtype=bf16, device=dev).uniform_(-1, 1)
        out = F.linear(a, w)
        bad = nonfinite(torch, ("out", out))
        ms, mn, r = time_cuda(torch, lambda i: F.linear(a, w), reps=reps)
        fl = 2.0 * M * N * K
        return [dict(what="F.linear bf16 (cuBLAS)", m=M, n=N, k=K, ms=ms, min_ms=mn, reps=r, flops=fl,
                     tflops=fl / (ms * 1e-3) / 1e12, nonfinite=bad, status="ok" if bad == "none" else "nonfinite")]

    run("copy", copy)
    run("gemm", gemm)

    # --- RMSNorm forward: eager and compiled ---
    compiled_rms = None
    if dl.left() > 60:
        compiled_rms = torch.compile(lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-5), dynamic=False)
    for C in SIZES["rms_widths"]:
        def rms(C=C):
            N = SIZES["rms_bytes"] // (C * 2)
            nbytes = 2 * N * C * 2 + N * 4 + C * 2  # same useful bytes as ours (which also writes rstd)
            copies = rotation_copies(torch, nbytes)
            xs = [torch.empty(N, C, dtype=bf16, device=dev).uniform_(-2, 2) for _ in range(copies)]
            w = torch.empty(C, dtype=bf16, device=dev).uniform_(0.5, 1.5)
            recs = []
            variants = [("eager", lambda x: F.rms_norm(x, (C,), w, 1e-5))]
            if compiled_rms is not None:
                variants.append(("compile", lambda x: compiled_rms(x, w)))
            for mode, f in variants:
                bad = nonfinite(torch, ("out", f(xs[0])))
                ms, mn, r = time_cuda(torch, lambda i: f(xs[i % copies]), reps=reps)
                recs.append(bw(ms, mn, r, nbytes, copies, bad, mode=mode))
            return recs
        run("rmsnorm_fwd", rms, tokens=SIZES["rms_bytes"] // (C * 2), c=C)

    # --- fused AdamW: fp32 params and grads move 28 B/param, as ours ---
    def adamw():
        n = SIZES["adamw_params"]
        p = torch.nn.Parameter(torch.empty(n, device=dev).uniform_(-0.05, 0.05))
        p.grad = torch.empty(n, device=dev).uniform_(-1e-2, 1e-2)
        opt = torch.optim.AdamW([p], lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
        opt.step()
        st = opt.state[p]
        bad = nonfinite(torch, ("param", p.detach()), ("m", st["exp_avg"]), ("v", st["exp_avg_sq"]))
        ms, mn, r = time_cuda(torch, lambda i: opt.step(), reps=reps)
        return [bw(ms, mn, r, 28 * n, 1, bad, what="torch.optim.AdamW(fused=True) fp32", params=n,
                   bytes_per_param=28)]

    run("adamw", adamw)

    # --- cross-entropy forward + backward (the gradient w.r.t. the logits) ---
    compiled_ce = None
    if dl.left() > 60:
        compiled_ce = torch.compile(lambda x, t: F.cross_entropy(x.float(), t, reduction="mean"), dynamic=False)
    for V in SIZES["ce_vocabs"]:
        def ce(V=V):
            N = SIZES["ce_tokens"]
            nbytes = N * V * 2 * 2 + N * 8
            logits = torch.empty(N, V, dtype=bf16, device=dev).uniform_(-4, 4).requires_grad_()
            tgt = torch.randint(0, V, (N,), device=dev)
            recs = []
            variants = [("eager", lambda: F.cross_entropy(logits, tgt, reduction="mean"))]
            if compiled_ce is not None:
                variants.append(("compile", lambda: compiled_ce(logits, tgt)))
            for mode, f in variants:
                def step(i, f=f):
                    return torch.autograd.grad(f(), logits)[0]
                g = step(0)
                bad = nonfinite(torch, ("dlogits", g))
                ms, mn, r = time_cuda(torch, step, reps=reps)
                recs.append(bw(ms, mn, r, nbytes, 1, bad, mode=mode))
            return recs
        run("cross_entropy", ce, tokens=SIZES["ce_tokens"], vocab=V)

    # --- attention: each SDPA backend, forward and forward+backward ---
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    seqs = SIZES["attn_seqs_quick"] if quick else SIZES["attn_seqs"]
    for D in SIZES["attn_dims"]:
        for T in seqs:
            B, H = max(1, SIZES["attn_tokens"] // T), SIZES["attn_width"] // D
            fwd_flops = 4.0 * B * H * T * T * D / 2
            bwd_flops = 2.5 * fwd_flops
            shape = dict(seq=T, d=D, batch=B, heads=H, causal=1)
            if all(rep.done("attn_fwdbwd", backend=b, **shape) for b, _ in backends):
                continue
            if dl.left() < 20:
                rep.emit(name="attn_fwd", **shape, status="skipped", error="deadline")
                continue
            # Our layout, [B, T, H, D], seen by SDPA as [B, H, T, D] strided views.
            q, k, v, do = (torch.empty(B, T, H, D, dtype=bf16, device=dev).uniform_(-1, 1) for _ in range(4))
            qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
            for bname, backend in backends:
                if rep.done("attn_fwdbwd", backend=bname, **shape):
                    continue

                def attn(bname=bname, backend=backend):
                    recs = []
                    with sdpa_kernel(backend):
                        def fwd(i):
                            with torch.no_grad():
                                return F.scaled_dot_product_attention(
                                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)

                        def fwdbwd(i):
                            o = F.scaled_dot_product_attention(
                                qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2), is_causal=True)
                            return torch.autograd.grad(o, (qg, kg, vg), do.transpose(1, 2))

                        bad = nonfinite(torch, ("out", fwd(0)))
                        ms_f, mn_f, r_f = time_cuda(torch, fwd, reps=reps)
                        recs.append(dict(name="attn_fwd", backend=bname, ms=ms_f, min_ms=mn_f, reps=r_f,
                                         flops=fwd_flops, tflops=fwd_flops / (ms_f * 1e-3) / 1e12, nonfinite=bad,
                                         status="ok" if bad == "none" else "nonfinite"))
                        gq, gk, gv = fwdbwd(0)
                        bad = nonfinite(torch, ("dq", gq), ("dk", gk), ("dv", gv))
                        del gq, gk, gv
                        ms_b, mn_b, r_b = time_cuda(torch, fwdbwd, reps=reps)
                        st = "ok" if bad == "none" else "nonfinite"
                        recs.append(dict(name="attn_fwdbwd", backend=bname, ms=ms_b, min_ms=mn_b, reps=r_b,
                                         flops=fwd_flops + bwd_flops,
                                         tflops=(fwd_flops + bwd_flops) / (ms_b * 1e-3) / 1e12,
                                         nonfinite=bad, status=st))
                        # Backward alone = (forward + backward) - forward, both medians.
                        ms_d = max(ms_b - ms_f, 1e-6)
                        recs.append(dict(name="attn_bwd", backend=bname, ms=ms_d, min_ms=max(mn_b - mn_f, 1e-6),
                                         reps=min(r_f, r_b), flops=bwd_flops,
                                         tflops=bwd_flops / (ms_d * 1e-3) / 1e12, nonfinite=bad, status=st,
                                         derived="fwdbwd-fwd"))
                    return recs

                # run() names the record; the name inside each record wins.
                try:
                    for rec in attn():
                        rep.emit(name=rec.pop("name"), **shape, **rec)
                except Exception as e:
                    msg = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                    print(f"bench_gpu_torch: attention {bname} {shape} failed: {msg}", file=sys.stderr, flush=True)
                    rep.emit(name="attn_fwd", backend=bname, **shape, status="error", error=msg)
            del q, k, v, do, qg, kg, vg
            free_cache(torch)


# ---------------------------------------------------------------------------
# end-to-end models (the trainer's math: docs/MODEL_MATH.md)


def build_model(torch, mc, sdpa=None):
    import torch.nn as nn
    import torch.nn.functional as F

    sdpa = sdpa or F.scaled_dot_product_attention
    d, H, Hkv, Fd, V, L = mc["d"], mc["heads"], mc["kv_heads"], mc["d_ff"], mc["vocab"], mc["layers"]
    D = d // H
    eps = mc["eps"]

    def rms_norm(x, w):
        if hasattr(F, "rms_norm"):
            return F.rms_norm(x, (x.shape[-1],), w, eps)
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * w

    class GPT2Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d, eps=eps), nn.LayerNorm(d, eps=eps)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.fc_proj = nn.Linear(d, Fd), nn.Linear(Fd, d)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, H, D).unbind(2)
            y = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, d))
            return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class LlamaBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))
            self.wq, self.wk = nn.Linear(d, H * D, bias=False), nn.Linear(d, Hkv * D, bias=False)
            self.wv, self.wo = nn.Linear(d, Hkv * D, bias=False), nn.Linear(H * D, d, bias=False)
            self.w_gate, self.w_up = nn.Linear(d, Fd, bias=False), nn.Linear(d, Fd, bias=False)
            self.w_down = nn.Linear(Fd, d, bias=False)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            h = rms_norm(x, self.n1)
            q = self.wq(h).view(B, T, H, D)
            k = self.wk(h).view(B, T, Hkv, D)
            v = self.wv(h).view(B, T, Hkv, D)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            if Hkv != H:
                # Materialised K/V repeats keep every SDPA backend eligible;
                # enable_gqa is not supported by all of them.
                k = k.repeat_interleave(H // Hkv, dim=1)
                v = v.repeat_interleave(H // Hkv, dim=1)
            y = sdpa(q, k, v, is_causal=True)
            x = x + self.wo(y.transpose(1, 2).reshape(B, T, d))
            h = rms_norm(x, self.n2)
            return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))

    def rope(x, cos, sin):
        # Half-split pairs (x[i], x[i + D/2]), as the trainer's rope_forward;
        # in the activations' dtype (bf16 under autocast), as the trainer.
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, d)
            self.gpt2 = mc["arch"] == "gpt2"
            if self.gpt2:
                self.wpe = nn.Embedding(mc["max_seq"], d)
                self.ln_f = nn.LayerNorm(d, eps=eps)
                self.blocks = nn.ModuleList(GPT2Block() for _ in range(L))
            else:
                self.n_f = nn.Parameter(torch.ones(d))
                self.blocks = nn.ModuleList(LlamaBlock() for _ in range(L))
                inv = mc["rope_theta"] ** (-torch.arange(0, D // 2, dtype=torch.float64) * 2 / D)
                ang = torch.arange(mc["seq"], dtype=torch.float64)[:, None] * inv[None, :]
                self.register_buffer("cos", ang.cos().float()[None, :, None, :], persistent=False)
                self.register_buffer("sin", ang.sin().float()[None, :, None, :], persistent=False)
            self.head = None if mc["tied"] else nn.Linear(d, V, bias=False)
            for n_, p in self.named_parameters():
                if p.dim() >= 2:
                    nn.init.normal_(p, std=0.02)
            self.head_loss = self._head_loss

        def _head_loss(self, x, targets):
            x = F.layer_norm(x, (d,), self.ln_f.weight, self.ln_f.bias, eps) if self.gpt2 else rms_norm(x, self.n_f)
            w = self.wte.weight if self.head is None else self.head.weight
            logits = F.linear(x, w)
            return F.cross_entropy(logits.float().reshape(-1, V), targets.reshape(-1))

        def forward(self, idx, targets):
            T = idx.shape[1]
            x = self.wte(idx)
            if self.gpt2:
                x = x + self.wpe(torch.arange(T, device=idx.device))
                for b in self.blocks:
                    x = b(x)
            else:
                cos, sin = self.cos[:, :T], self.sin[:, :T]
                for b in self.blocks:
                    x = b(x, cos, sin)
            return self.head_loss(x, targets)

    return Model()


def bench_train(torch, rep, dl, config, modes=("eager", "compile"), warmup=3, steps=10, override=None):
    mc = dict(load_model_config(config), **(override or {}))
    flops_tok, n_matmul, n_total = model_flops(mc)
    B, T = mc["micro_batch"], mc["seq"]
    for mode in modes:
        # Seconds a run needs at the least: compiled ones also compile (regional,
        # ~1 min); past the deadline the whole process is killed, and what the
        # JSON holds by then is what remains.
        need = 30 if mode == "eager" else 100
        base = dict(name="train", model=mc["name"], mode=mode, batch=B, seq=T)
        if rep.done(**base):
            continue
        if dl.left() < need:
            rep.emit(**base, status="skipped", error=f"deadline ({dl.left():.0f} s left, {need} s needed)")
            continue
        model = opt = None
        try:
            torch.manual_seed(0)
            with torch.device(DEV):  # initialised on the GPU: seconds faster for 1B parameters
                model = build_model(torch, mc)
            params = sum(p.numel() for p in model.parameters())
            if mode == "compile":
                # Regional compilation: every block shares one compiled graph,
                # so compile time does not grow with depth; head + loss is a
                # second region (it fuses the fp32 upcast into the loss).
                for b in model.blocks:
                    b.compile()
                model.head_loss = torch.compile(model._head_loss)
            decay = [p for p in model.parameters() if p.dim() >= 2]
            other = [p for p in model.parameters() if p.dim() < 2]
            opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                                    lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
            gen = torch.Generator(device=DEV).manual_seed(1)
            batches = [torch.randint(0, mc["vocab"], (B, T + 1), device=DEV, generator=gen) for _ in range(4)]

            def step(i):
                xy = batches[i % len(batches)]
                with torch.autocast(DEV, dtype=torch.bfloat16):
                    loss = model(xy[:, :-1], xy[:, 1:])
                loss.backward()
                if mc["grad_clip"] > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), mc["grad_clip"], foreach=True)
                opt.step()
                opt.zero_grad(set_to_none=True)
                return loss

            t0 = time.time()
            for i in range(warmup):
                loss = step(i)
            sync(torch)
            warm_s = time.time() - t0
            first_loss = float(loss.item())
            start, stop = event(torch), event(torch)
            # Fewer timed steps when the deadline is near, but at least 3.
            per_step = warm_s / max(1, warmup)
            n = steps
            if mode == "eager" and dl.end is not None:
                n = max(3, min(steps, int((dl.left() - 10) / max(per_step, 1e-3))))
            start.record()
            for i in range(n):
                loss = step(warmup + i)
            stop.record()
            stop.synchronize()
            ms = start.elapsed_time(stop) / n
            tok_s = B * T / (ms * 1e-3)
            last = float(loss.item())
            st = "ok" if math.isfinite(last) else "nonfinite"
            rep.emit(**base, params=params, params_expected=n_total, matmul_params=n_matmul,
                     flops_per_token=float(flops_tok), ms_per_step=ms, tokens_per_s=tok_s,
                     mfu=flops_tok * tok_s / PEAK_BF16_FLOPS, steps=n, warmup_s=warm_s,
                     loss_first=first_loss, loss_last=last,
                     peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30 if DEV == "cuda" else 0.0, status=st)
        except Exception as e:
            msg = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            print(f"bench_gpu_torch: train {mc['name']} {mode} failed: {msg}", file=sys.stderr, flush=True)
            rep.emit(**base, status="error", error=msg)
        finally:
            del model, opt
            free_cache(torch)
            if DEV == "cuda":
                torch.cuda.reset_peak_memory_stats()
            if mode == "compile":
                torch._dynamo.reset()


# ---------------------------------------------------------------------------
# summary: ours vs torch


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"summary: cannot read {path}: {e}", file=sys.stderr)
        return {"results": []}


def trainer_throughput(metrics_path, skip=5):
    """Median ms/step of the steps after the first `skip` (allocation, cuBLASLt
    heuristics and first-touch costs), from metrics.jsonl with log.interval 1."""
    rows = []
    try:
        with open(metrics_path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if "ms_per_step" in r:
                    rows.append(r)
    except OSError:
        return None
    if not rows:
        return None
    use = rows[skip:] if len(rows) > skip + 2 else rows[len(rows) // 2:]
    ms = statistics.median(r["ms_per_step"] for r in use)
    return {"ms_per_step": ms, "steps": len(rows), "timed_steps": len(use),
            "loss_first": rows[0].get("loss"), "loss_last": rows[-1].get("loss")}


def fmt(x, digits=1):
    if x is None:
        return "—"
    if isinstance(x, str):
        return x
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def summary(args):
    ours = read_json(args.ours)["results"] if args.ours else []
    theirs = read_json(args.torch)["results"] if args.torch else []
    lines = []

    def key(r):
        return tuple(str(r.get(k, "")) for k in ("name", "seq", "d", "c", "vocab"))

    def ok(r):
        return r.get("status") == "ok"

    # Best torch value per measurement (over backends and eager/compile).
    best = {}
    for r in theirs:
        if not ok(r) or r.get("name") == "train":
            continue
        metric = "tflops" if "tflops" in r else "gbps"
        k = key(r)
        if k not in best or r[metric] > best[k][metric]:
            best[k] = r
    def impl_of(t):
        return t.get("backend") or t.get("mode") or t.get("what", "")

    def cell(r):
        """Our value, or why there is none."""
        if r is None:
            return "not run"
        if not ok(r):
            return f"{r.get('status')}: {str(r.get('error') or r.get('nonfinite', ''))[:50]}"
        return fmt(r.get("tflops", r.get("gbps")))

    def ratio(r, t):
        m = "tflops" if r is not None and "tflops" in r else "gbps"
        if r is None or t is None or not ok(r) or not t.get(m):
            return "—"
        return f"{r[m] / t[m]:.2f}"

    mine = {}
    for r in ours:
        if r.get("name"):
            mine.setdefault(key(r), r)

    # Bandwidth-bound kernels and the two ceilings: one row each.
    lines.append("### Kernels: this trainer vs PyTorch (best of eager / compiled / backends)")
    lines.append("")
    lines.append("| kernel | shape | unit | ours | torch | torch impl | ours / torch |")
    lines.append("|---|---|---|---|---|---|---|")
    rows = [k for k in mine if not k[0].startswith("attn")]
    rows += [k for k in best if not k[0].startswith("attn") and k not in mine]
    for k in rows:
        r, t = mine.get(k), best.get(k)
        any_ = r or t
        shape = " ".join(f"{s}={any_[s]}" for s in ("c", "tokens", "vocab", "params", "m", "n", "k", "numel")
                         if s in any_)
        unit = "TFLOP/s" if "tflops" in (r if r and ok(r) else t or {}) else "GB/s"
        lines.append(f"| {k[0]} | {shape} | {unit} | {cell(r)} | {fmt(t.get('tflops', t.get('gbps'))) if t else '—'} "
                     f"| {impl_of(t) if t else ''} | {ratio(r, t)} |")
    lines.append("")

    # Attention: one row per shape, forward and backward side by side.
    shapes = []
    for k in list(mine) + list(best):
        if k[0].startswith("attn") and (k[1], k[2]) not in shapes:
            shapes.append((k[1], k[2]))
    if shapes:
        shapes.sort(key=lambda x: (int(x[1] or 0), int(x[0] or 0)))
        lines.append("Causal attention, bf16, TFLOP/s (torch: best SDPA backend; bwd = fwd+bwd minus fwd for torch)")
        lines.append("")
        lines.append("| d | seq | fwd ours | fwd torch | ratio | bwd ours | bwd torch | ratio |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for seq, d in shapes:
            row = [d, seq]
            for name in ("attn_fwd", "attn_bwd"):
                k = (name, seq, d, "", "")
                r, t = mine.get(k), best.get(k)
                row += [cell(r), (f"{fmt(t['tflops'])} ({impl_of(t)})" if t else "—"), ratio(r, t)]
            lines.append("| " + " | ".join(str(x) for x in row) + " |")
        lines.append("")

    # End to end.
    lines.append(f"### End to end: training tokens/s (MFU against {PEAK_BF16_FLOPS / 1e12:.0f} TFLOP/s dense bf16)")
    lines.append("")
    lines.append("| model | params | tokens/step | ours | torch eager | torch compiled |")
    lines.append("|---|---|---|---|---|---|")
    trainer_runs = {}
    for spec in args.trainer or []:
        name, _, rest = spec.partition("=")
        cfg, _, metrics = rest.partition(":")
        trainer_runs[name] = (cfg, metrics)
    models = []
    for name, (cfg, metrics) in trainer_runs.items():
        models.append((name, cfg, metrics))
    for r in theirs:
        if r.get("name") == "train" and r.get("model") not in [m[0] for m in models]:
            models.append((r["model"], None, None))
    for name, cfg, metrics in models:
        mc = None
        if cfg and os.path.exists(cfg):
            mc = load_model_config(cfg)
        cells = []
        if mc:
            flops_tok, _, n_total = model_flops(mc)
            tokens_step = mc["global_batch"] * mc["seq"]
            th = trainer_throughput(metrics) if metrics else None
            if th:
                tok_s = tokens_step / (th["ms_per_step"] * 1e-3)
                cells.append(f"{fmt(tok_s)} ({100 * flops_tok * tok_s / PEAK_BF16_FLOPS:.1f}%)")
            else:
                cells.append("did not run")
        else:
            n_total, tokens_step = None, None
            cells.append("—")
        for mode in ("eager", "compile"):
            rr = [r for r in theirs if r.get("name") == "train" and r.get("model") == name and r.get("mode") == mode]
            if rr and ok(rr[-1]):
                cells.append(f"{fmt(rr[-1]['tokens_per_s'])} ({100 * rr[-1]['mfu']:.1f}%)")
                n_total = n_total or rr[-1].get("params")
                tokens_step = tokens_step or rr[-1]["batch"] * rr[-1]["seq"]
            elif rr:
                cells.append(f"{rr[-1].get('status')}: {str(rr[-1].get('error', ''))[:40]}")
            else:
                cells.append("—")
        params = (f"{n_total / 1e9:.2f}B" if n_total >= 1e9 else f"{n_total / 1e6:.0f}M") if n_total else "—"
        tstep = f"{tokens_step:,}" if tokens_step else "—"
        lines.append(f"| {name} | {params} | {tstep} | " + " | ".join(cells) + " |")
    lines.append("")
    errs = [r for r in ours if not ok(r)]
    if errs:
        lines.append(f"Our failures ({len(errs)}; details in bench_kernels.json):")
        for r in errs[:8]:
            where = " ".join(f"{s}={r[s]}" for s in ("seq", "d", "c", "vocab") if s in r)
            lines.append(f"- {r.get('name')} {where}: {r.get('status')}: "
                         f"{str(r.get('error') or r.get('nonfinite', ''))[:150]}")
        lines.append("")
    ceil = [r for r in ours if r.get("name") in ("gemm", "copy") and ok(r)]
    if ceil:
        lines.append("Ceilings measured by bench_kernels: " + ", ".join(
            f"{r['name']} {fmt(r.get('tflops') or r.get('gbps'))} {'TFLOP/s' if 'tflops' in r else 'GB/s'}"
            for r in ceil) + ".")
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text, end="")
    return 0


# ---------------------------------------------------------------------------
# CPU self-test: the model code paths at tiny sizes (no GPU needed)


def selftest(args):
    import torch
    import torch.nn.functional as F

    def sdpa_math(q, k, v, is_causal=True):
        T = q.shape[-2]
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return s.softmax(-1) @ v

    failures = 0
    for cfg in ("configs/bench_gpt2_124m.yaml", "configs/bench_llama_1b.yaml"):
        mc = load_model_config(os.path.join(REPO, cfg))
        flops_tok, n_matmul, n_total = model_flops(mc)
        # Full-size parameter count against the torch model, built on the meta device.
        with torch.device("meta"):
            n_torch = sum(p.numel() for p in build_model(torch, mc).parameters())
        print(f"{mc['name']}: params torch {n_torch:,} formula {n_total:,} matmul {n_matmul:,} "
              f"flops/token {flops_tok / 1e9:.3f} GFLOP")
        if n_torch != n_total:
            print("  MISMATCH between the torch model and the FLOP formula's parameter count")
            failures += 1
        # Tiny copy: one training step in fp32 on the CPU, eager and (if asked) compiled.
        small = dict(mc, d=64, layers=2, heads=4, kv_heads=2 if mc["kv_heads"] != mc["heads"] else 4,
                     d_ff=128, vocab=128, seq=16, max_seq=16, micro_batch=2)
        sdpa = getattr(F, "scaled_dot_product_attention", None) or sdpa_math
        model = build_model(torch, small, sdpa=sdpa)
        idx = torch.randint(0, small["vocab"], (2, 17))
        loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        print(f"  tiny {mc['arch']}: loss {loss.item():.4f} (ln V = {math.log(small['vocab']):.4f})")
        if not abs(loss.item() - math.log(small["vocab"])) < 0.5:
            failures += 1
    if not args.paths:
        return 1 if failures else 0

    # Every benchmark code path on the CPU at tiny sizes (needs torch >= 2.5:
    # F.rms_norm, torch.nn.attention, fused AdamW on the CPU). Backends that
    # exist only on a GPU report errors, which exercises the error path.
    global DEV
    DEV = "cpu"
    SIZES.update(copy_numel=1 << 16, gemm=128, rms_bytes=1 << 18, rms_widths=(256,), adamw_params=1 << 16,
                 ce_tokens=64, ce_vocabs=(512,), attn_tokens=256, attn_width=128, attn_seqs=(64, 128),
                 attn_seqs_quick=(64,), attn_dims=(32, 64))
    out = args.json or os.path.join("/tmp", "bench_gpu_torch_selftest.json")
    rep = Report(out)
    rep.device = {"name": "cpu selftest", "torch": torch.__version__}
    bench_kernels(torch, rep, Deadline(0), quick=False, reps=3)
    tiny = dict(d=64, layers=2, heads=4, d_ff=128, vocab=256, seq=32, max_seq=32, micro_batch=2, global_batch=2)
    for cfg in ("configs/bench_gpt2_124m.yaml", "configs/bench_llama_1b.yaml"):
        over = dict(tiny, kv_heads=2 if "llama" in cfg else 4)
        bench_train(torch, rep, Deadline(0), os.path.join(REPO, cfg), modes=args.modes.split(","), warmup=2,
                    steps=3, override=over)
    names = {(r.get("name"), r.get("status")) for r in rep.results}
    print(f"selftest: {len(rep.results)} results in {out}")
    for need in ("copy", "gemm", "rmsnorm_fwd", "adamw", "cross_entropy", "attn_fwd", "attn_bwd", "attn_fwdbwd",
                 "train"):
        if (need, "ok") not in names:
            print(f"selftest: no ok result for {need}")
            failures += 1
    return 1 if failures else 0


# ---------------------------------------------------------------------------


def device_info(torch):
    p = torch.cuda.get_device_properties(0)
    return {"name": p.name, "sm": f"{p.major}.{p.minor}", "sms": p.multi_processor_count,
            "l2_bytes": getattr(p, "L2_cache_size", 0), "memory_bytes": p.total_memory,
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("kernels", "train", "all"):
        p = sub.add_parser(name)
        p.add_argument("--json", default="")
        p.add_argument("--deadline", type=float, default=0, help="wall-clock budget in seconds (0: none)")
        p.add_argument("--quick", action="store_true", help="attention at 1k, 4k, 16k only")
        p.add_argument("--reps", type=int, default=20)
        p.add_argument("--config", action="append", default=[],
                       help="model config for train/all (repeatable; default: both bench configs)")
        p.add_argument("--modes", default="eager,compile")
        p.add_argument("--steps", type=int, default=10)
        p.add_argument("--resume", action="store_true",
                       help="keep the results already in --json and measure only the missing ones")
    p = sub.add_parser("summary")
    p.add_argument("--ours", default="")
    p.add_argument("--torch", default="")
    p.add_argument("--trainer", action="append", help="NAME=CONFIG:METRICS_JSONL (repeatable)")
    p.add_argument("--out", default="")
    p = sub.add_parser("selftest")
    p.add_argument("--paths", action="store_true",
                   help="also run every benchmark and both models on the CPU at tiny sizes")
    p.add_argument("--modes", default="eager,compile")
    p.add_argument("--json", default="")
    args = ap.parse_args()

    if args.cmd == "summary":
        return summary(args)
    if args.cmd == "selftest":
        return selftest(args)

    import torch

    if not torch.cuda.is_available():
        print("bench_gpu_torch: no CUDA device visible to PyTorch", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = True
    dl = Deadline(args.deadline)
    rep = Report(args.json, resume=args.resume)
    rep.device = device_info(torch)
    print("device: " + ", ".join(f"{k} {v}" for k, v in rep.device.items()), flush=True)
    if args.cmd in ("kernels", "all"):
        # Kernels leave a minute for the eager models, the comparison that
        # matters most after the kernels; compiled models take what is left.
        kdl = Deadline(max(30.0, dl.left() - 60)) if dl.end and args.cmd == "all" else dl
        bench_kernels(torch, rep, kdl, quick=args.quick, reps=args.reps)
    if args.cmd in ("train", "all"):
        configs = args.config or [os.path.join(REPO, "configs/bench_gpt2_124m.yaml"),
                                  os.path.join(REPO, "configs/bench_llama_1b.yaml")]
        modes = [m for m in args.modes.split(",") if m]
        # Eager for every model first: compiled runs are the first to go when time is short.
        for mode in ("eager", "compile"):
            if mode in modes:
                for c in configs:
                    bench_train(torch, rep, dl, c, modes=(mode,), steps=args.steps)
    bad = [r for r in rep.results if r.get("status") not in ("ok", "skipped")]
    print(f"bench_gpu_torch: {len(rep.results)} results, {len(bad)} not ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
