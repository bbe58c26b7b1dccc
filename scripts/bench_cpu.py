#!/usr/bin/python3
"""CPU training-step benchmark: this trainer vs PyTorch eager, same model, same threads.

Times full optimizer steps (forward, backward, AdamW) of one LLaMA-style
model in both, median over the timed steps after warm-up, and writes the
table into docs/PERFORMANCE.md between the CPU-benchmark markers.
Run with Debian's python3 (it has torch): /usr/bin/python3 scripts/bench_cpu.py
"""
import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

# The trainer runs its OpenMP threads with a passive wait policy (trainer/main.cpp);
# PyTorch gets the same, which is also PyTorch's faster setting on this machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- cpu-bench:begin -->", "<!-- cpu-bench:end -->"

MODEL = dict(d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, vocab=256, seq=256, micro=8)


def llama_ffn(d):
    return (8 * d // 3 + 31) // 32 * 32


class Norm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))


class TorchLlama(torch.nn.Module):
    """Plain eager PyTorch LLaMA of the same shapes as the trainer's."""

    def __init__(self, d_model, n_layers, n_heads, n_kv_heads, vocab, seq, **_):
        super().__init__()
        self.h, self.kv, self.dh = n_heads, n_kv_heads, d_model // n_heads
        f = llama_ffn(d_model)
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)
        self.emb = torch.nn.Embedding(vocab, d_model)
        self.layers = torch.nn.ModuleList()
        for _ in range(n_layers):
            self.layers.append(torch.nn.ModuleDict(dict(
                n1=Norm(d_model), wq=lin(d_model, d_model),
                wk=lin(d_model, n_kv_heads * self.dh), wv=lin(d_model, n_kv_heads * self.dh),
                wo=lin(d_model, d_model), n2=Norm(d_model),
                g=lin(d_model, f), u=lin(d_model, f), dn=lin(f, d_model))))
        self.norm = Norm(d_model)
        self.head = lin(d_model, vocab)
        t = torch.arange(seq, dtype=torch.float32)
        inv = 10000.0 ** (-torch.arange(0, self.dh, 2, dtype=torch.float32) / self.dh)
        ang = t[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos()[None, :, None, :])
        self.register_buffer("sin", ang.sin()[None, :, None, :])
        self.register_buffer("mask", torch.full((seq, seq), float("-inf")).triu(1))

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def rope(self, x):
        a, b = x.chunk(2, dim=-1)
        return torch.cat([a * self.cos - b * self.sin, a * self.sin + b * self.cos], dim=-1)

    def forward(self, ids, targets):
        B, T = ids.shape
        x = self.emb(ids)
        for l in self.layers:
            h = self.rms(x, l["n1"].weight)
            q = self.rope(l["wq"](h).view(B, T, self.h, self.dh))
            k = self.rope(l["wk"](h).view(B, T, self.kv, self.dh))
            v = l["wv"](h).view(B, T, self.kv, self.dh)
            rep = self.h // self.kv
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            s = q @ k.transpose(-1, -2) / math.sqrt(self.dh) + self.mask[:T, :T]
            a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1)
            x = x + l["wo"](a)
            h = self.rms(x, l["n2"].weight)
            x = x + l["dn"](F.silu(l["g"](h)) * l["u"](h))
        logits = self.head(self.rms(x, self.norm.weight))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def bench_torch(threads, steps, warmup):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    m = TorchLlama(**MODEL)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1,
                            foreach=True)
    B, T, V = MODEL["micro"], MODEL["seq"], MODEL["vocab"]
    times = []
    for i in range(warmup + steps):
        ids = torch.randint(0, V, (B, T))
        tg = torch.randint(0, V, (B, T))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = m(ids, tg)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[warmup:]) * 1e3, sum(p.numel() for p in m.parameters())


def bench_trainer(binary, threads, steps, warmup, data):
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "bench.yaml")
        with open(cfg, "w") as f:
            f.write(f"""run: {{name: bench, dir: {tmp}/run}}
model: {{arch: llama, vocab_size: {MODEL['vocab']}, d_model: {MODEL['d_model']}, n_layers: {MODEL['n_layers']},
        n_heads: {MODEL['n_heads']}, n_kv_heads: {MODEL['n_kv_heads']}, max_seq_len: {MODEL['seq']}}}
train: {{device: cpu, steps: {warmup + steps}, seq_len: {MODEL['seq']}, micro_batch_size: {MODEL['micro']},
        global_batch_size: {MODEL['micro']}, threads: {threads}, grad_clip: 1.0}}
optim: {{lr: 1.0e-3}}
data: {{train: [{data}]}}
log: {{interval: 1}}
""")
        r = subprocess.run([binary, "--config", cfg], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"trainer failed:\n{r.stdout}\n{r.stderr}")
        rows = [json.loads(l) for l in open(os.path.join(tmp, "run", "metrics.jsonl"))]
        ms = [row["ms_per_step"] for row in rows if "ms_per_step" in row]
        return statistics.median(ms[warmup:])


def write_table(text):
    path = os.path.join(ROOT, "docs", "PERFORMANCE.md")
    doc = open(path).read() if os.path.exists(path) else "# Performance\n"
    block = f"{BEGIN}\n{text}\n{END}"
    if BEGIN in doc:
        doc = doc[: doc.index(BEGIN)] + block + doc[doc.index(END) + len(END):]
    else:
        doc = doc.rstrip() + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(doc)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trainer", default=os.path.join(ROOT, "build", "trainer"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "licenses", "train.bin"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    ours = bench_trainer(a.trainer, a.threads, a.steps, a.warmup, a.data)
    theirs, nparams = bench_torch(a.threads, a.steps, a.warmup)
    tokens = MODEL["micro"] * MODEL["seq"]
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    table = f"""## CPU training step: trainer vs PyTorch eager

Measured {datetime.date.today()} at commit `{commit}` on {cpu}, {a.threads} threads,
by `/usr/bin/python3 scripts/bench_cpu.py` (median of {a.steps} steps after {a.warmup} warm-up).
Model: LLaMA-style, d_model {MODEL['d_model']}, {MODEL['n_layers']} layers, {MODEL['n_heads']} heads
({MODEL['n_kv_heads']} kv), vocab {MODEL['vocab']}, {nparams / 1e6:.2f}M parameters; one step =
{MODEL['micro']} x {MODEL['seq']} tokens, forward + backward + clip + AdamW, fp32.
PyTorch {torch.__version__} eager (explicit attention; 1.13 has no SDPA), AdamW foreach;
both with OMP_WAIT_POLICY={os.environ["OMP_WAIT_POLICY"]}.

| implementation | ms/step | tokens/s | ratio vs PyTorch |
|---|---|---|---|
| trainer (CPU backend) | {ours:.1f} | {tokens / ours * 1e3:.0f} | {theirs / ours:.2f}x |
| PyTorch eager | {theirs:.1f} | {tokens / theirs * 1e3:.0f} | 1.00x |
"""
    print(table)
    if not a.no_write:
        write_table(table)


if __name__ == "__main__":
    main()
