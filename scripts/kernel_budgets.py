#!/usr/bin/env python3
"""Kernel resource budgets, checked without a GPU.

Compiles every .cu file of the CUDA module (the CUDA_MODULE_SOURCES glob and
target_sources of trainer_cuda in CMakeLists.txt) for each architecture the
build targets (CMAKE_CUDA_ARCHITECTURES), with the build's flags, to a cubin
with `-Xptxas -v` and the PTX kept, then checks every kernel against
kernels/cuda/budgets.tsv:

  - no function spills (spill stores or spill loads > 0 bytes);
  - every kernel matches exactly one budget entry, every entry a kernel;
  - registers <= the entry's max_regs;
  - the block size is the code's: the entry's block must equal the kernel's
    __launch_bounds__ (.maxntid in the PTX) or, without one, every launch
    site's compile-time block size (`launch(kernel, grid, BLOCK, ...)`, the
    helper of kernels/cuda/launch.cuh, or `<<<grid, BLOCK, ...>>>` in kernels/cuda/);
  - theoretical occupancy at that block size and the entry's dynamic shared
    memory >= the entry's floor (and at least one block fits).

Occupancy follows NVIDIA's occupancy calculator as CUDA ships it
(cuda_occupancy.h, cudaOccMaxActiveBlocksPerMultiprocessor) with the
per-architecture limits of the CUDA C++ Programming Guide's "Technical
Specifications per Compute Capability" table (ARCHS below).

Only the Python standard library and c++filt (binutils) are used. Exit codes:
0 all within budget, 1 violations (one line each on stderr), 2 a tool or input
error, 77 nvcc not found (nothing can be checked).
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import dataclasses
import glob
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

# --------------------------------------------------------------------------------------
# Architecture limits
# --------------------------------------------------------------------------------------
# CUDA C++ Programming Guide, "Compute Capabilities" / "Technical Specifications per
# Compute Capability" (8.0 and 9.0 columns), and cuda_occupancy.h (CUDA 13):
#   max warps / SM 64 (2048 threads), max blocks / SM 32, 64 K 32-bit registers / SM and
#   per block, 255 registers per thread, registers allocated per warp in units of 256
#   (cudaOccRegAllocationGranularity), 4 sub-partitions per SM that each hold a quarter of
#   the register file (cudaOccSubPartitionsPerMultiprocessor), shared memory allocated in
#   units of 128 bytes (cudaOccSMemAllocationGranularity) with 1 KiB reserved per block by
#   the driver (reservedSharedMemPerBlock, cudaDevAttrReservedSharedMemoryPerBlock);
#   sm_80: 164 KiB shared memory per SM, 163 KiB per block with the opt-in;
#   sm_90: 228 KiB per SM, 227 KiB per block with the opt-in; 48 KiB per block without it.
#   Hopper only: named barriers limit blocks to 2 * 32 / barriers-per-block
#   (cudaOccMaxBlocksPerSMBlockBarrierLimit, applied for compute capability >= 9).


@dataclasses.dataclass(frozen=True)
class Arch:
    name: str
    major: int
    max_threads_per_sm: int = 2048
    max_threads_per_block: int = 1024
    max_blocks_per_sm: int = 32
    warp_size: int = 32
    regs_per_sm: int = 65536
    regs_per_block: int = 65536
    reg_alloc_unit: int = 256  # registers, per warp
    max_regs_per_thread: int = 255
    sub_partitions: int = 4
    smem_per_sm: int = 0
    smem_per_block_optin: int = 0
    smem_per_block_default: int = 48 * 1024
    smem_reserved_per_block: int = 1024
    smem_alloc_unit: int = 128
    barriers_limit_blocks: bool = False  # cudaOcc applies the barrier limit from cc 9.0

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // self.warp_size


ARCHS: Dict[str, Arch] = {
    "sm_80": Arch("sm_80", 8, smem_per_sm=164 * 1024, smem_per_block_optin=163 * 1024),
    "sm_90": Arch("sm_90", 9, smem_per_sm=228 * 1024, smem_per_block_optin=227 * 1024,
                  barriers_limit_blocks=True),
}


def round_up(x: int, unit: int) -> int:
    return (x + unit - 1) // unit * unit


@dataclasses.dataclass
class Occupancy:
    blocks_per_sm: int
    warps_per_block: int
    occupancy: float  # active warps / max warps per SM
    limits: Dict[str, int]  # blocks per SM allowed by each resource
    limiter: str  # the resource(s) giving blocks_per_sm
    smem_per_block: int  # allocated: static + dynamic + reserved, rounded


def occupancy(arch: Arch, regs: int, block: int, smem_static: int, smem_dynamic: int,
              barriers: int = 0) -> Occupancy:
    """Theoretical occupancy: cudaOccMaxActiveBlocksPerMultiprocessor's rules with the
    default carveout (the whole shared memory of the SM available) and the shared-memory
    opt-in granted (the host code opts in above 48 KiB)."""
    if block <= 0:
        raise ValueError("block size must be positive")
    big = 1 << 30
    warps = -(-block // arch.warp_size)
    limits: Dict[str, int] = {}

    # warps
    limits["warps"] = 0 if block > arch.max_threads_per_block else arch.max_warps_per_sm // warps
    limits["blocks"] = arch.max_blocks_per_sm

    # registers (cudaOccMaxBlocksPerSMRegsLimit)
    regs_per_warp = round_up(regs * arch.warp_size, arch.reg_alloc_unit)
    regs_per_cta = regs_per_warp * warps
    regs_assumed = regs_per_warp * round_up(warps, arch.sub_partitions)
    if regs > arch.max_regs_per_thread or regs_per_cta > arch.regs_per_block or \
            regs_assumed > arch.regs_per_block:
        limits["registers"] = 0
    elif regs_per_warp == 0:
        limits["registers"] = big
    else:
        per_sub = (arch.regs_per_sm // arch.sub_partitions) // regs_per_warp
        limits["registers"] = per_sub * arch.sub_partitions // warps

    # shared memory (cudaOccMaxBlocksPerSMSmemLimit)
    smem = round_up(smem_static + smem_dynamic + arch.smem_reserved_per_block, arch.smem_alloc_unit)
    if smem > arch.smem_per_block_optin + arch.smem_reserved_per_block:
        limits["shared memory"] = 0
    else:
        limits["shared memory"] = arch.smem_per_sm // smem

    # barriers (cudaOccMaxBlocksPerSMBlockBarrierLimit, Hopper on)
    if arch.barriers_limit_blocks and barriers > 0:
        limits["barriers"] = 2 * arch.max_blocks_per_sm // barriers

    blocks = min(limits.values())
    limiter = ", ".join(k for k, v in limits.items() if v == blocks)
    return Occupancy(blocks_per_sm=blocks, warps_per_block=warps,
                     occupancy=blocks * warps / arch.max_warps_per_sm, limits=limits,
                     limiter=limiter, smem_per_block=smem)


# --------------------------------------------------------------------------------------
# ptxas -v and PTX
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class FunctionUsage:
    mangled: str
    arch: str
    entry: bool = False
    registers: Optional[int] = None
    barriers: int = 0
    smem_static: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    source: str = ""  # the .cu file it was compiled from


_RE_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+a?)'")
_RE_PROPS = re.compile(r"Function properties for (\S+)")
_RE_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_RE_USED = re.compile(r"Used (\d+) registers")
_RE_BARRIERS = re.compile(r"used (\d+) barriers")
_RE_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(text: str, default_arch: str = "", source: str = "") -> List[FunctionUsage]:
    """Functions of one `ptxas -v` log (as nvcc -Xptxas -v prints it), in order.

    Entry functions carry registers, barriers and static shared memory ("Used ..."
    line after "Compiling entry function"); every function, entry or not, carries
    stack frame and spills ("Function properties for" + the line after it)."""
    funcs: Dict[Tuple[str, str], FunctionUsage] = {}
    order: List[FunctionUsage] = []
    arch = default_arch
    current: Optional[FunctionUsage] = None  # entry whose "Used" line is still to come
    pending_props: Optional[str] = None

    def get(name: str) -> FunctionUsage:
        key = (name, arch)
        if key not in funcs:
            funcs[key] = FunctionUsage(mangled=name, arch=arch, source=source)
            order.append(funcs[key])
        return funcs[key]

    for line in text.splitlines():
        m = _RE_ENTRY.search(line)
        if m:
            arch = m.group(2)
            current = get(m.group(1))
            current.entry = True
            pending_props = None
            continue
        m = _RE_PROPS.search(line)
        if m:
            pending_props = m.group(1)
            continue
        m = _RE_FRAME.search(line)
        if m and pending_props is not None:
            f = get(pending_props)
            f.stack, f.spill_stores, f.spill_loads = (int(g) for g in m.groups())
            pending_props = None
            continue
        m = _RE_USED.search(line)
        if m and current is not None:
            current.registers = int(m.group(1))
            b = _RE_BARRIERS.search(line)
            current.barriers = int(b.group(1)) if b else 0
            s = _RE_SMEM.search(line)
            current.smem_static = int(s.group(1)) if s else 0
            current = None
    return order


@dataclasses.dataclass
class PtxEntry:
    maxntid: Optional[Tuple[int, int, int]] = None
    minnctapersm: Optional[int] = None
    maxnreg: Optional[int] = None


_RE_PTX_ENTRY = re.compile(r"\.entry\s+([A-Za-z_$][\w$]*)\s*\(")


def parse_ptx_entries(ptx: str) -> Dict[str, PtxEntry]:
    """Per .entry of a PTX file: .maxntid (from __launch_bounds__' first argument),
    .minnctapersm (its second), .maxnreg."""
    out: Dict[str, PtxEntry] = {}
    for m in _RE_PTX_ENTRY.finditer(ptx):
        close = ptx.find(")", m.end())
        body = ptx.find("{", close)
        if close < 0 or body < 0:
            continue
        directives = ptx[close + 1:body]
        e = PtxEntry()
        d = re.search(r"\.maxntid\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?", directives)
        if d:
            e.maxntid = (int(d.group(1)), int(d.group(2) or 1), int(d.group(3) or 1))
        d = re.search(r"\.minnctapersm\s+(\d+)", directives)
        if d:
            e.minnctapersm = int(d.group(1))
        d = re.search(r"\.maxnreg\s+(\d+)", directives)
        if d:
            e.maxnreg = int(d.group(1))
        out[m.group(1)] = e
    return out


# --------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------


def demangle(names: Sequence[str]) -> Dict[str, str]:
    """Mangled -> demangled through c++filt (one process for all names)."""
    names = sorted(set(names))
    if not names:
        return {}
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if tool is None:
        raise RuntimeError("c++filt (binutils) not found: kernel names cannot be demangled")
    res = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True,
                         check=True)
    lines = res.stdout.splitlines()
    if len(lines) != len(names):
        raise RuntimeError("c++filt returned %d names for %d" % (len(lines), len(names)))
    return dict(zip(names, lines))


def _strip_params(sig: str) -> str:
    """`void ns::f<int>(int*, float)` -> `ns::f<int>`: drops the return type and the
    parameter list (the last top-level parenthesised group)."""
    s = sig.strip()
    if s.endswith(")"):
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            c = s[i]
            if c == ")":
                depth += 1
            elif c == "(":
                depth -= 1
                if depth == 0:
                    # "(anonymous namespace)" is part of a name, not a parameter list
                    if s[i:].startswith("(anonymous namespace)"):
                        break
                    s = s[:i]
                    break
    # the return type: a leading "void " before the qualified name (templates only)
    if s.startswith("void "):
        s = s[5:]
    return s


def short_name(demangled: str) -> str:
    """The name budgets match and the table shows: no return type, no parameters, no
    trainer::cuda:: or (anonymous namespace):: qualification (anywhere, template
    arguments included)."""
    s = _strip_params(demangled)
    s = s.replace("(anonymous namespace)::", "")
    s = s.replace("trainer::cuda::", "").replace("trainer::", "")
    # CUB's versioned inline namespace (cub::CUB_300001_SM_800::, or SM_800_900 when
    # one compile makes both) names the library version and the architectures: left
    # out, so one budget line fits every build
    s = re.sub(r"\bCUB_\d+_SM_\d+(?:_\d+)*::", "", s)
    while "> >" in s:
        s = s.replace("> >", ">>")
    return s


def base_name(short: str) -> str:
    """The kernel's identifier: `ns::f<T, 4>` -> `f`."""
    return short.split("<", 1)[0].split("::")[-1]


# --------------------------------------------------------------------------------------
# Source: launch sites and their block sizes
# --------------------------------------------------------------------------------------


def read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def strip_comments(src: str, blank_strings: bool = False) -> str:
    """C/C++ comments -> spaces (newlines kept, so line numbers stay); string literals
    kept, or with blank_strings their contents blanked too (a `<<<` in a message is no
    launch)."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in src[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            lit = src[i:j + 1]
            if blank_strings and len(lit) >= 2:
                lit = '"' + "".join(ch if ch == "\n" else " " for ch in lit[1:-1]) + '"'
            out.append(lit)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


_RE_CONSTEXPR = re.compile(
    r"\bconstexpr\s+(?:static\s+)?(?:const\s+)?(?:unsigned\s+int|unsigned|int|int32_t|int64_t|"
    r"uint32_t|uint64_t|size_t|long)\s+(\w+\s*=[^;]+);")
_RE_INCLUDE = re.compile(r'#include\s+"([^"]+)"')
_RE_GLOBAL = re.compile(
    r"__global__\s+(?:void\s+)?(?:__launch_bounds__\s*\(([^)]*)\)\s*)?(?:void\s+)?(\w+)\s*\(")


class ExprError(Exception):
    pass


def eval_int(expr: str, names: Dict[str, str], depth: int = 0) -> int:
    """A C++ integer constant expression of literals, names (resolved through `names`,
    each a further expression), + - * / % and parentheses; functional casts such as
    unsigned(x), int(x), static_cast<int>(x) are ignored. Anything else: ExprError."""
    if depth > 20:
        raise ExprError("constant nesting too deep: " + expr)
    e = expr.strip()
    e = re.sub(r"static_cast<[^<>]*>\s*\(", "(", e)
    e = re.sub(r"\b(?:unsigned|int|int64_t|int32_t|uint32_t|size_t|long)\s*\(", "(", e)
    e = re.sub(r"\b(\d+)(?:[uUlL]+)\b", r"\1", e)
    e = e.replace("/", "//")
    try:
        tree = ast.parse(e, mode="eval")
    except SyntaxError as err:
        raise ExprError("not a constant expression: " + expr) from err

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            if isinstance(node.op, ast.FloorDiv):
                return int(a / b)  # C++ truncates
            if isinstance(node.op, ast.Mod):
                return a % b
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise ExprError("'%s' is not a compile-time constant here" % node.id)
            return eval_int(names[node.id], names, depth + 1)
        raise ExprError("not a constant expression: " + expr)

    return ev(tree)


def split_top_level(s: str, sep: str = ",") -> List[str]:
    parts, depth, cur = [], 0, []
    for c in s:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


@dataclasses.dataclass
class LaunchSite:
    kernel: str  # base name of the __global__ function launched
    file: str
    line: int
    block_expr: str
    block: Optional[int]  # None: not a compile-time constant
    why: str = ""


@dataclasses.dataclass
class SourceInfo:
    launch_sites: Dict[str, List[LaunchSite]]
    kernels: Dict[str, List[str]]  # base name -> files defining it


def _file_constants(path: str, root: str, seen: Optional[set] = None) -> Dict[str, str]:
    """constexpr integer names of a file and (first) of the repository headers it
    includes; the file's own definitions win."""
    seen = set() if seen is None else seen
    if path in seen or not os.path.exists(path):
        return {}
    seen.add(path)
    text = strip_comments(read_text(path))
    consts: Dict[str, str] = {}
    for inc in _RE_INCLUDE.findall(text):
        consts.update(_file_constants(os.path.join(root, inc), root, seen))
    for decl in _RE_CONSTEXPR.findall(text):
        for part in split_top_level(decl):  # constexpr int a = 1, b = a * 2;
            name, eq, expr = part.partition("=")
            if eq and re.fullmatch(r"\s*\w+\s*", name):
                consts[name.strip()] = expr.strip()
    return consts


def _local_block_value(text: str, upto: int, name: str, consts: Dict[str, str]) -> int:
    """A local `dim3 name{a, b, c}` / `dim3 name(a, b)` / `const int name = expr;` declared
    before `upto` (the closest one): its thread count."""
    window = text[max(0, upto - 4000):upto]
    cands = []
    for m in re.finditer(r"\bdim3\s+%s\s*([({])" % re.escape(name), window):
        close = ")" if m.group(1) == "(" else "}"
        j = window.find(close, m.end())
        if j > 0:
            cands.append(("dim3", window[m.end():j]))
    for m in re.finditer(r"\b(?:const\s+)?(?:int|unsigned|int64_t|size_t|auto)\s+%s\s*=\s*([^;]+);"
                         % re.escape(name), window):
        cands.append(("scalar", m.group(1)))
    if not cands:
        raise ExprError("'%s' is not a compile-time constant here" % name)
    kind, body = cands[-1]
    if kind == "dim3":
        total = 1
        for part in split_top_level(body):
            if part:
                total *= eval_int(part, consts)
        return total
    return eval_int(body, consts)


def _callee_before(text: str, end: int) -> str:
    """The kernel a `<<<` at `end` launches: an identifier, optionally followed by
    <template args>."""
    j = end - 1
    while j >= 0 and text[j].isspace():
        j -= 1
    if j >= 0 and text[j] == ">":
        depth = 0
        while j >= 0:
            if text[j] == ">":
                depth += 1
            elif text[j] == "<":
                depth -= 1
                if depth == 0:
                    break
            j -= 1
        j -= 1
    stop = j + 1
    while j >= 0 and (text[j].isalnum() or text[j] == "_"):
        j -= 1
    return text[j + 1:stop]


_RE_LAUNCH_CALL = re.compile(r"(?<![\w.>])launch\s*\(\s*(\w+)\s*")


def _launch_call(text: str, m: "re.Match[str]") -> Optional[Tuple[str, List[str]]]:
    """`launch(kernel<...>, grid, block, smem, stream, args...)` (kernels/cuda/launch.cuh)
    at m -> (callee, [grid, block, ...]); None for anything else named launch (its
    definition: the first parameter is no kernel name)."""
    i = m.end()
    if text.startswith("<", i):  # template arguments, which may hold commas
        depth = 0
        while i < len(text):
            depth += {"<": 1, ">": -1}.get(text[i], 0)
            i += 1
            if depth == 0:
                break
        while i < len(text) and text[i].isspace():
            i += 1
    if not text.startswith(",", i):
        return None
    depth, j = 1, i + 1
    while j < len(text) and depth:
        depth += {"(": 1, ")": -1}.get(text[j], 0)
        j += 1
    return m.group(1), split_top_level(text[i + 1:j - 1])


def _launch_site(text: str, at: int, callee: str, config: List[str], rel: str,
                 consts: Dict[str, str]) -> LaunchSite:
    """A launch of `callee` at offset `at` with the launch configuration's parts
    (grid, block, ...): its block size when that is a compile-time constant."""
    line = text.count("\n", 0, at) + 1
    # a local alias: `auto kernel = some_kernel<...>;`
    alias = None
    for a in re.finditer(r"\bauto\s+%s\s*=\s*(\w+)" % re.escape(callee), text[max(0, at - 4000):at]):
        alias = a.group(1)
    kernel = alias or callee
    expr = config[1] if len(config) > 1 else ""
    block: Optional[int] = None
    why = ""
    try:
        try:
            block = eval_int(expr, consts)
        except ExprError:
            if re.fullmatch(r"\w+", expr):
                block = _local_block_value(text, at, expr, consts)
            else:
                raise
    except (ExprError, ZeroDivisionError) as err:
        why = str(err)
    return LaunchSite(kernel, rel, line, expr, block, why)


def scan_sources(paths: Iterable[str], root: str) -> SourceInfo:
    """Every `launch(kernel<...>, grid, block, ...)` and `kernel<...><<<grid, block, ...>>>`
    in the given files, with the block size when it is a compile-time constant
    (literals, constexpr names of the file and its includes, local dim3 / const int
    built from those)."""
    sites: Dict[str, List[LaunchSite]] = {}
    kernels: Dict[str, List[str]] = {}
    for path in paths:
        rel = os.path.relpath(path, root)
        text = strip_comments(read_text(path), blank_strings=True)
        consts = _file_constants(path, root)
        for m in _RE_GLOBAL.finditer(text):
            kernels.setdefault(m.group(2), []).append(rel)
        found = []
        for m in re.finditer(r"<<<", text):
            callee = _callee_before(text, m.start())
            close = text.find(">>>", m.end())
            if callee and close >= 0:
                found.append((m.start(), callee, split_top_level(text[m.end():close])))
        for m in _RE_LAUNCH_CALL.finditer(text):
            call = _launch_call(text, m)
            if call:
                found.append((m.start(), call[0], call[1]))
        for at, callee, config in sorted(found, key=lambda f: f[0]):
            site = _launch_site(text, at, callee, config, rel, consts)
            sites.setdefault(site.kernel, []).append(site)
    return SourceInfo(launch_sites=sites, kernels=kernels)


# --------------------------------------------------------------------------------------
# Budgets
# --------------------------------------------------------------------------------------

OPTIN = "optin"  # dynamic smem: all that the opt-in limit leaves beside the static smem
NOT_LAUNCHED = "-"  # block: a kernel nothing launches (only spills and registers checked)


@dataclasses.dataclass
class Budget:
    pattern: str
    block: Optional[int]  # None: never launched
    dyn_smem: str  # bytes, or OPTIN
    floor: float
    max_regs: int
    arch: str = "*"
    line: int = 0
    regex: Optional["re.Pattern[str]"] = None

    def matches(self, name: str, arch: str) -> bool:
        assert self.regex is not None
        return (self.arch in ("*", arch)) and self.regex.fullmatch(name) is not None

    def dyn_bytes(self, arch: Arch, smem_static: int) -> int:
        if self.dyn_smem == OPTIN:
            return arch.smem_per_block_optin - smem_static
        return int(self.dyn_smem)

    def label(self) -> str:
        return self.pattern if self.arch == "*" else "%s @%s" % (self.pattern, self.arch)


def glob_to_regex(pattern: str) -> "re.Pattern[str]":
    """`*` any run of characters, `?` one; everything else literal (names contain
    brackets, which fnmatch would read as classes)."""
    out = []
    for c in pattern:
        out.append(".*" if c == "*" else "." if c == "?" else re.escape(c))
    return re.compile("".join(out))


BUDGET_COLUMNS = ("pattern", "block", "dyn_smem", "floor", "max_regs", "arch")


def parse_budgets(text: str) -> List[Budget]:
    """Tab-separated: pattern, block, dyn_smem, floor, max_regs[, arch]. Lines starting
    with `#` and blank lines are skipped, and so is the header line (pattern ...).
    block `-`: never launched (floor must be 0); dyn_smem `optin`: the opt-in maximum
    less the kernel's static shared memory; arch `*` (the default) or one of ARCHS."""
    budgets: List[Budget] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip("\r\n")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cols = [c.strip() for c in line.split("\t")]
        if cols[0] == "pattern":
            continue
        if len(cols) not in (5, 6):
            raise ValueError("budgets line %d: %d columns, expected 5 or 6 (tab-separated: %s)"
                             % (n, len(cols), ", ".join(BUDGET_COLUMNS)))
        try:
            b = Budget(pattern=cols[0], block=None if cols[1] == NOT_LAUNCHED else int(cols[1]),
                       dyn_smem=cols[2], floor=float(cols[3]), max_regs=int(cols[4]),
                       arch=cols[5] if len(cols) == 6 else "*", line=n)
            if b.dyn_smem != OPTIN:
                int(b.dyn_smem)
        except ValueError as err:
            raise ValueError("budgets line %d: %s" % (n, err)) from err
        if not 0.0 <= b.floor <= 1.0:
            raise ValueError("budgets line %d: floor %s is not a fraction" % (n, cols[3]))
        if b.block is None and b.floor != 0.0:
            raise ValueError("budgets line %d: a kernel that is never launched has floor 0" % n)
        if b.block is not None and not 1 <= b.block <= 1024:
            raise ValueError("budgets line %d: block %d is not 1..1024" % (n, b.block))
        if b.arch != "*" and b.arch not in ARCHS:
            raise ValueError("budgets line %d: unknown arch %s" % (n, b.arch))
        b.regex = glob_to_regex(b.pattern)
        budgets.append(b)
    return budgets


# --------------------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Row:
    """One kernel (instance) compiled for one architecture."""
    name: str
    file: str
    arch: str
    regs: int
    spill_stores: int
    spill_loads: int
    stack: int
    smem_static: int
    barriers: int
    launch_bounds: Optional[int]
    min_blocks: Optional[int]
    budget: Optional[Budget] = None
    dyn_smem: Optional[int] = None
    occ: Optional[Occupancy] = None


def check(funcs: Sequence[FunctionUsage], names: Dict[str, str],
          ptx: Dict[Tuple[str, str], PtxEntry], budgets: Sequence[Budget],
          sources: Optional[SourceInfo]) -> Tuple[List[Row], List[str]]:
    """The table's rows (every entry function) and one line per violation."""
    rows: List[Row] = []
    violations: List[str] = []
    used = [False] * len(budgets)

    for f in funcs:
        short = short_name(names.get(f.mangled, f.mangled))
        where = "%s (%s, %s)" % (short, f.source, f.arch)
        if f.spill_stores or f.spill_loads:
            violations.append("SPILL %s: %d bytes spill stores, %d bytes spill loads"
                              % (where, f.spill_stores, f.spill_loads))
        if not f.entry:
            continue
        if f.arch not in ARCHS:
            violations.append("PARSE %s: no occupancy limits for %s" % (where, f.arch))
            continue
        arch = ARCHS[f.arch]
        entry = ptx.get((f.mangled, f.arch), PtxEntry())
        lb = entry.maxntid[0] * entry.maxntid[1] * entry.maxntid[2] if entry.maxntid else None
        if f.registers is None:
            violations.append("PARSE %s: no register count in the ptxas output" % where)
        row = Row(name=short, file=f.source, arch=f.arch, regs=f.registers or 0,
                  spill_stores=f.spill_stores, spill_loads=f.spill_loads, stack=f.stack,
                  smem_static=f.smem_static, barriers=f.barriers, launch_bounds=lb,
                  min_blocks=entry.minnctapersm)
        rows.append(row)

        matching = [i for i, b in enumerate(budgets) if b.matches(short, f.arch)]
        for i in matching:
            used[i] = True
        if not matching:
            violations.append("UNBUDGETED %s: no line of the budget file matches it" % where)
            continue
        if len(matching) > 1:
            violations.append("AMBIGUOUS %s: budget lines %s all match it"
                              % (where, ", ".join(str(budgets[i].line) for i in matching)))
            continue
        b = budgets[matching[0]]
        row.budget = b
        if row.regs > b.max_regs:
            violations.append("REGISTERS %s: %d registers, budget %d" % (where, row.regs, b.max_regs))
        violations += check_block(where, short, b, lb, sources)
        if b.block is None:
            continue
        row.dyn_smem = b.dyn_bytes(arch, f.smem_static)
        occ = occupancy(arch, row.regs, b.block, f.smem_static, row.dyn_smem, f.barriers)
        row.occ = occ
        if occ.blocks_per_sm == 0:
            violations.append("LAUNCH %s: no block of %d threads fits an SM (%s; %d registers, "
                              "%d bytes of shared memory)"
                              % (where, b.block, occ.limiter, row.regs, f.smem_static + row.dyn_smem))
        elif occ.occupancy + 1e-9 < b.floor:
            violations.append("OCCUPANCY %s: %s (%d blocks of %d warps, limited by %s), floor %s"
                              % (where, fmt_frac(occ.occupancy), occ.blocks_per_sm,
                                 occ.warps_per_block, occ.limiter, fmt_frac(b.floor)))

    archs = {f.arch for f in funcs}
    for i, b in enumerate(budgets):
        if not used[i] and (b.arch == "*" or b.arch in archs):
            violations.append("STALE budget line %d (%s): matches no kernel" % (b.line, b.label()))
    return rows, violations


def check_block(where: str, short: str, b: Budget, lb: Optional[int],
                sources: Optional[SourceInfo]) -> List[str]:
    """The budget's block size against the code: __launch_bounds__ when the kernel has
    one, else every launch site in the sources (a kernel the sources do not define, a
    library's, is launched by the library: its budget line says where the size is)."""
    out: List[str] = []
    sites: List[LaunchSite] = []
    ours = True
    if sources is not None:
        base = base_name(short)
        sites = sources.launch_sites.get(base, [])
        ours = base in sources.kernels
    if b.block is None:
        if sites:
            out.append("BLOCK %s: budgeted as never launched, but launched at %s"
                       % (where, ", ".join("%s:%d" % (s.file, s.line) for s in sites)))
        return out
    if lb is not None and b.block != lb:
        out.append("BLOCK %s: budget block %d, __launch_bounds__ %d" % (where, b.block, lb))
    if sources is None:
        return out
    if lb is None and ours and not sites:
        out.append("BLOCK %s: no __launch_bounds__ and no launch site in the sources" % where)
    for s in sites:
        at = "%s:%d" % (s.file, s.line)
        if s.block is None:
            if lb is None:
                out.append("BLOCK %s: no __launch_bounds__, and the block size at %s (%s) is not "
                           "a compile-time constant: %s" % (where, at, s.block_expr, s.why))
        elif lb is not None and s.block > lb:
            out.append("BLOCK %s: launched with %d threads at %s, above its __launch_bounds__ %d"
                       % (where, s.block, at, lb))
        elif lb is None and s.block != b.block:
            out.append("BLOCK %s: budget block %d, launched with %d at %s"
                       % (where, b.block, s.block, at))
    return out


# --------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------


def fmt_frac(x: float) -> str:
    """0.375 -> "0.375", 1.0 -> "1" (occupancies are multiples of 1/64: exact)."""
    s = "%.6f" % x
    return s.rstrip("0").rstrip(".")


def fmt_pct(x: Optional[float]) -> str:
    if x is None:
        return "-"
    s = "%.2f" % (100 * x)
    return s.rstrip("0").rstrip(".") + "%"


def _cell(s: str) -> str:
    return s.replace("|", "\\|")


def render_full_table(rows: Sequence[Row]) -> str:
    """Every kernel instance and architecture."""
    lines = ["| kernel | file | arch | regs | max regs | spill st/ld | stack | smem static | dyn smem "
             "| block | blocks/SM | occupancy | floor | limited by |",
             "|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in sorted(rows, key=lambda r: (r.arch, r.file, r.name)):
        b, occ = r.budget, r.occ
        lines.append("| `%s` | %s | %s | %d | %s | %d/%d | %d | %d | %s | %s | %s | %s | %s | %s |" % (
            _cell(r.name), os.path.basename(r.file), r.arch, r.regs, "-" if b is None else b.max_regs,
            r.spill_stores, r.spill_loads, r.stack, r.smem_static,
            "-" if r.dyn_smem is None else r.dyn_smem,
            "-" if b is None or b.block is None else b.block,
            "-" if occ is None else occ.blocks_per_sm, fmt_pct(occ.occupancy if occ else None),
            "-" if b is None else fmt_pct(b.floor), "-" if occ is None else occ.limiter))
    return "\n".join(lines)


@dataclasses.dataclass
class Group:
    """The rows of one budget line on one architecture."""
    budget: Budget
    arch: str
    rows: List[Row]

    @property
    def worst(self) -> Optional[Row]:
        launched = [r for r in self.rows if r.occ is not None]
        return min(launched, key=lambda r: (r.occ.occupancy, -r.regs)) if launched else None


def group_rows(rows: Sequence[Row], budgets: Sequence[Budget], archs: Sequence[str]) -> List[Group]:
    groups: List[Group] = []
    for arch in archs:
        for b in budgets:
            if b.arch not in ("*", arch):
                continue
            groups.append(Group(b, arch, [r for r in rows if r.budget is b and r.arch == arch]))
    return groups


def render_summary(groups: Sequence[Group], arch: str) -> str:
    """One row per budget line: its instances' worst case on one architecture."""
    lines = ["| kernel | arch | files | n | regs | max regs | spills | smem static | dyn smem | block "
             "| blocks/SM | occupancy | floor | limited by |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for g in groups:
        if g.arch != arch:
            continue
        b, rows = g.budget, g.rows
        w = g.worst
        files = ", ".join(sorted({os.path.basename(r.file) for r in rows})) or "-"
        lines.append("| `%s` | %s | %s | %d | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            _cell(b.pattern), arch, files, len(rows), max((r.regs for r in rows), default="-"), b.max_regs,
            sum(r.spill_stores + r.spill_loads for r in rows),
            max((r.smem_static for r in rows), default="-"),
            "-" if w is None else ("%d (opt-in max)" % w.dyn_smem if b.dyn_smem == OPTIN else w.dyn_smem),
            "never launched" if b.block is None else b.block,
            "-" if w is None else w.occ.blocks_per_sm, fmt_pct(w.occ.occupancy if w else None),
            fmt_pct(b.floor) if b.block is not None else "-", "-" if w is None else w.occ.limiter))
    return "\n".join(lines)


def suggest(groups: Sequence[Group], budgets: Sequence[Budget]) -> str:
    """The budget file's lines at today's values: each floor at the lowest occupancy of
    its kernels, max_regs at their highest register count rounded up to the allocation
    unit (8 registers a thread, 256 a warp: a count within it allocates the same). A line
    for every architecture whose values differ from another's. For review, never to be
    pasted over a regression unread."""
    out = ["\t".join(BUDGET_COLUMNS)]
    for b in budgets:
        per_arch: Dict[str, Tuple[str, int]] = {}
        for g in groups:
            if g.budget is not b:
                continue
            occs = [r.occ.occupancy for r in g.rows if r.occ is not None]
            regs = max((r.regs for r in g.rows), default=0)
            per_arch[g.arch] = (fmt_frac(min(occs)) if occs else "0", round_up(regs, 8))
        values = sorted(set(per_arch.values()), key=lambda v: (float(v[0]), v[1]))
        block = NOT_LAUNCHED if b.block is None else str(b.block)
        if b.arch == "*" and len(values) > 1:
            for arch, (floor, regs) in sorted(per_arch.items()):
                out.append("\t".join([b.pattern, block, b.dyn_smem, floor, str(regs), arch]))
            continue
        floor, regs = values[0] if values else ("0", 0)
        cols = [b.pattern, block, b.dyn_smem, floor, str(regs)] + ([] if b.arch == "*" else [b.arch])
        out.append("\t".join(cols))
    return "\n".join(out)


# --------------------------------------------------------------------------------------
# Build
# --------------------------------------------------------------------------------------


def cmake_cuda_sources(root: str) -> List[str]:
    """The .cu files of the CUDA module: CMakeLists.txt's CUDA_MODULE_SOURCES glob and the
    .cu files trainer_cuda's target_sources add."""
    text = read_text(os.path.join(root, "CMakeLists.txt"))
    patterns: List[str] = []
    m = re.search(r"file\s*\(\s*GLOB\w*\s+CUDA_MODULE_SOURCES\b([^)]*)\)", text)
    if not m:
        raise RuntimeError("CMakeLists.txt: no file(GLOB CUDA_MODULE_SOURCES ...)")
    patterns += m.group(1).split()
    for t in re.finditer(r"(?:add_library\s*\(\s*trainer_cuda|target_sources\s*\(\s*trainer_cuda)"
                         r"\b([^)]*)\)", text):
        patterns += t.group(1).split()
    files = set()
    for p in patterns:
        p = p.replace("${CMAKE_SOURCE_DIR}", root).replace("${CMAKE_CURRENT_SOURCE_DIR}", root)
        if p.endswith(".cu"):
            files.update(glob.glob(p))
    if not files:
        raise RuntimeError("CMakeLists.txt: the CUDA module lists no .cu file")
    return sorted(files)


def cmake_cuda_archs(root: str) -> List[str]:
    text = read_text(os.path.join(root, "CMakeLists.txt"))
    m = re.search(r"set\s*\(\s*CMAKE_CUDA_ARCHITECTURES\s+([^)]*)\)", text)
    if not m:
        raise RuntimeError("CMakeLists.txt: no set(CMAKE_CUDA_ARCHITECTURES ...)")
    return ["sm_" + a.strip('"') for a in m.group(1).split()]


def nvcc_flags(root: str) -> List[str]:
    """What the build passes nvcc for libtrainer_cuda.so's .cu files (CMake Release,
    CMakeLists.txt): -O3 -DNDEBUG, the module's definitions, the include root,
    --expt-relaxed-constexpr -lineinfo -std=c++20. Host-only flags (-Xcompiler=...)
    are left out: only device code is compiled here."""
    return ["-O3", "-DNDEBUG", "-DTRAINER_HAVE_CUDA=1", "-DTRAINER_HAVE_NCCL=1",
            "-Dtrainer_cuda_EXPORTS", "-I" + root, "--expt-relaxed-constexpr", "-lineinfo",
            "-std=c++20"]


def compile_one(nvcc: str, root: str, src: str, arch: str, out_dir: str) -> Tuple[str, str, str]:
    """src -> <out>/<stem>.<arch>.cubin with the ptxas log and the PTX next to it."""
    stem = os.path.splitext(os.path.basename(src))[0]
    keep = os.path.join(out_dir, "keep", "%s.%s" % (stem, arch))
    shutil.rmtree(keep, ignore_errors=True)
    os.makedirs(keep)
    cubin = os.path.join(out_dir, "%s.%s.cubin" % (stem, arch))
    log_path = os.path.join(out_dir, "%s.%s.ptxas.txt" % (stem, arch))
    ptx_path = os.path.join(out_dir, "%s.%s.ptx" % (stem, arch))
    cmd = [nvcc] + nvcc_flags(root) + ["-arch=" + arch, "-cubin", "-Xptxas", "-v", "--keep",
                                       "--keep-dir", keep, "-o", cubin, src]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=root)
    log = res.stdout + res.stderr
    with open(log_path, "w", encoding="utf-8") as fh:
        fh.write(log)
    if res.returncode != 0:
        raise RuntimeError("nvcc failed on %s for %s (exit %d):\n%s\n%s"
                           % (os.path.relpath(src, root), arch, res.returncode, " ".join(cmd),
                              log[-4000:]))
    ptx = [p for p in glob.glob(os.path.join(keep, "*.ptx"))]
    if len(ptx) != 1:
        raise RuntimeError("nvcc --keep left %d PTX files for %s %s" % (len(ptx), src, arch))
    shutil.move(ptx[0], ptx_path)
    shutil.rmtree(keep, ignore_errors=True)
    return src, arch, log_path


def split_by_arch(text: str, marker: "re.Pattern[str]") -> Dict[str, str]:
    """A text holding one block per architecture (nvcc's output for several -gencode
    targets) -> arch -> its block; marker's group 1 names the
    architecture a block starts with."""
    blocks: Dict[str, List[str]] = {}
    arch = None
    for line in text.splitlines():
        m = marker.search(line)
        if m:
            arch = "sm_" + m.group(1)
            blocks.setdefault(arch, [])
        if arch is not None:
            blocks[arch].append(line)
    return {a: "\n".join(lines) + "\n" for a, lines in blocks.items()}


# ptxas runs once per architecture; each of its reports starts at "Compiling entry
# function ... for 'sm_XX'" (and the functions' properties follow their entry, so a
# block holds one architecture). Kept lines before the first entry (gmem) go nowhere.
_RE_PTXAS_ARCH = re.compile(r"Compiling entry function '[^']+' for 'sm_(\d+a?)'")


_RE_PTX_START = re.compile(rb"\.version\s+[\d.]+[\0\n]+\.target\s+sm_(\d+a?)")


def ptx_in_object(obj: str) -> Dict[str, str]:
    """arch -> PTX of an object nvcc made, read from its bytes (cuobjdump would do it, but a
    minimal toolkit, as here, has none):
    nvcc 13's fat binary keeps each architecture's PTX uncompressed (unless asked to
    compress it, -Xfatbin=-compress-all), its lines ended by NUL bytes instead of
    newlines. A block runs from its .version to the next one; what follows the PTX
    (the cubin) holds no `.entry NAME(` for the parser to find."""
    with open(obj, "rb") as fh:
        data = fh.read()
    starts = list(_RE_PTX_START.finditer(data))
    out: Dict[str, str] = {}
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(data)
        text = data[m.start():end].replace(b"\0", b"\n").decode("latin-1")
        arch = "sm_" + m.group(1).decode()
        out[arch] = out.get(arch, "") + text
    return out


def take_from_build(build_dir: str, root: str, sources: Sequence[str], archs: Sequence[str],
                    out_dir: str) -> None:
    """The ptxas reports and the PTX of the objects the build made (--from-build), written
    as compile_one writes them: scripts/cuda_compile.sh kept each object's nvcc output as
    OBJECT.ptxas; the PTX is the one embedded in the object (ptx_in_object)."""
    for src in sources:
        rel = os.path.relpath(src, root)
        obj = os.path.join(build_dir, "CMakeFiles", "trainer_cuda.dir", rel + ".o")
        if not os.path.isfile(obj) or not os.path.isfile(obj + ".ptxas"):
            raise RuntimeError("%s: no object or no ptxas report (%s.ptxas) for %s: build the "
                               "CUDA module there first (cmake --build %s --target trainer_cuda)"
                               % (build_dir, obj, rel, build_dir))
        # A warning applies to every architecture: keep the lines outside the blocks too.
        log = read_text(obj + ".ptxas")
        others = "\n".join(l for l in log.splitlines()
                           if not re.search(r"^ptxas info|^ +\d+ bytes stack frame", l))
        reports = split_by_arch(log, _RE_PTXAS_ARCH)
        ptx = ptx_in_object(obj)
        stem = os.path.splitext(os.path.basename(src))[0]
        for a in archs:
            if a not in ptx:
                raise RuntimeError("%s holds no readable PTX for %s (it has %s): the build's "
                                   "CMAKE_CUDA_ARCHITECTURES differ from the budgets', or the "
                                   "fat binary is compressed (run without --from-build)"
                                   % (obj, a, ", ".join(sorted(ptx)) or "none"))
            with open(os.path.join(out_dir, "%s.%s.ptxas.txt" % (stem, a)), "w", encoding="utf-8") as fh:
                fh.write(reports.get(a, "") + others + "\n")
            with open(os.path.join(out_dir, "%s.%s.ptx" % (stem, a)), "w", encoding="utf-8") as fh:
                fh.write(ptx[a])


def find_nvcc(explicit: Optional[str]) -> Optional[str]:
    """--nvcc, else $NVCC, else nvcc on PATH, else /usr/local/cuda/bin/nvcc (where CMake
    looks too); None when none of them is there."""
    for cand in (explicit, os.environ.get("NVCC") if not explicit else None):
        if cand:
            return cand if os.path.isfile(cand) else shutil.which(cand)
    found = shutil.which("nvcc")
    if found:
        return found
    return "/usr/local/cuda/bin/nvcc" if os.path.isfile("/usr/local/cuda/bin/nvcc") else None


def main(argv: Optional[Sequence[str]] = None) -> int:
    root_default = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build_dir", nargs="?", default=None,
                    help="scratch directory for cubins, PTX and ptxas logs (default ROOT/build-budgets)")
    ap.add_argument("--root", default=root_default, help="repository root")
    ap.add_argument("--budgets", default=None, help="budget file (default kernels/cuda/budgets.tsv)")
    ap.add_argument("--arch", default=None,
                    help="comma-separated architectures (default: CMakeLists.txt's, sm_80,sm_90)")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="parallel nvcc processes (default 2)")
    ap.add_argument("--nvcc", default=None, help="nvcc to use (default: $NVCC, PATH, /usr/local/cuda)")
    ap.add_argument("--no-compile", action="store_true",
                    help="check the logs a previous run left in the build directory")
    ap.add_argument("--from-build", default=None, metavar="CMAKE_BUILD_DIR",
                    help="check the objects that build compiled (the ptxas report "
                         "scripts/cuda_compile.sh kept, the PTX in the object) instead of "
                         "compiling every file again")
    ap.add_argument("--full", action="store_true",
                    help="print every kernel instance, not one row per budget line")
    ap.add_argument("--suggest", action="store_true",
                    help="also print the budget lines at today's values (floors, max_regs)")
    args = ap.parse_args(argv)

    root = os.path.abspath(args.root)
    out_dir = os.path.abspath(args.build_dir or os.path.join(root, "build-budgets"))
    budget_path = args.budgets or os.path.join(root, "kernels", "cuda", "budgets.tsv")
    t0 = time.time()
    try:
        sources = cmake_cuda_sources(root)
        archs = args.arch.split(",") if args.arch else cmake_cuda_archs(root)
        for a in archs:
            if a not in ARCHS:
                raise RuntimeError("no occupancy limits for %s (known: %s)" % (a, ", ".join(ARCHS)))
        budgets = parse_budgets(read_text(budget_path))
    except (OSError, RuntimeError, ValueError) as err:
        print("kernel_budgets: %s" % err, file=sys.stderr)
        return 2

    nvcc = None
    if args.from_build:
        try:
            os.makedirs(out_dir, exist_ok=True)
            take_from_build(os.path.abspath(args.from_build), root, sources, archs, out_dir)
        except (OSError, RuntimeError) as err:
            print("kernel_budgets: %s" % err, file=sys.stderr)
            return 2
    elif not args.no_compile:
        nvcc = find_nvcc(args.nvcc)
        if nvcc is None:
            print("kernel_budgets: skipped: nvcc not found (set NVCC, put it on PATH or install "
                  "the CUDA toolkit in /usr/local/cuda)")
            return 77
        os.makedirs(out_dir, exist_ok=True)
        jobs = [(s, a) for s in sources for a in archs]
        jobs.sort(key=lambda sa: -os.path.getsize(sa[0]))  # the longest first
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
                for fut in [pool.submit(compile_one, nvcc, root, s, a, out_dir) for s, a in jobs]:
                    fut.result()
        except RuntimeError as err:
            print("kernel_budgets: %s" % err, file=sys.stderr)
            return 2
    t_compile = time.time() - t0

    funcs: List[FunctionUsage] = []
    ptx: Dict[Tuple[str, str], PtxEntry] = {}
    warnings: List[str] = []
    try:
        for s in sources:
            stem = os.path.splitext(os.path.basename(s))[0]
            rel = os.path.relpath(s, root)
            for a in archs:
                log = read_text(os.path.join(out_dir, "%s.%s.ptxas.txt" % (stem, a)))
                warnings += ["WARNING %s (%s): %s" % (rel, a, line.strip()) for line in log.splitlines()
                             if re.search(r"\bwarning\b", line, re.IGNORECASE)]
                funcs += parse_ptxas(log, a, rel)
                for name, e in parse_ptx_entries(
                        read_text(os.path.join(out_dir, "%s.%s.ptx" % (stem, a)))).items():
                    ptx[(name, a)] = e
        names = demangle([f.mangled for f in funcs])
    except (OSError, RuntimeError, subprocess.CalledProcessError) as err:
        print("kernel_budgets: %s" % err, file=sys.stderr)
        return 2

    headers = glob.glob(os.path.join(root, "kernels", "cuda", "*.cuh"))
    info = scan_sources(sorted(set(sources) | set(headers)), root)
    rows, violations = check(funcs, names, ptx, budgets, info)
    # a warning of the compiler (ptxas's included) is a finding too
    violations = warnings + violations
    groups = group_rows(rows, budgets, archs)

    full = render_full_table(rows)
    with open(os.path.join(out_dir, "kernel_budgets_full.md"), "w", encoding="utf-8") as fh:
        fh.write(full + "\n")
    if args.full:
        print(full)
    else:
        for a in archs:
            print("### %s\n\n%s\n" % (a, render_summary(groups, a)))
    if args.suggest:
        print("\n" + suggest(groups, budgets))
    print("\n%d kernel instances x architectures (%s) from %d files, %d budget lines; every "
          "instance in %s; nvcc %.0f s, total %.0f s"
          % (len(rows), ",".join(archs), len(sources), len(budgets),
             os.path.relpath(os.path.join(out_dir, "kernel_budgets_full.md"), os.getcwd()),
             t_compile, time.time() - t0))
    if violations:
        for v in violations:
            print(v, file=sys.stderr)
        print("kernel_budgets: FAILED: %d violation(s)" % len(violations), file=sys.stderr)
        return 1
    print("kernel_budgets: every kernel within budget (no spills, registers, block sizes and "
          "occupancy floors as budgeted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
