#!/usr/bin/python3
"""CPU training-step benchmark: this trainer vs PyTorch eager, same models, same threads.

Times full optimizer steps (forward, backward, clip, AdamW) of each shape in
both, median over the timed steps after warm-up, next to the machine's sgemm
rate measured in the same run; for the trainer also its peak RSS against the
memory plan it prints, and its start-up (process start to step 1, as it prints it).
Shapes (--shapes, default the first four): llama-d256 (4 layers), llama-d512
(8 layers), gpt2-124m at 2 x 256 and at 4 x 512 tokens, and gpt2-124m-4x64
(llm.c's shape, below). It writes its own byte-level data and prints the
table; --write also puts it into docs/PERFORMANCE.md between the CPU-benchmark
markers. A benchmark, never a test.
This machine's speed drifts by 10-15% over minutes: sgemm is measured before, between and after
the shapes and the best rate is the table's peak; --rounds N alternates trainer and PyTorch N
times per shape and takes the median run of each.
--gemm-floor runs the trainer once more per shape under build/bench/libblas_time.so (an LD_PRELOAD
library that times every cblas_sgemm) and adds a table of how much of the step is sgemm, and so
how fast the step could get if everything else took no time at this BLAS's speed.
Run with Debian's python3 (it has torch): /usr/bin/python3 scripts/bench_cpu.py [--write]

The same OpenBLAS kernels on both sides: OpenBLAS picks its kernels ("core") from the CPU model and a
masked model gets slow ones; the trainer corrects that at start-up (kernels/cpu/blas_core.h). The bench
asks the trainer which core it runs (`trainer devices`, its "cpu BLAS:" line) and runs every PyTorch
measurement in a child process with OPENBLAS_CORETYPE set to it, so the comparison is kernel for kernel;
it also times PyTorch as a user gets it (no OPENBLAS_CORETYPE: OpenBLAS's own pick) in another column,
unless --no-torch-default or the two cores are the same. Each PyTorch child reports the core it ran.

Optional second peer after PyTorch, Karpathy's llm.c CPU trainer (--llmc PATH): build it
yourself, outside this repository (clone https://github.com/karpathy/llm.c and
run `make train_gpt2` in it), then pass `--llmc path/to/train_gpt2`. Nothing is
downloaded or built here. Its main() hard-codes GPT-2 124M at B=4, T=64 and
cannot be told another shape, so --llmc adds the gpt2-124m-4x64 shape to the
default shapes and fills the llm.c columns of that row only ("—" elsewhere).
The bench runs the binary in a temporary directory that holds what main()
opens: gpt2_124M.bin (a random-init checkpoint in llm.c's fp32 format: 256
int32 header of magic 20240326, version 3, maxT 1024, V 50257, L 12, NH 12,
C 768, Vp 50304, then the 16 parameter tensors in its order) and
dev/data/tinyshakespeare/tiny_shakespeare_{train,val}.bin (256 int32 header
of magic 20240520, version 1, token count, then uint16 tokens: the same
license-text bytes, valid GPT-2 ids). No gpt2_tokenizer.bin: llm.c only warns
and needs it for its text sample at step 20, which the bench never reaches: it
reads llm.c's "step N: train loss X (took Y ms)" lines, whose time is
llm.c's own clock around one training step (next batch, forward, zero-grad,
backward, AdamW; its validation every 10 steps lies outside it), and stops it
after --warmup + --steps of them (at most 20). llm.c uses OMP_NUM_THREADS =
--threads and the same OMP_WAIT_POLICY.
"""
import argparse
import datetime
import json
import math
import os
import platform
import pty
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque

# The trainer runs its OpenMP threads with a passive wait policy (app/main.cpp);
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
    # llm.c's train_gpt2.c main() hard-codes B = 4, T = 64; this row compares all three at that shape.
    "gpt2-124m-4x64": dict(arch="gpt2", d_model=768, n_layers=12, n_heads=12, n_kv_heads=12, vocab=50257, seq=64,
                           micro=4),
}
# Today's default set; the 4 x 64 row exists for llm.c, so it joins the default only with --llmc.
DEFAULT_SHAPES = ["llama-d256", "llama-d512", "gpt2-124m", "gpt2-124m-4x512"]
LLMC_SHAPE = "gpt2-124m-4x64"
# The model llm.c's main() builds from gpt2_124M.bin: GPT-2 124M as its exporter writes it,
# context 1024 and the vocabulary padded to a multiple of 128 (rows 50257..50303 stay zero).
LLMC_MODEL = dict(max_seq_len=1024, vocab=50257, padded_vocab=50304, n_layers=12, n_heads=12, d_model=768)
LLMC_MAX_STEPS = 20  # its loop samples text at step 20 (needs gpt2_tokenizer.bin, minutes of forwards)


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


def init_like_trainer(m):
    """Normal(0, 0.02) matrices and embeddings, zero biases, as the trainer (and GPT-2) start. PyTorch's
    own defaults (N(0, 1) embeddings) make GPT-2's tied-head logits so large that the softmax gradient
    is mostly denormal floats, and every GEMM on it runs 4-5x slower (measured: 20 s steps at 2 x 256)."""
    for mod in m.modules():
        if isinstance(mod, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(mod.weight, 0.0, 0.02)
        if isinstance(mod, torch.nn.Linear) and mod.bias is not None:
            torch.nn.init.zeros_(mod.bias)
    return m


def bench_torch(shape, threads, steps, warmup):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    m = init_like_trainer((TorchLlama if shape["arch"] == "llama" else TorchGpt2)(**shape))
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


def openblas_core():
    """The core of the OpenBLAS this process's torch loaded (its libblas.so.3 is OpenBLAS on Debian)."""
    import ctypes
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return "unknown (torch's BLAS is not OpenBLAS)"


def torch_worker(spec):
    """One PyTorch measurement in this (child) process: the parent chose its OPENBLAS_CORETYPE."""
    if spec["what"] == "sgemm":
        out = dict(gflops=sgemm_gflops(spec["threads"]))
    else:
        ms, nparams = bench_torch(SHAPES[spec["shape"]], spec["threads"], spec["steps"], spec["warmup"])
        out = dict(ms=ms, nparams=nparams)
    out.update(core=openblas_core(), version=torch.__version__)
    print("TORCH_WORKER " + json.dumps(out), flush=True)


def run_torch(spec, core):
    """Runs torch_worker in a child with OPENBLAS_CORETYPE=core (None: unset, OpenBLAS's own pick)."""
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    if core:
        env["OPENBLAS_CORETYPE"] = core
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--torch-worker", json.dumps(spec)], env=env,
                       capture_output=True, text=True)
    lines = [l for l in p.stdout.splitlines() if l.startswith("TORCH_WORKER ")]
    if p.returncode != 0 or not lines:
        sys.exit(f"bench_cpu: the PyTorch child ({spec}, OPENBLAS_CORETYPE={core}) failed:\n{p.stdout}{p.stderr}")
    out = json.loads(lines[-1][len("TORCH_WORKER "):])
    if core and out["core"].lower() != core.lower():
        sys.exit(f"bench_cpu: PyTorch's OpenBLAS runs {out['core']} although OPENBLAS_CORETYPE={core}: "
                 "the comparison would not be kernel for kernel")
    return out


def trainer_blas(binary):
    """(core, the trainer's whole "cpu BLAS:" line) from `trainer devices`."""
    p = subprocess.run([binary, "devices"], capture_output=True, text=True)
    line = next((l for l in p.stdout.splitlines() if l.startswith("cpu BLAS: ")), None)
    m = re.search(r", core ([A-Za-z0-9_]+)", line or "")
    if not m:
        sys.exit(f"bench_cpu: `{binary} devices` printed no 'cpu BLAS: ... core NAME' line (an older trainer?):\n"
                 f"{p.stdout}{p.stderr}")
    return m.group(1), line[len("cpu BLAS: "):]


def bench_trainer(binary, shape, threads, steps, warmup, data, blas_time=None):
    """Median ms/step, TFLOP/s as the trainer counts them, peak RSS and the plan's total (MiB), start-up (s).
    With blas_time (the path of libblas_time.so), the run is preloaded with it and its sgemm log is
    returned as "sgemm" (a measuring run: the timer's overhead is in its step times)."""
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
        env = dict(os.environ)
        if blas_time:
            env.update(LD_PRELOAD=blas_time, BLAS_TIME_OUT=os.path.join(tmp, "sgemm.json"))
        t0 = time.perf_counter()
        p = subprocess.Popen([binary, "--config", cfg], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env)
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
        # The trainer's own "start-up: X s from process start to step 1" line; older binaries
        # lack it, and then the whole run minus its steps stands in (exit included).
        start = [l for l in out.splitlines() if l.startswith("start-up: ")]
        startup = float(start[0].split()[1]) if start else wall - sum(ms) / 1e3
        # Its own "peak resident memory: X MiB" (VmHWM): wait4's ru_maxrss of a child starts at
        # this Python's size (the fork's pages count until exec), a bound only.
        peak = [l for l in out.splitlines() if l.startswith("peak resident memory: ")]
        rss_mib = float(peak[0].split()[3]) if peak else usage.ru_maxrss / 1024
        if peak:  # the plan to the MiB there, where the start-up ledger rounds to 0.1 GiB
            plan_mib = float(peak[0].split("memory plan ")[1].split()[0])
        result = dict(ms=statistics.median(ms[warmup:]), mean_ms=statistics.mean(ms[warmup:]), tflops=tflops,
                      rss_mib=rss_mib, plan_mib=plan_mib, startup_s=startup)
        if blas_time:
            with open(os.path.join(tmp, "sgemm.json")) as f:
                result["sgemm"] = json.load(f)["sgemm"]
        return result


def gemm_floor_ms(sgemm, steps, warmup, threads):
    """Milliseconds per timed step spent in sgemm: (layer GEMMs, attention's GEMMs), from libblas_time's
    log. Every step makes the same calls, so each call shape's first warmup/(warmup + steps) of its calls
    are the warm-up steps' (page faults) and are left out; the rest is averaged over the timed steps.
    Calls inside a parallel region ran on every thread at once: their per-thread sum over the thread
    count is their share of the wall clock (if the threads stay busy)."""
    big = small = 0.0
    for c in sgemm:
        seconds = c["seconds"]
        if len(seconds) % (warmup + steps):
            sys.exit(f"bench_cpu: sgemm {c['m']}x{c['n']}x{c['k']} ran {len(seconds)} times in {warmup + steps} "
                     "steps: not the same calls every step, so the warm-up cannot be told apart")
        timed = sum(seconds[len(seconds) // (warmup + steps) * warmup:]) / steps
        if c["in_parallel"]:
            small += timed / threads
        else:
            big += timed
    return big * 1e3, small * 1e3


def license_bytes():
    """The system's license texts (no download), the bench's training text."""
    return b"".join(open(os.path.join("/usr/share/common-licenses", n), "rb").read()
                    for n in sorted(os.listdir("/usr/share/common-licenses"))
                    if os.path.isfile(os.path.join("/usr/share/common-licenses", n)))


def byte_data(path):
    """Byte tokens of the license texts, int16 raw, the trainer's input."""
    torch.tensor(list(license_bytes()), dtype=torch.int16).numpy().tofile(path)
    return path


def write_llmc_checkpoint(path):
    """Random-init GPT-2 124M in llm.c's fp32 checkpoint format (train_gpt2.c, gpt2_build_from_checkpoint).

    256 int32 header, then every parameter as float32 in llm.c's order (fill_in_parameter_sizes);
    the per-layer tensors hold all layers back to back. Matrices normal(0, 0.02) from a fixed seed,
    LayerNorm weights 1, biases 0, the padded vocabulary rows 0 (as llm.c's exporter pads).
    Returns the parameter count llm.c will print.
    """
    m = LLMC_MODEL
    maxT, V, Vp, L, NH, C = (m[k] for k in ("max_seq_len", "vocab", "padded_vocab", "n_layers", "n_heads", "d_model"))
    header = torch.zeros(256, dtype=torch.int32)
    header[:8] = torch.tensor([20240326, 3, maxT, V, L, NH, C, Vp], dtype=torch.int32)  # magic, version 3 = fp32
    g = torch.Generator().manual_seed(1234)
    normal = lambda *shape: torch.randn(*shape, generator=g) * 0.02
    tensors = [  # llm.c's ParameterTensors order, shapes as its fill_in_parameter_sizes
        lambda: torch.cat([normal(V, C), torch.zeros(Vp - V, C)]),  # wte
        lambda: normal(maxT, C),  # wpe
        lambda: torch.ones(L, C), lambda: torch.zeros(L, C),  # ln1w, ln1b
        lambda: normal(L, 3 * C, C), lambda: torch.zeros(L, 3 * C),  # qkvw, qkvb
        lambda: normal(L, C, C), lambda: torch.zeros(L, C),  # attprojw, attprojb
        lambda: torch.ones(L, C), lambda: torch.zeros(L, C),  # ln2w, ln2b
        lambda: normal(L, 4 * C, C), lambda: torch.zeros(L, 4 * C),  # fcw, fcb
        lambda: normal(L, C, 4 * C), lambda: torch.zeros(L, C),  # fcprojw, fcprojb
        lambda: torch.ones(C), lambda: torch.zeros(C),  # lnfw, lnfb
    ]
    count = 0
    with open(path, "wb") as f:
        header.numpy().tofile(f)
        for make in tensors:  # one tensor at a time: the whole model is 0.5 GB of fp32
            t = make().contiguous()
            count += t.numel()
            t.numpy().tofile(f)
    return count


def write_llmc_tokens(path, tokens):
    """llm.c's token shard (llmc/dataloader.h): 256 int32 header (magic 20240520, version 1, count), uint16 ids."""
    header = torch.zeros(256, dtype=torch.int32)
    header[:3] = torch.tensor([20240520, 1, len(tokens)], dtype=torch.int32)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        header.numpy().tofile(f)
        # uint16 has no torch dtype in 1.13; bytes < 256 fit int16's bit pattern unchanged
        torch.tensor(list(tokens), dtype=torch.int16).numpy().tofile(f)


LLMC_STEP = re.compile(r"^step (\d+): train loss (\S+) \(took ([0-9.]+) ms\)")


def bench_llmc(binary, threads, steps, warmup):
    """Median ms/step of llm.c's train_gpt2 (its own per-step clock), its parameter count, its wall time (s)."""
    want = warmup + steps
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        nparams = write_llmc_checkpoint(os.path.join(tmp, "gpt2_124M.bin"))
        text = license_bytes()
        cut = len(text) * 9 // 10
        # main() prefers tiny_shakespeare over tinystories when it exists; train / val split 90 / 10
        write_llmc_tokens(os.path.join(tmp, "dev/data/tinyshakespeare/tiny_shakespeare_train.bin"), text[:cut])
        write_llmc_tokens(os.path.join(tmp, "dev/data/tinyshakespeare/tiny_shakespeare_val.bin"), text[cut:])
        files_s = time.perf_counter() - t0
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        # llm.c printf()s to stdout, block-buffered into a pipe: a pty makes it line-buffered,
        # so each step line arrives when printed and the run can be stopped after the steps we need.
        master, slave = pty.openpty()
        t0 = time.perf_counter()
        try:
            p = subprocess.Popen([binary], cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
        except OSError as e:
            os.close(master)
            os.close(slave)
            sys.exit(f"bench_cpu: --llmc {binary}: cannot run it: {e}")
        os.close(slave)
        tail, ms, losses, printed_params, buf = deque(maxlen=20), [], [], None, b""
        while len(ms) < want:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer of the pty has exited
                chunk = b""
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace").rstrip("\r")
                tail.append(line)
                hit = LLMC_STEP.match(line)
                if hit:
                    losses.append(hit.group(2))
                    ms.append(float(hit.group(3)))
                elif line.startswith("num_parameters: "):
                    printed_params = line.split()[1]
        wall = time.perf_counter() - t0
        if len(ms) >= want:
            p.terminate()  # it would go on to step 40, with validation and text samples between
        status = p.wait()
        os.close(master)
        if buf:
            tail.append(buf.decode(errors="replace").rstrip("\r"))
        if len(ms) < want:
            how = f"exited with status {status}" if status >= 0 else f"was killed by signal {-status}"
            last = "\n".join(tail) or "(no output)"
            sys.exit(f"bench_cpu: --llmc {binary} {how} after {len(ms)} of {want} parseable "
                     f"'step N: train loss X (took Y ms)' lines; is it llm.c's train_gpt2 "
                     f"(make train_gpt2)? Last lines of its output:\n{last}")
        if printed_params != str(nparams):
            # It read a model of another size than the one written: its checkpoint format has changed.
            sys.exit(f"bench_cpu: --llmc {binary} printed num_parameters {printed_params}, but the checkpoint "
                     f"written for it holds {nparams}; its gpt2_124M.bin format differs from the one this "
                     f"bench writes. Last lines of its output:\n" + "\n".join(tail))
    return dict(ms=statistics.median(ms[warmup:]), nparams=nparams, files_s=files_s, wall_s=wall,
                first_loss=losses[0], last_loss=losses[-1])


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


def llmc_commit(binary):
    """llm.c's commit when the binary sits in its git checkout (as `make train_gpt2` leaves it), else ''."""
    r = subprocess.run(["git", "-C", os.path.dirname(binary), "rev-parse", "--short", "HEAD"],
                       capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainer", default=os.path.join(ROOT, "build", "trainer"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs of trainer and PyTorch per shape, alternating; the table takes the median run")
    ap.add_argument("--shapes", help="comma-separated: " + ", ".join(SHAPES) + "; default: " +
                    ", ".join(DEFAULT_SHAPES) + f" (and {LLMC_SHAPE} with --llmc)")
    ap.add_argument("--llmc", metavar="PATH", help="an already-built llm.c train_gpt2 (make train_gpt2 in a clone "
                    f"of karpathy/llm.c), timed as a third peer at {LLMC_SHAPE}")
    ap.add_argument("--gemm-floor", nargs="?", const="", metavar="LIB",
                    help="also run the trainer once per shape under libblas_time.so (LD_PRELOAD; default: "
                    "bench/libblas_time.so beside --trainer) and print how much of its step is sgemm: the "
                    "step a faster rest of the code could reach at the machine's GEMM rate")
    ap.add_argument("--adjacent-sgemm", action="store_true",
                    help="also measure sgemm right before and after every trainer run and compare each run with "
                    "the mean of those two (the machine's speed drifts between measurements minutes apart)")
    ap.add_argument("--write", action="store_true", help="also write the table into docs/PERFORMANCE.md")
    ap.add_argument("--no-torch-default", action="store_true",
                    help="skip the PyTorch column with OpenBLAS's own core (the defaults a user gets)")
    ap.add_argument("--torch-worker", help=argparse.SUPPRESS)  # a child's one measurement (run_torch)
    a = ap.parse_args()
    if a.torch_worker:
        torch_worker(json.loads(a.torch_worker))
        return
    if a.rounds < 1:
        sys.exit(f"bench_cpu: --rounds {a.rounds}: at least 1")
    names = a.shapes.split(",") if a.shapes else DEFAULT_SHAPES + ([LLMC_SHAPE] if a.llmc else [])
    for n in names:
        if n not in SHAPES:
            sys.exit(f"bench_cpu: unknown shape {n!r}; known: {', '.join(SHAPES)}")
    blas_time = None
    if a.gemm_floor is not None:
        blas_time = os.path.abspath(a.gemm_floor or os.path.join(os.path.dirname(a.trainer), "bench",
                                                                  "libblas_time.so"))
        if not os.path.isfile(blas_time):
            sys.exit(f"bench_cpu: --gemm-floor: no {blas_time}; build it (cmake --build BUILD --target blas_time) "
                     "or pass its path")
    llmc = None
    if a.llmc:
        # Checked before any timing, so a wrong path costs seconds, not the trainer and PyTorch runs.
        llmc = os.path.abspath(a.llmc)  # it runs with a temporary directory as its cwd
        if not os.path.isfile(llmc) or not os.access(llmc, os.X_OK):
            sys.exit(f"bench_cpu: --llmc {a.llmc}: no executable file there; build llm.c's train_gpt2 "
                     "(clone karpathy/llm.c, make train_gpt2) and pass its path")
        if LLMC_SHAPE not in names:
            sys.exit(f"bench_cpu: --llmc runs only at {LLMC_SHAPE} (its main() hard-codes B=4, T=64); "
                     f"add it to --shapes")
        if a.warmup + a.steps > LLMC_MAX_STEPS:
            sys.exit(f"bench_cpu: --llmc: --warmup + --steps is {a.warmup + a.steps}; at most {LLMC_MAX_STEPS} "
                     "(llm.c's loop samples text at step 20)")
    # This machine's speed drifts by 10-15% over minutes (a shared VM): sgemm is measured before,
    # between and after the shapes and the best rate is the table's peak (the lowest, most
    # conservative percentages); trainer and PyTorch alternate for --rounds rounds, median of each.
    core, blas_line = trainer_blas(a.trainer)
    sgemm_spec = dict(what="sgemm", threads=a.threads)
    default = run_torch(sgemm_spec, None)  # also says which core a user's PyTorch gets
    torch_default = not a.no_torch_default and default["core"].lower() != core.lower()
    print(f"trainer BLAS: {blas_line}\nPyTorch: OPENBLAS_CORETYPE={core} for the comparison; "
          f"OpenBLAS's own pick for PyTorch here: {default['core']} ({default['gflops']:.0f} GFLOP/s sgemm)",
          file=sys.stderr, flush=True)
    gemms = [run_torch(sgemm_spec, core)["gflops"]]
    measured, llmc_params = [], None
    with tempfile.TemporaryDirectory() as tmp:
        data = byte_data(os.path.join(tmp, "tokens.bin"))
        for n in names:
            shape = SHAPES[n]
            ours_runs, theirs_runs, default_runs = [], [], []
            spec = dict(what="step", shape=n, threads=a.threads, steps=a.steps, warmup=a.warmup)
            for _ in range(a.rounds):
                before = run_torch(sgemm_spec, core)["gflops"] if a.adjacent_sgemm else None
                ours_runs.append(bench_trainer(a.trainer, shape, a.threads, a.steps, a.warmup, data))
                if a.adjacent_sgemm:
                    after = run_torch(sgemm_spec, core)["gflops"]
                    gemms.extend([before, after])
                    ours_runs[-1]["adjacent"] = (before, after)
                t = run_torch(spec, core)
                theirs, nparams = t["ms"], t["nparams"]
                theirs_runs.append(theirs)
                if torch_default:
                    default_runs.append(run_torch(spec, None)["ms"])
                print(f"{n}: trainer {ours_runs[-1]['ms']:.1f} ms/step, PyTorch {theirs:.1f} ms/step ({core})" +
                      (f", {default_runs[-1]:.1f} ms/step ({default['core']})" if torch_default else ""),
                      file=sys.stderr, flush=True)
            ours = dict(ours_runs[0])
            for k in ("ms", "tflops", "startup_s"):
                ours[k] = statistics.median(r[k] for r in ours_runs)
            ours["rss_mib"] = max(r["rss_mib"] for r in ours_runs)
            if a.adjacent_sgemm:
                ours["adjacent"] = [(r["tflops"] * 1e3, *r["adjacent"]) for r in ours_runs]
            theirs = statistics.median(theirs_runs)
            theirs_default = statistics.median(default_runs) if default_runs else None
            if blas_time:
                timed = bench_trainer(a.trainer, shape, a.threads, a.steps, a.warmup, data, blas_time)
                ours["gemm_ms"] = gemm_floor_ms(timed["sgemm"], a.steps, a.warmup, a.threads)
                ours["floor_run_ms"] = timed["mean_ms"]
            lc = None
            if llmc and n == LLMC_SHAPE:
                lc = bench_llmc(llmc, a.threads, a.steps, a.warmup)
                llmc_params = lc["nparams"]
                print(f"llm.c: {a.warmup + a.steps} steps, {lc['wall_s']:.1f} s from start to its last step line "
                      f"(+{lc['files_s']:.1f} s writing its checkpoint and data); "
                      f"train loss {lc['first_loss']} at step 0, {lc['last_loss']} at its last", file=sys.stderr, flush=True)
            gemms.append(run_torch(sgemm_spec, core)["gflops"])
            measured.append((n, shape, ours, theirs, nparams, lc, theirs_default))
    gemm = max(gemms)
    rows = []
    for n, shape, ours, theirs, nparams, lc, theirs_default in measured:
        tokens = shape["micro"] * shape["seq"]
        gflops = ours["tflops"] * 1e3
        torch_gflops = gflops * ours["ms"] / theirs  # the same work in PyTorch's time
        row = (f"| {n} ({nparams / 1e6:.1f}M, {shape['micro']} x {shape['seq']}) | {ours['ms']:.1f} | "
               f"{theirs:.1f} | {theirs / ours['ms']:.2f}x | {tokens / ours['ms'] * 1e3:.0f} | "
               f"{gflops:.0f} ({gflops / gemm:.0%}) | {torch_gflops:.0f} ({torch_gflops / gemm:.0%}) | ")
        if torch_default:
            row += f"{theirs_default:.1f} | {theirs_default / ours['ms']:.2f}x | "
        if lc:
            llmc_gflops = gflops * ours["ms"] / lc["ms"]  # the same work (the trainer's count) in llm.c's time
            row += (f"{lc['ms']:.1f} | {lc['ms'] / ours['ms']:.2f}x | {tokens / lc['ms'] * 1e3:.0f} | "
                    f"{llmc_gflops:.0f} ({llmc_gflops / gemm:.0%}) | ")
        elif llmc:
            row += "— | — | — | — | "
        row += (f"{ours['rss_mib']:.0f} / {ours['plan_mib']:.0f} (+{ours['rss_mib'] - ours['plan_mib']:.0f}) | "
                f"{ours['startup_s']:.2f} |")
        rows.append(row)
        print(rows[-1], flush=True)
    floor_rows = []
    for n, shape, ours, theirs, nparams, lc, _ in measured:
        if "gemm_ms" not in ours:
            continue
        big, small = ours["gemm_ms"]
        step = ours["floor_run_ms"]  # the same run's steps: drift between runs stays out of "rest"
        rest = step - big - small
        floor_rows.append(f"| {n} | {step:.1f} | {big:.1f} + {small:.1f} | {rest:.1f} | "
                          f"{(big + small) / step:.0%} | {theirs / ours['ms']:.2f}x | "
                          f"{theirs / ours['ms'] * step / (big + small):.2f}x |")
        print(floor_rows[-1], flush=True)
    adjacent_rows = []
    for n, shape, ours, theirs, nparams, lc, _ in measured:
        if "adjacent" not in ours:
            continue
        ratios = [g / ((b + e) / 2) for g, b, e in ours["adjacent"]]
        runs = ", ".join(f"{g:.0f} / {(b + e) / 2:.0f} ({b:.0f}, {e:.0f}) = {g / ((b + e) / 2):.0%}"
                         for g, b, e in ours["adjacent"])
        adjacent_rows.append(f"| {n} | {runs} | {statistics.median(ratios):.0%} |")
        print(adjacent_rows[-1], flush=True)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    title, llmc_text, llmc_head, llmc_rule = "trainer vs PyTorch eager", "", "", ""
    if llmc:
        at = llmc_commit(llmc)
        title = "trainer vs PyTorch eager vs llm.c"
        llmc_text = f"""
llm.c: Karpathy's CPU `train_gpt2` ({f"commit `{at}`" if at else "commit unknown"}), built with its
Makefile (`make train_gpt2`), on a random-init GPT-2 124M checkpoint ({llmc_params / 1e6:.1f}M parameters:
context 1024, vocabulary padded to 50304) and the same bytes, OMP_NUM_THREADS={a.threads}. Its main()
hard-codes B = 4, T = 64 and cannot be told another shape, so only the {LLMC_SHAPE} row has llm.c
numbers ("—" elsewhere). llm.c ms/step: the median of the per-step times it prints (its clock around
next batch, forward, zero-grad, backward, AdamW; no clip) after the same warm-up; trainer vs llm.c: llm.c's
time over the trainer's; GFLOP/s: the trainer's count of that shape over llm.c's time. How its
model and step differ from the other two: the text above this table.
"""
        llmc_head = " llm.c ms/step | trainer vs llm.c | llm.c tokens/s | llm.c GFLOP/s (% sgemm) |"
        llmc_rule = "---|---|---|---|"
    default_text, default_head, default_rule = "", "", ""
    if torch_default:
        default_text = (f"; as a user gets it (OpenBLAS's own pick, {default['core']}, sgemm "
                        f"{default['gflops']:.0f} GFLOP/s) in the columns so marked")
        default_head = f" PyTorch ms/step ({default['core']}, its default) | speed-up over it |"
        default_rule = "---|---|"
    elif not a.no_torch_default:
        default_text = f" (also OpenBLAS's own pick for PyTorch here: {default['core']})"
    table = f"""## CPU training step: {title}

Measured {datetime.date.today()} at commit `{commit}` on {cpu}, {a.threads} threads,
by `/usr/bin/python3 scripts/bench_cpu.py{" --llmc PATH" if llmc else ""}{f" --rounds {a.rounds}" if a.rounds != 1 else ""}{" --gemm-floor" if blas_time else ""}{" --adjacent-sgemm" if a.adjacent_sgemm else ""}` (median of {a.steps} steps after {a.warmup} warm-up{f"; trainer and PyTorch alternate, {a.rounds} runs each, the median of their medians" if a.rounds > 1 else ""});
sgemm (2048^3 fp32 through PyTorch's BLAS with the trainer's core, same threads): {gemm:.0f} GFLOP/s, the best of {len(gemms)} measurements
before, between and after the shapes (they ranged {min(gemms):.0f}-{max(gemms):.0f}: this machine's speed drifts). One step = forward +
backward + clip + AdamW, fp32, the same shapes and parameter counts on both sides; PyTorch
{default["version"]} eager (explicit attention; 1.13 has no SDPA), AdamW foreach; both with
OMP_WAIT_POLICY={os.environ["OMP_WAIT_POLICY"]}. OpenBLAS kernels: the trainer's "{blas_line}";
PyTorch runs with OPENBLAS_CORETYPE={core}, the same kernels{default_text}. GFLOP/s: the trainer's own count
(model/flops.h: 6 x the matmul weights + 6LTC per token, causal attention at half), for PyTorch the same work over its time. RSS: the trainer's peak resident memory (VmHWM, as it prints it) against the
memory plan it prints (MiB). Start-up: from process start to step 1, as the trainer prints it (s).
{llmc_text}
| shape | trainer ms/step | PyTorch ms/step | speed-up | trainer tokens/s | trainer GFLOP/s (% sgemm) | PyTorch GFLOP/s (% sgemm) |{default_head}{llmc_head} peak RSS / plan MiB | start-up s |
|---|---|---|---|---|---|---|{default_rule}{llmc_rule}---|---|
""" + "\n".join(rows) + "\n"
    if floor_rows:
        table += f"""
Where the trainer's step goes (`--gemm-floor`: one more trainer run per shape under
`build/bench/libblas_time.so`, which times every `cblas_sgemm`): that run's mean step after the
warm-up; the layers' GEMMs and attention's per-head GEMMs (per-thread time over {a.threads} threads)
per step, over the same steps; the rest is the step less both (norms, activations, softmax,
RoPE, AdamW, the loss, waits). "Speed-up at the GEMM floor": the table's speed-up scaled by step
over sgemm time, the most that any change outside the GEMMs could reach at this BLAS's speed.

| shape | its mean step ms | sgemm ms/step (layers + attention) | rest ms/step | sgemm share | speed-up (table) | speed-up at the GEMM floor |
|---|---|---|---|---|---|---|
""" + "\n".join(floor_rows) + "\n"
    if adjacent_rows:
        table += f"""
The trainer's step against the sgemm rate next to it (`--adjacent-sgemm`): each trainer run's
GFLOP/s (the median of its steps, the trainer's count) over the mean of the 2048^3 sgemm rates
measured right before and right after it (those two in parentheses), then the median of the runs.

| shape | per run: trainer GFLOP/s / adjacent sgemm GFLOP/s (before, after) = share | median share |
|---|---|---|
""" + "\n".join(adjacent_rows) + "\n"
    print(table)
    if a.write:
        write_table(table)


if __name__ == "__main__":
    main()
