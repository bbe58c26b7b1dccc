#!/usr/bin/env python3
"""Plants one known kernel bug at a time and checks that the tests on the
emulated CUDA device catch each (docs/EMULATOR.md, docs/RELIABILITY.md).

A test that passes whatever the kernel does proves nothing; this shows the
emulated device's tests fail on the bugs a GPU kernel typically has: a
missing barrier, a missing cp.async wait, an off-by-one in a tile's bound,
an mma fragment's halves swapped, a reduction over half a warp, AdamW's bias
correction a step off, a cuBLASLt transpose flag flipped.

It copies the repository's files (tracked and untracked, not ignored) to
WORK/src, builds gpu_tests_emu and the emulated module there (the compiler
cache makes the rebuilds after each plant short), runs each plant's tests
once unplanted (they must pass) and once planted (they must fail), and
prints a table; --write puts it into docs/RELIABILITY.md between the
emu-plants markers. Exit 1 when a plant is not caught or the unplanted
tests fail. Not a test of its own (it takes minutes per plant).

usage: scripts/emu_plants.py [--work DIR] [--only NAME,...] [--write]
"""
import argparse
import datetime
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- emu-plants:begin -->", "<!-- emu-plants:end -->"

# name, file, text that must occur exactly once, its planted replacement, Catch test spec.
PLANTS = [
    ("a __syncthreads removed in flash attention's backward (dK/dV, after the tile's cp.async wait)",
     "kernels/cuda/attention.cu",
     "    cp_async_wait<1>();\n    __syncthreads();\n    const int buf = it & 1;\n    const T* Qb",
     "    cp_async_wait<1>();\n    const int buf = it & 1;\n    const T* Qb",
     "[attention]"),
    ("a cp.async wait removed (flash attention's backward, dK/dV)",
     "kernels/cuda/attention.cu",
     "    cp_async_wait<1>();\n    __syncthreads();\n    const int buf = it & 1;\n    const T* Qb",
     "    __syncthreads();\n    const int buf = it & 1;\n    const T* Qb",
     "[attention]"),
    ("an off-by-one in a tile's bound (cp_tile loads one row past the valid ones)",
     "kernels/cuda/attention.cu",
     "const bool ok = r < valid_rows;",
     "const bool ok = r <= valid_rows;",
     "[attention]"),
    ("the two halves of an mma A fragment swapped (acc_to_a's second and third registers)",
     "kernels/cuda/attention.cu",
     "  a[1] = pack2<T>(c_lo[2], c_lo[3]);\n  a[2] = pack2<T>(c_hi[0], c_hi[1]);",
     "  a[2] = pack2<T>(c_lo[2], c_lo[3]);\n  a[1] = pack2<T>(c_hi[0], c_hi[1]);",
     "[attention]"),
    ("a reduction's shuffle width halved in RMSNorm (warp_sum over 16 lanes)",
     "kernels/cuda/norms.cu",
     "for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);",
     "for (int off = 8; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);",
     "[norm]"),
    ("AdamW's bias correction one step off",
     "kernels/cuda/adamw_math.cuh",
     "const double bc1 = 1.0 - std::pow(double(s.beta1), double(s.step));",
     "const double bc1 = 1.0 - std::pow(double(s.beta1), double(s.step + 1));",
     "[optim]"),
    ("a cuBLASLt transpose flag flipped (the linear forward's A)",
     "kernels/cuda/linear.cu",
     "  s.ta = CUBLAS_OP_T;\n  s.tb = CUBLAS_OP_N;",
     "  s.ta = CUBLAS_OP_N;\n  s.tb = CUBLAS_OP_N;",
     "[linear]"),
]


def sh(cmd, cwd, timeout=None):
    p = subprocess.run(cmd, cwd=cwd, shell=True, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def copy_tree(work):
    src = os.path.join(work, "src")
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "-co", "--exclude-standard", "-z"],
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for f in filter(None, files):
        to = os.path.join(src, f)
        if os.path.isfile(os.path.join(ROOT, f)):
            os.makedirs(os.path.dirname(to), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, f), to)
    return src


def build(src):
    rc, out = sh("bash scripts/build.sh --target gpu_tests_emu --target trainer_cuda_emu", src)
    if rc != 0:
        sys.exit(f"emu_plants: the build failed in {src}:\n{out[-4000:]}")


def run_tests(src, spec):
    """(exit code, seconds, the first failure's lines) of gpu_tests_emu SPEC."""
    t0 = time.time()
    try:
        rc, out = sh(f"build/gpu_tests_emu '{spec}'", src, timeout=900)
    except subprocess.TimeoutExpired:
        return 124, time.time() - t0, "timed out after 900 s"
    lines = out.splitlines()
    # The tests' own verdict line ("[gpu] label rel=... FAIL (worst at ...)")
    # says what differed; Catch's "FAILED: CHECK( ok )" only where.
    first = next((i for i, l in enumerate(lines) if l.startswith("[gpu]") and " FAIL" in l), None)
    if first is not None:
        return rc, time.time() - t0, " ".join(lines[first].split())[:300]
    first = next((i for i, l in enumerate(lines) if "FAILED" in l or "error" in l.lower()), None)
    what = " ".join(l.strip() for l in lines[first:first + 4]) if first is not None else ""
    return rc, time.time() - t0, what[:300]


def plant(src, name, path, old, new):
    p = os.path.join(src, path)
    text = open(p).read()
    if text.count(old) != 1:
        sys.exit(f"emu_plants: '{name}': the text to replace occurs {text.count(old)} times in {path}, not once "
                 "(the kernel changed: update the plant)")
    open(p, "w").write(text.replace(old, new))
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="/tmp/emu_plants")
    ap.add_argument("--only", help="comma-separated plant numbers (1-based)")
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    chosen = [int(i) for i in a.only.split(",")] if a.only else range(1, len(PLANTS) + 1)
    shutil.rmtree(os.path.join(a.work, "src"), ignore_errors=True)
    src = copy_tree(a.work)
    build(src)
    rows, missed = [], 0
    for spec in sorted({PLANTS[i - 1][4] for i in chosen}):
        rc, secs, what = run_tests(src, spec)
        print(f"unplanted {spec}: exit {rc} in {secs:.0f} s", flush=True)
        if rc != 0:
            sys.exit(f"emu_plants: the tests {spec} fail without a plant: {what}")
    for i in chosen:
        name, path, old, new, spec = PLANTS[i - 1]
        original = plant(src, name, path, old, new)
        try:
            build(src)
            rc, secs, what = run_tests(src, spec)
        finally:
            open(os.path.join(src, path), "w").write(original)
        caught = rc != 0
        missed += not caught
        print(f"plant {i} ({name}): {'caught' if caught else 'NOT CAUGHT'}, exit {rc}, {secs:.0f} s: {what}",
              flush=True)
        rows.append(f"| {i} | {name} | `{path}` | `gpu_tests_emu \"{spec}\"` | "
                    f"{'caught' if caught else '**not caught**'} (exit {rc}, {secs:.0f} s) | {what.replace('|', '/')} |")
    commit = sh("git rev-parse --short HEAD", ROOT)[1].strip()
    table = (f"Measured {datetime.date.today()} at `{commit}` by `scripts/emu_plants.py`: each plant applied alone "
             "to a copy of the tree, the emulated module rebuilt, its tests run.\n\n"
             "| # | plant | file | tests | result | first failure |\n|---|---|---|---|---|---|\n" +
             "\n".join(rows) + "\n")
    print(table)
    if a.write:
        path = os.path.join(ROOT, "docs", "RELIABILITY.md")
        text = open(path).read()
        if BEGIN in text:
            text = text[:text.index(BEGIN) + len(BEGIN)] + "\n" + table + text[text.index(END):]
        else:
            text += f"\n## Planted kernel bugs on the emulated device\n\n{BEGIN}\n{table}{END}\n"
        open(path, "w").write(text)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
