// What every table of the CUDA module starts with, and how its signature is
// computed. The module exports one table per layer that calls into it: the
// device runtime (core/cuda_backend.h), the ops (kernels/cuda_ops_table.h),
// NCCL (comm/nccl_table.h). Each is a struct derived from CudaTable that an
// exported C function of the module returns; each layer declares its own
// table and fetches it through core/cuda_module.h, which checks the header
// below without knowing the rest of the table.
//
// Both sides are built from the same headers by the same build, so a table
// may carry C++ types (std::string, Tensor, unique_ptr) and exceptions cross
// it. What the loader cannot take on trust is that the module on disk came
// from the same sources: a table whose ABI number, signature (a hash of the
// text of its entries) or size differs from the trainer's is refused, with
// the table named, instead of called with the wrong arguments.
#pragma once

#include <cstddef>
#include <cstdint>

namespace trainer {

// The first bytes of every table, in the same place in every version of the
// module (a module from before the split into tables returned these three
// fields first too), so that any mismatch is caught here.
struct CudaTable {
  int abi_version = 0;     // bumped by hand when an entry changes meaning
  uint64_t signature = 0;  // cuda_table_hash of the entries' text
  size_t table_bytes = 0;  // sizeof the table in the module
};

// The type of every exported table function: extern "C" const CudaTable* NAME().
using CudaTableEntry = const CudaTable* (*)();

// What a layer expects of its table.
struct CudaTableSpec {
  const char* entry;  // the module's exported function, e.g. "trainer_cuda_ops"
  const char* name;   // for messages: "ops"
  int abi_version;
  uint64_t signature;
  size_t table_bytes;
};

// FNV-1a, 64 bits: small enough for constexpr, and any edit of an entry's
// text changes it.
constexpr uint64_t cuda_table_hash(const char* s) {
  uint64_t h = 14695981039346656037ull;
  for (; *s; ++s) h = (h ^ uint64_t(static_cast<unsigned char>(*s))) * 1099511628211ull;
  return h;
}

}  // namespace trainer

// One entry of a table's X-macro list, as text for its signature.
#define TRAINER_CUDA_TABLE_TEXT(ret, name, params) #ret " " #name #params ";"
// One entry as a function pointer member.
#define TRAINER_CUDA_TABLE_POINTER(ret, name, params) ret(*name) params = nullptr;
