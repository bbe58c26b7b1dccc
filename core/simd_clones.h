// Hot CPU loops compiled twice: for the build's baseline (x86-64-v2, SSE
// lanes of 4 floats) and for AVX2 (8 floats), the dynamic loader picking one
// per function once at start-up (GCC/Clang target_clones, an ifunc). AVX2
// without FMA: the same IEEE operations in the same order on wider lanes,
// so both give the same bits and a binary still runs on any x86-64-v2 CPU.
// A clone must hold its loop itself: an OpenMP region inside it is outlined
// before the clones are made and would keep the baseline code, so callers
// run the threads and hand each clone a range of rows.
#pragma once

// -DTRAINER_NO_SIMD_CLONES builds the baseline only (to compare the two).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__) && !defined(TRAINER_NO_SIMD_CLONES)
#define TRAINER_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TRAINER_SIMD_CLONES
#endif
