// Loading libtrainer_cuda.so (the CUDA backend) the first time a run needs
// CUDA, and never otherwise: a CPU run of the same binary maps none of the
// CUDA libraries. The module exports one table per layer (core/cuda_table.h);
// this loader opens the file and hands out a table by its entry's name,
// after checking its header, without knowing what the table holds.
//
// Where the module is looked for, first match wins:
//   1. $TRAINER_CUDA_MODULE, a path (tests, an installed module elsewhere);
//   2. a module the program already links (bench_kernels does);
//   3. libtrainer_cuda.so next to the running executable (/proc/self/exe),
//      where the build puts it beside `trainer`.
// It is opened RTLD_NOW | RTLD_LOCAL: every symbol it takes from the
// executable (Tensor methods, op checks, ...: the executables export theirs)
// resolves at load, so a broken module fails here, naming the symbol, rather
// than in the middle of a step.
#pragma once

#include <string>

#include "core/cuda_table.h"

namespace trainer {

inline constexpr const char* kCudaModuleFile = "libtrainer_cuda.so";
// The same module built for the emulated device (emu/cuda_module.cmake),
// chosen through $TRAINER_CUDA_MODULE.
inline constexpr const char* kCudaEmuModuleFile = "libtrainer_cuda_emu.so";

// Whether this build has a CUDA module at all (TRAINER_HAVE_CUDA).
bool cuda_module_built();
// The table `want` names, the module loaded on the first call of any
// (thread-safe; the file is opened once). nullptr when it cannot be had,
// with the reason in *why, phrased to follow "but ": "this build has no CUDA
// backend", "the CUDA module /p/libtrainer_cuda.so cannot be loaded
// (dlerror's text)", "... has no trainer_cuda_ops(): ...", "... was built
// from other sources (its ops table: ...)". Callers keep the answer: each
// layer fetches its table once (cuda_backend, cuda_ops_table, nccl_table).
const CudaTable* cuda_module_table(const CudaTableSpec& want, std::string* why);
// The same, typed and kept: fetched and checked on the first call of each
// table type, the answer (or the reason) returned from then on. The
// layers' fetch functions are this one line.
template <typename Table>
const Table* kept_cuda_module_table(const CudaTableSpec& want, std::string* why) {
  struct Fetched {
    const Table* table = nullptr;
    std::string why;
  };
  static const Fetched f = [&] {
    Fetched r;
    r.table = static_cast<const Table*>(cuda_module_table(want, &r.why));
    return r;
  }();
  if (!f.table && why) *why = f.why;
  return f.table;
}
// Whether the module has been loaded (by any table's fetch); loads nothing.
bool cuda_backend_loaded();
// The file the loader opened, or would open (rule 2 gives the linked file).
std::string cuda_module_path();
// Whether that file is the emulated device's module (by its name): it runs
// on the CPU, so no CUDA driver is asked before it is loaded.
bool cuda_module_emulated();

}  // namespace trainer
