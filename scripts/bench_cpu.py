#!/usr/bin/python3
"""CPU training-step benchmark: this trainer vs PyTorch eager, same models, same threads.

Times full optimizer steps (forward, backward, clip, AdamW) of each shape in
both, median over the timed steps after warm-up, next to the machine's sgemm
rate measured in the same run; for the trainer also its peak RSS against the
memory plan it prints, and its start-up (process wall time minus its steps).
Shapes (--shapes, default all): llama-d256 (4 layers), llama-d512 (8 layers),
gpt2-124m at 2 x 256 and at 4 x 512 tokens. It writes its own byte-level data
and prints the table; --write also puts it into docs/PERFORMANCE.md between
the CPU-benchmark markers. A benchmark, never a test.
Run with Debian's python3 (it has torch): /usr/bin/python3 scripts/bench_cpu.py [--write]
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

SHAPES = {
    "llama-d256": dict(arch="llama", d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, vocab=256, seq=256, micro=8),
    "llama-d512": dict(arch="llama", d_model=512, n_layers=8, n_heads=8, n_kv_heads=4, vocab=256, seq=256, micro=8),
    "gpt2-124m": dict(arch="gpt2", d_model=768, n_layers=12, n_heads=12, n_kv_heads=12, vocab=50257, seq=256, micro=2),
    "gpt2-124m-4x512": dict(arch="gpt2", d_model=768, n_layers=12, n_heads=12, n_kv_heads=12, vocab=50257, seq=512,
                            micro=4),
}


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


class TorchGpt2(torch.nn.Module):
    """Plain eager PyTorch GPT-2 of the same shapes as the trainer's (tied head, biases, GELU tanh)."""

    def __init__(self, d_model, n_layers, n_heads, vocab, seq, **_):
        super().__init__()
        self.h, self.dh = n_heads, d_model // n_heads
        self.wte = torch.nn.Embedding(vocab, d_model)
        self.wpe = torch.nn.Embedding(seq, d_model)
        self.layers = torch.nn.ModuleList()
        for _ in range(n_layers):
            self.layers.append(torch.nn.ModuleDict(dict(
                n1=torch.nn.LayerNorm(d_model), qkv=torch.nn.Linear(d_model, 3 * d_model),
                wo=torch.nn.Linear(d_model, d_model), n2=torch.nn.LayerNorm(d_model),
                fc=torch.nn.Linear(d_model, 4 * d_model), proj=torch.nn.Linear(4 * d_model, d_model))))
        self.norm = torch.nn.LayerNorm(d_model)
        self.register_buffer("mask", torch.full((seq, seq), float("-inf")).triu(1))

    def forward(self, ids, targets):
        B, T = ids.shape
        x = self.wte(ids) + self.wpe(torch.arange(T))[None]
        for l in self.layers:
            q, k, v = (t.view(B, T, self.h, self.dh).transpose(1, 2) for t in l["qkv"](l["n1"](x)).chunk(3, dim=-1))
            s = q @ k.transpose(-1, -2) / math.sqrt(self.dh) + self.mask[:T, :T]
            x = x + l["wo"]((s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1))
            x = x + l["proj"](F.gelu(l["fc"](l["n2"](x)), approximate="tanh"))
        logits = self.norm(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def sgemm_gflops(threads):
    """The machine's fp32 matmul rate through PyTorch's BLAS, 2048^3, median of 5."""
    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * 2048 ** 3 / statistics.median(times) / 1e9


def bench_torch(shape, threads, steps, warmup):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    m = (TorchLlama if shape["arch"] == "llama" else TorchGpt2)(**shape)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1,
                            foreach=True)
    B, T, V = shape["micro"], shape["seq"], shape["vocab"]
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


def bench_trainer(binary, shape, threads, steps, warmup, data):
    """Median ms/step, TFLOP/s as the trainer counts them, peak RSS and the plan's total (MiB), start-up (s)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "bench.yaml")
        tie = ", tie_embeddings: true" if shape["arch"] == "gpt2" else ""
        with open(cfg, "w") as f:
            f.write(f"""run: {{name: bench, dir: {tmp}/run}}
model: {{arch: {shape['arch']}, vocab_size: {shape['vocab']}, d_model: {shape['d_model']}, n_layers: {shape['n_layers']},
        n_heads: {shape['n_heads']}, n_kv_heads: {shape['n_kv_heads']}, max_seq_len: {shape['seq']}{tie}}}
train: {{device: cpu, steps: {warmup + steps}, seq_len: {shape['seq']}, micro_batch_size: {shape['micro']},
        global_batch_size: {shape['micro']}, threads: {threads}, grad_clip: 1.0}}
optim: {{lr: 1.0e-3}}
data: {{train: [{data}]}}
log: {{interval: 1, progress: lines}}
""")
        t0 = time.perf_counter()
        p = subprocess.Popen([binary, "--config", cfg], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out = p.stdout.read()
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        if status != 0:
            sys.exit(f"trainer failed:\n{out}")
        rows = [json.loads(l) for l in open(os.path.join(tmp, "run", "metrics.jsonl"))]
        steps_rows = [row for row in rows if "ms_per_step" in row]
        ms = [row["ms_per_step"] for row in steps_rows]
        tflops = statistics.median(row["tflops_per_device"] for row in steps_rows[warmup:])
        plan = next(l for l in out.splitlines() if l.strip().startswith("total"))
        num, unit = plan.split()[1:3]
        plan_mib = float(num) * {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024}[unit]
        return dict(ms=statistics.median(ms[warmup:]), tflops=tflops, rss_mib=usage.ru_maxrss / 1024,
                    plan_mib=plan_mib, startup_s=wall - sum(ms) / 1e3)


def byte_data(path):
    """Byte tokens of the system's license texts (no download)."""
    text = b"".join(open(os.path.join("/usr/share/common-licenses", n), "rb").read()
                    for n in sorted(os.listdir("/usr/share/common-licenses"))
                    if os.path.isfile(os.path.join("/usr/share/common-licenses", n)))
    torch.tensor(list(text), dtype=torch.int16).numpy().tofile(path)
    return path


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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainer", default=os.path.join(ROOT, "build", "trainer"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    ap.add_argument("--write", action="store_true", help="also write the table into docs/PERFORMANCE.md")
    a = ap.parse_args()
    names = a.shapes.split(",")
    for n in names:
        if n not in SHAPES:
            sys.exit(f"bench_cpu: unknown shape {n!r}; known: {', '.join(SHAPES)}")
    gemm = sgemm_gflops(a.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = byte_data(os.path.join(tmp, "tokens.bin"))
        for n in names:
            shape = SHAPES[n]
            ours = bench_trainer(a.trainer, shape, a.threads, a.steps, a.warmup, data)
            theirs, nparams = bench_torch(shape, a.threads, a.steps, a.warmup)
            tokens = shape["micro"] * shape["seq"]
            gflops = ours["tflops"] * 1e3
            torch_gflops = gflops * ours["ms"] / theirs  # the same work in PyTorch's time
            rows.append(f"| {n} ({nparams / 1e6:.1f}M, {shape['micro']} x {shape['seq']}) | {ours['ms']:.1f} | "
                        f"{theirs:.1f} | {theirs / ours['ms']:.2f}x | {tokens / ours['ms'] * 1e3:.0f} | "
                        f"{gflops:.0f} ({gflops / gemm:.0%}) | {torch_gflops:.0f} ({torch_gflops / gemm:.0%}) | "
                        f"{ours['rss_mib']:.0f} / {ours['plan_mib']:.0f} (+{ours['rss_mib'] - ours['plan_mib']:.0f}) | "
                        f"{ours['startup_s']:.2f} |")
            print(rows[-1], flush=True)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    table = f"""## CPU training step: trainer vs PyTorch eager

Measured {datetime.date.today()} at commit `{commit}` on {cpu}, {a.threads} threads,
by `/usr/bin/python3 scripts/bench_cpu.py` (median of {a.steps} steps after {a.warmup} warm-up);
sgemm (2048^3 fp32 through PyTorch's BLAS, same threads): {gemm:.0f} GFLOP/s. One step = forward +
backward + clip + AdamW, fp32, the same shapes and parameter counts on both sides; PyTorch
{torch.__version__} eager (explicit attention; 1.13 has no SDPA), AdamW foreach; both with
OMP_WAIT_POLICY={os.environ["OMP_WAIT_POLICY"]}. GFLOP/s: the trainer's own count (6N + 12LTC per token),
for PyTorch the same work over its time. RSS: the trainer's peak resident memory against the
memory plan it prints (MiB). Start-up: the trainer's wall time minus its steps (s).

| shape | trainer ms/step | PyTorch ms/step | speed-up | trainer tokens/s | trainer GFLOP/s (% sgemm) | PyTorch GFLOP/s (% sgemm) | peak RSS / plan MiB | start-up s |
|---|---|---|---|---|---|---|---|---|
""" + "\n".join(rows) + "\n"
    print(table)
    if a.write:
        write_table(table)


if __name__ == "__main__":
    main()
