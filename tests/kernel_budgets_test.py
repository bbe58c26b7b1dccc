#!/usr/bin/env python3
"""Unit tests of scripts/kernel_budgets.py: the ptxas/PTX parsers, the occupancy
calculator against hand-computed cases, the budget file, the launch-site scan and the
violations. No nvcc or GPU needed (c++filt, where a test needs it, is binutils').

    python3 tests/kernel_budgets_test.py
"""

import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import kernel_budgets as kb  # noqa: E402

SM80 = kb.ARCHS["sm_80"]


def write(path, text):
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


SM90 = kb.ARCHS["sm_90"]

# What nvcc -Xptxas -v prints (CUDA 13), trimmed: a clean kernel, a spilling one, a
# non-entry function with a spill, a kernel with static smem and two barriers.
PTXAS_LOG = textwrap.dedent("""\
    ptxas info    : 0 bytes gmem
    ptxas info    : Compiling entry function 'clean_kernel' for 'sm_80'
    ptxas info    : Function properties for clean_kernel
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 64 registers, used 0 barriers, 452 bytes cmem[0]
    ptxas info    : Compile time = 32.664 ms
    ptxas info    : Function properties for helper_fn
        24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
    ptxas info    : Compiling entry function 'spilling_kernel' for 'sm_80'
    ptxas info    : Function properties for spilling_kernel
        8 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads
    ptxas info    : Used 48 registers, used 0 barriers, 8 bytes cumulative stack size, 432 bytes cmem[0]
    ptxas info    : Compile time = 21.9 ms
    ptxas info    : Compiling entry function 'smem_kernel' for 'sm_80'
    ptxas info    : Function properties for smem_kernel
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 230 registers, used 2 barriers, 1056 bytes smem, 400 bytes cmem[0]
    """)

PTX = textwrap.dedent("""\
    .version 9.0
    .target sm_80
    .visible .entry clean_kernel(
    \t.param .u64 clean_kernel_param_0,
    \t.param .align 8 .b8 clean_kernel_param_1[16]
    )
    .maxntid 128, 1, 1
    {
    \tret;
    }
    .entry spilling_kernel(
    \t.param .u64 spilling_kernel_param_0
    )
    .maxntid 256, 1, 1
    .minnctapersm 1
    {
    \tret;
    }
    .visible .entry smem_kernel(
    \t.param .u64 smem_kernel_param_0
    )
    {
    \tret;
    }
    """)


class OccupancyTest(unittest.TestCase):
    """Hand-computed with cudaOccMaxActiveBlocksPerMultiprocessor's rules (cuda_occupancy.h):
    registers per warp = round_up(regs * 32, 256), per sub-partition 16384 / that, times 4;
    shared memory per block = round_up(static + dynamic + 1024 reserved, 128)."""

    def check(self, arch, regs, block, smem_static, dyn, blocks, occupancy, barriers=0, limiter=None):
        occ = kb.occupancy(arch, regs, block, smem_static, dyn, barriers)
        self.assertEqual(occ.blocks_per_sm, blocks, occ)
        self.assertAlmostEqual(occ.occupancy, occupancy, places=9, msg=str(occ))
        if limiter is not None:
            self.assertEqual(occ.limiter, limiter, occ)
        return occ

    def test_128_threads_64_registers_is_half(self):
        # 64 * 32 = 2048 registers a warp; 16384 / 2048 = 8 warps a sub-partition, 32 an
        # SM: 8 blocks of 4 warps = 32 of 64 warps.
        self.check(SM80, 64, 128, 0, 0, blocks=8, occupancy=0.5, limiter="registers")
        self.check(SM90, 64, 128, 0, 0, blocks=8, occupancy=0.5, limiter="registers")

    def test_256_threads_32_registers_is_full(self):
        # 1024 registers a warp: 64 warps by registers, 64 by the warp limit: 8 blocks.
        self.check(SM80, 32, 256, 0, 0, blocks=8, occupancy=1.0, limiter="warps, registers")

    def test_register_allocation_unit(self):
        # 37 registers allocate as 40: 37 * 32 = 1184 -> 1280 a warp; 16384 / 1280 = 12
        # warps a sub-partition, 48 an SM: 6 blocks of 8 warps = 75%.
        self.check(SM80, 37, 256, 0, 0, blocks=6, occupancy=0.75)
        self.check(SM80, 40, 256, 0, 0, blocks=6, occupancy=0.75)
        # 41 -> 48 a thread: 1536 a warp, 10 a sub-partition, 40 an SM: 5 blocks.
        self.check(SM80, 41, 256, 0, 0, blocks=5, occupancy=0.625)

    def test_registers_are_split_over_four_sub_partitions(self):
        # 40 registers, 2-warp blocks: 12 warps a sub-partition -> 48 an SM -> 24 blocks
        # (75%); the whole file divided at once would give 65536 / 1280 = 51 warps -> 25.
        self.check(SM80, 40, 64, 0, 0, blocks=24, occupancy=0.75, limiter="registers")

    def test_shared_memory_limits(self):
        # 48 KiB dynamic + 1 KiB reserved = 50176 bytes (a multiple of 128);
        # sm_80: 167936 / 50176 = 3 blocks (12 warps, 18.75%); sm_90: 233472 / 50176 = 4.
        self.check(SM80, 32, 128, 0, 49152, blocks=3, occupancy=0.1875, limiter="shared memory")
        self.check(SM90, 32, 128, 0, 49152, blocks=4, occupancy=0.25, limiter="shared memory")
        # rounding: 100 static + 1024 reserved = 1124 -> 1152 bytes a block
        occ = kb.occupancy(SM80, 16, 32, 100, 0)
        self.assertEqual(occ.smem_per_block, 1152)

    def test_flash_forward_d128(self):
        # 230 registers -> 7424 a warp -> 2 warps a sub-partition -> 2 blocks of 4 warps;
        # 87040 + 1024 bytes: 1 block on sm_80's 164 KiB, 2 on sm_90's 228 KiB.
        self.check(SM80, 230, 128, 0, 87040, blocks=1, occupancy=0.0625, limiter="shared memory")
        self.check(SM90, 230, 128, 0, 87040, blocks=2, occupancy=0.125,
                   limiter="registers, shared memory")

    def test_opt_in_maximum_is_one_block(self):
        dyn = SM80.smem_per_block_optin - 256
        self.check(SM80, 48, 256, 256, dyn, blocks=1, occupancy=0.125, limiter="shared memory")
        self.check(SM80, 48, 256, 256, dyn + 1, blocks=0, occupancy=0.0)  # over the opt-in

    def test_1024_threads(self):
        self.check(SM80, 64, 1024, 0, 0, blocks=1, occupancy=0.5, limiter="registers")
        self.check(SM80, 32, 1024, 0, 0, blocks=2, occupancy=1.0)
        # 128 registers x 1024 threads = 131072 > 65536 registers a block: no launch
        self.check(SM80, 128, 1024, 0, 0, blocks=0, occupancy=0.0, limiter="registers")

    def test_hardware_register_check_rounds_warps_to_sub_partitions(self):
        # 21 warps x 3072 = 64512 <= 65536, but the hardware check assumes
        # round_up(21, 4) = 24 warps: 73728 > 65536, so the block cannot launch.
        self.check(SM80, 96, 672, 0, 0, blocks=0, occupancy=0.0)

    def test_single_thread_and_block_limit(self):
        self.check(SM80, 40, 1, 0, 0, blocks=32, occupancy=0.5, limiter="blocks")

    def test_barriers_limit_hopper_only(self):
        # sm_90: 2 * 32 / 4 barriers = 16 blocks; sm_80 ignores barriers (cuda_occupancy.h)
        self.check(SM90, 16, 32, 0, 0, barriers=4, blocks=16, occupancy=0.25, limiter="barriers")
        self.check(SM80, 16, 32, 0, 0, barriers=4, blocks=32, occupancy=0.5, limiter="blocks")

    def test_block_over_1024_threads(self):
        self.check(SM80, 16, 2048, 0, 0, blocks=0, occupancy=0.0)


class ParserTest(unittest.TestCase):
    def test_ptxas_log(self):
        funcs = {f.mangled: f for f in kb.parse_ptxas(PTXAS_LOG, "sm_80", "k.cu")}
        self.assertEqual(set(funcs), {"clean_kernel", "helper_fn", "spilling_kernel", "smem_kernel"})
        c = funcs["clean_kernel"]
        self.assertTrue(c.entry)
        self.assertEqual((c.registers, c.barriers, c.smem_static, c.stack, c.spill_stores, c.spill_loads),
                         (64, 0, 0, 0, 0, 0))
        self.assertEqual((c.arch, c.source), ("sm_80", "k.cu"))
        s = funcs["spilling_kernel"]
        self.assertEqual((s.registers, s.stack, s.spill_stores, s.spill_loads), (48, 8, 4, 8))
        h = funcs["helper_fn"]
        self.assertFalse(h.entry)
        self.assertIsNone(h.registers)
        self.assertEqual((h.stack, h.spill_stores, h.spill_loads), (24, 8, 12))
        m = funcs["smem_kernel"]
        self.assertEqual((m.registers, m.barriers, m.smem_static), (230, 2, 1056))

    def test_ptx_entries(self):
        e = kb.parse_ptx_entries(PTX)
        self.assertEqual(e["clean_kernel"].maxntid, (128, 1, 1))
        self.assertIsNone(e["clean_kernel"].minnctapersm)
        self.assertEqual(e["spilling_kernel"].maxntid, (256, 1, 1))
        self.assertEqual(e["spilling_kernel"].minnctapersm, 1)
        self.assertIsNone(e["smem_kernel"].maxntid)

    def test_short_names(self):
        self.assertEqual(kb.short_name(
            "void trainer::cuda::(anonymous namespace)::flash_fwd_kernel<__half, 128>"
            "(__half*, float*, __half const*, int, bool)"), "flash_fwd_kernel<__half, 128>")
        self.assertEqual(kb.short_name(
            "void trainer::cuda::map_kernel<trainer::cuda::(anonymous namespace)::GeluForward"
            "<float> >(trainer::cuda::(anonymous namespace)::GeluForward<float>, long, bool)"),
            "map_kernel<GeluForward<float>>")
        self.assertEqual(kb.short_name(
            "void trainer::cuda::attention_tiles::attention_delta_kernel<float>(float*, float const*)"),
            "attention_tiles::attention_delta_kernel<float>")
        self.assertEqual(kb.short_name("trainer::cuda::(anonymous namespace)::embedding_keys_kernel"
                                       "(unsigned int*, int*, int const*, long, long, long, long)"),
                         "embedding_keys_kernel")
        self.assertEqual(kb.short_name("void cub::CUB_300001_SM_800::detail::EmptyKernel<void>()"),
                         "cub::detail::EmptyKernel<void>")
        self.assertEqual(kb.base_name("attention_tiles::attention_delta_kernel<float>"),
                         "attention_delta_kernel")

    @unittest.skipUnless(shutil.which("c++filt"), "c++filt (binutils) not installed")
    def test_demangle(self):
        mangled = ("_ZN7trainer4cuda40_GLOBAL__N__2b4441d7_8_adamw_cu_d621af6712adamw_kernelI6__halfS3_"
                   "Lb1EEEvPT_PfPKT0_S6_S6_lidNS0_12adamw_detail6ConstsE")
        d = kb.demangle([mangled, "plain_c_name"])
        self.assertEqual(kb.short_name(d[mangled]), "adamw_kernel<__half, __half, true>")
        self.assertEqual(d["plain_c_name"], "plain_c_name")

    def test_eval_int(self):
        names = {"kThreads": "256", "kWarps": "kThreads / 32", "kRows": "8"}
        self.assertEqual(kb.eval_int("kWarps * 32", names), 256)
        self.assertEqual(kb.eval_int("unsigned(kRows) * 32u", names), 256)
        self.assertEqual(kb.eval_int("static_cast<int>(kThreads) / 3", names), 85)
        with self.assertRaises(kb.ExprError):
            kb.eval_int("threads_for(V, 8)", names)
        with self.assertRaises(kb.ExprError):
            kb.eval_int("l.threads", names)


class BudgetFileTest(unittest.TestCase):
    def test_parse(self):
        text = ("# comment\n\npattern\tblock\tdyn_smem\tfloor\tmax_regs\tarch\n"
                "flash_fwd_kernel<*, 128>\t128\t87040\t0.0625\t232\tsm_80\n"
                "norm_bwd<*>\t256\toptin\t0.125\t48\n"
                "cub::detail::EmptyKernel<void>\t-\t0\t0\t8\n")
        b = kb.parse_budgets(text)
        self.assertEqual(len(b), 3)
        self.assertEqual((b[0].block, b[0].floor, b[0].max_regs, b[0].arch, b[0].line),
                         (128, 0.0625, 232, "sm_80", 4))
        self.assertTrue(b[0].matches("flash_fwd_kernel<__nv_bfloat16, 128>", "sm_80"))
        self.assertFalse(b[0].matches("flash_fwd_kernel<__nv_bfloat16, 128>", "sm_90"))
        self.assertFalse(b[0].matches("flash_fwd_kernel<__nv_bfloat16, 64>", "sm_80"))
        self.assertEqual(b[1].dyn_bytes(SM80, 256), 163 * 1024 - 256)
        self.assertEqual(b[1].dyn_bytes(SM90, 256), 227 * 1024 - 256)
        self.assertIsNone(b[2].block)
        # brackets are literal, not fnmatch classes
        self.assertTrue(kb.parse_budgets("a[2]<*>\t32\t0\t0\t8\n")[0].matches("a[2]<int>", "sm_80"))
        self.assertFalse(kb.parse_budgets("a[2]<*>\t32\t0\t0\t8\n")[0].matches("a2<int>", "sm_80"))

    def test_errors(self):
        for bad in ("k\t256\t0\t0.5\n",            # 4 columns
                    "k\t256\t0\t1.5\t32\n",        # floor not a fraction
                    "k\t-\t0\t0.5\t32\n",          # never launched with a floor
                    "k\t2048\t0\t0.5\t32\n",       # block over 1024
                    "k\t256\tlots\t0.5\t32\n",     # dyn smem not bytes nor optin
                    "k\t256\t0\t0.5\t32\tsm_70\n"):  # unknown arch
            with self.assertRaises(ValueError, msg=bad):
                kb.parse_budgets(bad)

    def test_checked_in_budget_file_parses(self):
        budgets = kb.parse_budgets(kb.read_text(os.path.join(ROOT, "kernels", "cuda", "budgets.tsv")))
        self.assertGreater(len(budgets), 10)
        seen = set()
        for b in budgets:
            self.assertNotIn((b.pattern, b.arch), seen, "duplicate line %d" % b.line)
            seen.add((b.pattern, b.arch))


def usage(name, arch="sm_80", regs=32, stack=0, st=0, ld=0, smem=0, entry=True, source="k.cu"):
    return kb.FunctionUsage(mangled=name, arch=arch, entry=entry, registers=regs if entry else None,
                            smem_static=smem, stack=stack, spill_stores=st, spill_loads=ld, source=source)


class CheckTest(unittest.TestCase):
    """check(): the violations, each named with kernel, file, arch and the number."""

    BUDGETS = ("clean_kernel\t128\t0\t0.5\t64\n"
               "spilling_kernel\t256\t0\t0.5\t48\n"
               "low_kernel\t128\t87040\t0.125\t232\n"
               "lb_kernel\t256\t0\t0.5\t32\n"
               "site_kernel\t256\t0\t1\t32\n"
               "stale_kernel\t256\t0\t1\t32\n"
               "twice*\t256\t0\t0\t32\n"
               "twice_kernel\t256\t0\t0\t32\n")

    def run_check(self, funcs, ptx=None, sources=None):
        budgets = kb.parse_budgets(self.BUDGETS)
        names = {f.mangled: f.mangled for f in funcs}
        return kb.check(funcs, names, ptx or {}, budgets, sources)

    def find(self, violations, prefix, name):
        hits = [v for v in violations if v.startswith(prefix) and name in v]
        self.assertEqual(len(hits), 1, "%s %s in %s" % (prefix, name, violations))
        return hits[0]

    def test_violations(self):
        funcs = [
            usage("clean_kernel", regs=64),
            usage("spilling_kernel", regs=48, stack=8, st=4, ld=8),
            usage("helper_fn", entry=False, stack=24, st=8, ld=12),
            usage("low_kernel", regs=230),                     # 6.25% on sm_80 < 12.5%
            usage("lb_kernel", regs=40),                       # 40 > 32 registers
            usage("unknown_kernel"),
            usage("twice_kernel"),
        ]
        ptx = {("clean_kernel", "sm_80"): kb.PtxEntry(maxntid=(128, 1, 1)),
               ("lb_kernel", "sm_80"): kb.PtxEntry(maxntid=(128, 1, 1))}  # budget says 256
        rows, v = self.run_check(funcs, ptx)
        self.assertIn("4 bytes spill stores, 8 bytes spill loads",
                      self.find(v, "SPILL", "spilling_kernel (k.cu, sm_80)"))
        self.assertIn("8 bytes spill stores, 12 bytes spill loads", self.find(v, "SPILL", "helper_fn"))
        occ = self.find(v, "OCCUPANCY", "low_kernel (k.cu, sm_80)")
        self.assertIn("0.0625", occ)
        self.assertIn("floor 0.125", occ)
        self.assertIn("shared memory", occ)
        self.assertIn("40 registers, budget 32", self.find(v, "REGISTERS", "lb_kernel"))
        self.assertIn("budget block 256, __launch_bounds__ 128", self.find(v, "BLOCK", "lb_kernel"))
        self.find(v, "UNBUDGETED", "unknown_kernel")
        self.find(v, "STALE", "stale_kernel")
        self.find(v, "STALE", "site_kernel")
        self.find(v, "AMBIGUOUS", "twice_kernel")
        self.assertFalse([x for x in v if "clean_kernel" in x], v)
        self.assertEqual(len(v), 9, v)
        # the table has every entry function, none of the helpers
        self.assertEqual(sorted(r.name for r in rows),
                         sorted(["clean_kernel", "spilling_kernel", "low_kernel", "lb_kernel",
                                 "unknown_kernel", "twice_kernel"]))
        clean = [r for r in rows if r.name == "clean_kernel"][0]
        self.assertAlmostEqual(clean.occ.occupancy, 0.5)

    def test_launch_sites(self):
        def sources(block, expr="kThreads"):
            site = kb.LaunchSite("site_kernel", "k.cu", 12, expr, block, "" if block else "runtime")
            return kb.SourceInfo(launch_sites={"site_kernel": [site]}, kernels={"site_kernel": ["k.cu"]})
        _, v = self.run_check([usage("site_kernel", regs=32)], sources=sources(256))
        self.assertFalse([x for x in v if "site_kernel" in x], v)
        _, v = self.run_check([usage("site_kernel", regs=32)], sources=sources(128))
        self.assertIn("budget block 256, launched with 128 at k.cu:12", self.find(v, "BLOCK", "site_kernel"))
        _, v = self.run_check([usage("site_kernel", regs=32)], sources=sources(None, "threads"))
        self.assertIn("not a compile-time constant", self.find(v, "BLOCK", "site_kernel"))
        # with __launch_bounds__ a runtime block size is fine, one above it is not
        ptx = {("site_kernel", "sm_80"): kb.PtxEntry(maxntid=(256, 1, 1))}
        _, v = self.run_check([usage("site_kernel", regs=32)], ptx, sources(None, "threads"))
        self.assertFalse([x for x in v if "site_kernel" in x], v)
        site = kb.LaunchSite("site_kernel", "k.cu", 12, "512", 512)
        _, v = self.run_check([usage("site_kernel", regs=32)], ptx,
                              kb.SourceInfo({"site_kernel": [site]}, {"site_kernel": ["k.cu"]}))
        self.assertIn("above its __launch_bounds__ 256", self.find(v, "BLOCK", "site_kernel"))
        # no __launch_bounds__ and no launch site
        _, v = self.run_check([usage("site_kernel", regs=32)], sources=kb.SourceInfo({}, {"site_kernel": ["k.cu"]}))
        self.assertIn("no launch site", self.find(v, "BLOCK", "site_kernel"))

    def test_cannot_launch(self):
        budgets = kb.parse_budgets("big\t1024\t0\t0\t255\n")
        _, v = kb.check([usage("big", regs=128)], {"big": "big"}, {}, budgets, None)
        self.assertIn("no block of 1024 threads fits", self.find(v, "LAUNCH", "big"))


class SourceScanTest(unittest.TestCase):
    def test_scan(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "kernels", "cuda"))
            with open(os.path.join(d, "kernels", "cuda", "common.cuh"), "w") as fh:
                fh.write("constexpr int kThreads = 256;  // threads\nconstexpr int kWarps = kThreads / 32;\n")
            src = os.path.join(d, "kernels", "cuda", "a.cu")
            with open(src, "w") as fh:
                fh.write(textwrap.dedent("""\
                    #include "kernels/cuda/common.cuh"
                    constexpr int kTile = 32, kUnused = 1;
                    constexpr int kRows = 8;
                    template <typename T>
                    __global__ void __launch_bounds__(kThreads) lb_kernel(T* p) {}
                    __global__ void plain_kernel(float* p) {}
                    template <typename T> __global__ void dim_kernel(T* p) {}
                    static __global__ void __launch_bounds__(kWarps * 32)
                        static_kernel(int* p) {}
                    void host(int n) {
                      lb_kernel<float><<<n, kThreads, 0, stream()>>>(p);  // a comment <<<x, 1>>>
                      plain_kernel<<<grid_for(n, 256), 128, 0, stream()>>>(p);
                      const dim3 block{unsigned(kTile), unsigned(kRows)};
                      dim_kernel<std::pair<int, int>><<<grid, block, 0, stream()>>>(p);
                      auto kernel = lb_kernel<double>;
                      kernel<<<n, threads, smem, stream()>>>(p);
                      /* static_kernel<<<1, 999>>>(p); */ log("static_kernel<<<1, 998>>>");
                      static_kernel<<<1, kWarps * 32>>>(p);
                    }
                    """))
            info = kb.scan_sources([src], d)
            self.assertEqual(sorted(info.kernels), ["dim_kernel", "lb_kernel", "plain_kernel", "static_kernel"])
            blocks = {k: [(s.block, s.line) for s in v] for k, v in info.launch_sites.items()}
            self.assertEqual(blocks["lb_kernel"], [(256, 11), (None, 16)])
            self.assertEqual(blocks["plain_kernel"], [(128, 12)])
            self.assertEqual(blocks["dim_kernel"], [(256, 14)])
            self.assertEqual(blocks["static_kernel"], [(256, 18)])
            self.assertEqual(info.launch_sites["lb_kernel"][1].block_expr, "threads")

    def test_scan_launch_helper(self):
        """kernels/cuda/launch.cuh's launch(kernel, grid, block, smem, stream, args...) is a
        launch site as <<<>>> is; the helper's own definition is none."""
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "kernels", "cuda"))
            src = os.path.join(d, "kernels", "cuda", "b.cu")
            with open(src, "w") as fh:
                fh.write(textwrap.dedent("""\
                    constexpr int kThreads = 256;
                    template <typename T> __global__ void dim_kernel(T* p) {}
                    __global__ void plain_kernel(float* p) {}
                    template <typename... Params, typename... Args>
                    void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                cudaStream_t stream, Args&&... args) {}
                    void host(int n) {
                      launch(plain_kernel, grid_for(n, 256), kThreads / 2, 0, stream(), p);
                      const dim3 block{unsigned(kThreads), 1};
                      launch(dim_kernel<std::pair<int, int>>, grid, block, 0, stream(),
                             p);  // launch(plain_kernel, 1, 999, 0, s, p);
                      auto kernel = dim_kernel<float>;
                      launch(kernel, unsigned(n), n, 0, stream(), p);
                      log("launch(plain_kernel, 1, 998, 0, s, p)");
                    }
                    """))
            info = kb.scan_sources([src], d)
            blocks = {k: [(s.block, s.line) for s in v] for k, v in info.launch_sites.items()}
            self.assertEqual(blocks, {"plain_kernel": [(128, 8)], "dim_kernel": [(256, 10), (None, 13)]})

    def test_repository_sources_resolve(self):
        """Every launch site in kernels/cuda/ of a kernel without __launch_bounds__ has a
        compile-time block size (the ones with a runtime size all have bounds)."""
        import glob
        files = sorted(glob.glob(os.path.join(ROOT, "kernels", "cuda", "*.cu")) +
                       glob.glob(os.path.join(ROOT, "kernels", "cuda", "*.cuh")))
        info = kb.scan_sources(files, ROOT)
        self.assertIn("flash_fwd_kernel", info.kernels)
        self.assertEqual({s.block for s in info.launch_sites["flash_fwd_kernel"]}, {128})
        self.assertEqual({s.block for s in info.launch_sites["colsum_kernel"]}, {256})  # dim3 block

    def test_cmake_sources(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "kernels", "cuda"))
            for f in ("a.cu", "b.cu", "c.cpp"):
                write(os.path.join(d, "kernels", "cuda", f), "")
            with open(os.path.join(d, "CMakeLists.txt"), "w") as fh:
                fh.write("set(CMAKE_CUDA_ARCHITECTURES 80 90)\n"
                         "file(GLOB CUDA_MODULE_SOURCES CONFIGURE_DEPENDS\n"
                         "  ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cu ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cpp)\n")
            self.assertEqual([os.path.basename(p) for p in kb.cmake_cuda_sources(d)], ["a.cu", "b.cu"])
            self.assertEqual(kb.cmake_cuda_archs(d), ["sm_80", "sm_90"])

    def test_repository_cmake(self):
        srcs = [os.path.relpath(p, ROOT) for p in kb.cmake_cuda_sources(ROOT)]
        self.assertIn(os.path.join("kernels", "cuda", "attention.cu"), srcs)
        self.assertEqual(kb.cmake_cuda_archs(ROOT), ["sm_80", "sm_90"])


class MainTest(unittest.TestCase):
    """main() end to end on a made-up repository and canned logs (--no-compile)."""

    def make_repo(self, d, budgets):
        os.makedirs(os.path.join(d, "kernels", "cuda"))
        with open(os.path.join(d, "CMakeLists.txt"), "w") as fh:
            fh.write("set(CMAKE_CUDA_ARCHITECTURES 80)\n"
                     "file(GLOB CUDA_MODULE_SOURCES ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cu)\n")
        with open(os.path.join(d, "kernels", "cuda", "k.cu"), "w") as fh:
            fh.write("__global__ void __launch_bounds__(128) clean_kernel(float* p) {}\n"
                     "__global__ void __launch_bounds__(256, 1) spilling_kernel(float* p) {}\n"
                     "__global__ void smem_kernel(float* p) {}\n"
                     "void f() { smem_kernel<<<1, 128, 87040, s>>>(p); }\n")
        with open(os.path.join(d, "kernels", "cuda", "budgets.tsv"), "w") as fh:
            fh.write(budgets)
        out = os.path.join(d, "build-budgets")
        os.makedirs(out)
        with open(os.path.join(out, "k.sm_80.ptxas.txt"), "w") as fh:
            fh.write(PTXAS_LOG)
        with open(os.path.join(out, "k.sm_80.ptx"), "w") as fh:
            fh.write(PTX)
        return out

    def run_main(self, d, *extra):
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            rc = kb.main(["--root", d, "--no-compile", *extra])
        return rc, stdout.getvalue(), stderr.getvalue()

    @unittest.skipUnless(shutil.which("c++filt"), "c++filt (binutils) not installed")
    def test_violations_exit_1(self):
        with tempfile.TemporaryDirectory() as d:
            self.make_repo(d, "clean_kernel\t128\t0\t0.5\t64\n"
                              "spilling_kernel\t256\t0\t0.625\t48\n"
                              "smem_kernel\t128\t87040\t0.125\t232\n")
            rc, out, err = self.run_main(d)
            self.assertEqual(rc, 1, err)
            self.assertIn("SPILL spilling_kernel (kernels/cuda/k.cu, sm_80): 4 bytes spill stores, "
                          "8 bytes spill loads", err)
            self.assertIn("SPILL helper_fn", err)
            self.assertIn("OCCUPANCY smem_kernel (kernels/cuda/k.cu, sm_80): 0.0625", err)
            self.assertIn("FAILED: 3 violation(s)", err)
            self.assertIn("| `smem_kernel` | sm_80 | k.cu | 1 | 230 | 232 | 0 | 1056 | 87040 | 128 | 1 | 6.25% "
                          "| 12.5% | shared memory |", out)
            self.assertIn("| `spilling_kernel` | sm_80 | k.cu | 1 | 48 | 48 | 12 |", out)
            full = kb.read_text(os.path.join(d, "build-budgets", "kernel_budgets_full.md"))
            self.assertIn("| `clean_kernel` | k.cu | sm_80 | 64 | 64 | 0/0 | 0 | 0 | 0 | 128 | 8 | 50% | 50% "
                          "| registers |", full)

    @unittest.skipUnless(shutil.which("c++filt"), "c++filt (binutils) not installed")
    def test_within_budget_exit_0(self):
        with tempfile.TemporaryDirectory() as d:
            out = self.make_repo(d, "clean_kernel\t128\t0\t0.5\t64\n"
                                    "spilling_kernel\t256\t0\t0.625\t48\n"
                                    "smem_kernel\t128\t87040\t0.0625\t232\n")
            for name in ("k.sm_80.ptxas.txt",):  # the spills fixed
                path = os.path.join(out, name)
                text = kb.read_text(path)
                text = text.replace("4 bytes spill stores, 8 bytes spill loads",
                                    "0 bytes spill stores, 0 bytes spill loads")
                text = text.replace("8 bytes spill stores, 12 bytes spill loads",
                                    "0 bytes spill stores, 0 bytes spill loads")
                write(path, text)
            rc, stdout, err = self.run_main(d, "--suggest")
            self.assertEqual(rc, 0, err)
            self.assertIn("every kernel within budget", stdout)
            self.assertIn("smem_kernel\t128\t87040\t0.0625\t232", stdout)
            self.assertIn("spilling_kernel\t256\t0\t0.625\t48", stdout)

    def test_bad_budget_file_exit_2(self):
        with tempfile.TemporaryDirectory() as d:
            self.make_repo(d, "clean_kernel\t128\t0\n")
            rc, _, err = self.run_main(d)
            self.assertEqual(rc, 2)
            self.assertIn("3 columns", err)

    def test_no_nvcc_skips_77(self):
        with tempfile.TemporaryDirectory() as d:
            self.make_repo(d, "clean_kernel\t128\t0\t0.5\t64\n")
            stdout = io.StringIO()
            with contextlib.redirect_stdout(stdout):
                rc = kb.main(["--root", d, "--nvcc", os.path.join(d, "no-nvcc")])
            self.assertEqual(rc, 77)
            self.assertIn("skipped", stdout.getvalue())
        env = dict(os.environ, NVCC=os.path.join(ROOT, "no-such-nvcc"))
        res = subprocess.run(["bash", os.path.join(ROOT, "scripts", "kernel_budgets.sh")], env=env,
                             capture_output=True, text=True)
        self.assertEqual(res.returncode, 77, res.stdout + res.stderr)
        self.assertIn("skipped: nvcc not found", res.stdout)


SPILL_CU = textwrap.dedent("""\
    namespace trainer::cuda {
    namespace {
    constexpr int kThreads = 128;
    // __launch_bounds__(1024, 2): at most 32 registers; 64 live floats spill.
    __global__ void __launch_bounds__(1024, 2) spill_kernel(float* out, const float* in, int n) {
      float acc[64];
    #pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = in[(threadIdx.x * 64 + i * 7) % n];
      float s = 0.f;
    #pragma unroll
      for (int r = 0; r < 8; ++r)
    #pragma unroll
        for (int i = 0; i < 64; ++i) s += acc[i] * acc[(i * 5 + r) % 64];
      out[threadIdx.x] = s;
    }
    template <typename T> __global__ void plain_kernel(T* p) { p[threadIdx.x] += T(1); }
    }  // namespace
    void launch(float* p, const float* q, int n) {
      spill_kernel<<<1, 1024>>>(p, q, n);
      plain_kernel<float><<<1, kThreads>>>(p);
    }
    }  // namespace trainer::cuda
    """)


@unittest.skipUnless(kb.find_nvcc(None) and shutil.which("c++filt"), "needs nvcc and c++filt")
class RealCompileTest(unittest.TestCase):
    """nvcc -Xptxas -v on a small made-up module: a kernel that spills is reported for
    both architectures, a clean one passes (a few seconds)."""

    def test_spilling_kernel_fails(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "kernels", "cuda"))
            write(os.path.join(d, "CMakeLists.txt"),
                  "set(CMAKE_CUDA_ARCHITECTURES 80 90)\n"
                  "file(GLOB CUDA_MODULE_SOURCES ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cu)\n")
            write(os.path.join(d, "kernels", "cuda", "k.cu"), SPILL_CU)
            write(os.path.join(d, "kernels", "cuda", "budgets.tsv"),
                  "spill_kernel\t1024\t0\t0.5\t32\nplain_kernel<float>\t128\t0\t1\t16\n")
            stdout, stderr = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                rc = kb.main(["--root", d, os.path.join(d, "out")])
            err = stderr.getvalue()
            self.assertEqual(rc, 1, err)
            for arch in ("sm_80", "sm_90"):
                self.assertRegex(err, r"SPILL spill_kernel \(kernels/cuda/k.cu, %s\): [1-9]\d* bytes spill "
                                      r"stores, [1-9]\d* bytes spill loads" % arch)
            self.assertNotIn("plain_kernel", err)
            self.assertIn("FAILED: 2 violation(s)", err)
            self.assertIn("| `plain_kernel<float>` | sm_80 | k.cu | 1 |", stdout.getvalue())


if __name__ == "__main__":
    unittest.main()
