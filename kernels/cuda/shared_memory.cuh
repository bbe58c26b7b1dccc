// Shared-memory declarations of the kernels, through macros because a host
// compiler has no __shared__: on the emulated device (TRAINER_CUDA_EMU) a
// block's shared variables are storage the emulator keeps per running block,
// so each declaration there becomes a reference into it.
//
//   TRAINER_SHARED(float, s, [kRowLanes][kColTile + 1]);  // __shared__ float s[kRowLanes][kColTile + 1];
//   TRAINER_SHARED(int, total);                           // __shared__ int total;
//   TRAINER_DYNAMIC_SHARED(unsigned char, smem_raw, 16);  // extern __shared__ __align__(16) unsigned char smem_raw[];
//   TRAINER_DYNAMIC_SHARED(float, buf);                   // extern __shared__ float buf[];
//
// One variable a declaration. Under nvcc each expands to exactly the
// declaration it replaced: the PTX must not change (scripts/ptx_compare.sh).
#pragma once

#ifndef TRAINER_CUDA_EMU

// dims: the array's bounds as written after the name, none for a scalar.
#define TRAINER_SHARED(type, name, ...) __shared__ type name __VA_ARGS__
// The alignment is optional, as the __align__ it stands for.
#define TRAINER_DYNAMIC_SHARED(type, name, ...) \
  extern __shared__ __VA_OPT__(__align__(__VA_ARGS__)) type name[]

#else  // TRAINER_CUDA_EMU

// The running block's storage, from the SIMT executor: block_shared(key,
// bytes, align) is one declaration's instance in this block (fresh blocks
// get fresh storage, filled with a poison byte rather than zeros, as a GPU
// gives garbage), dynamic_shared() the launch's dynamic bytes.
#include "emu/simt.h"

// A function-local static's address is the key: one per declaration and per
// template instance, as nvcc gives each its own __shared__ variable.
#define TRAINER_SHARED(type, name, ...)                                                       \
  using name##_shared_type = type __VA_ARGS__;                                                \
  static const char name##_shared_key = 0;                                                    \
  name##_shared_type& name = *static_cast<name##_shared_type*>(::trainer::emu::block_shared( \
      &name##_shared_key, sizeof(name##_shared_type), alignof(name##_shared_type)))
#define TRAINER_DYNAMIC_SHARED(type, name, ...) \
  type* const name = static_cast<type*>(::trainer::emu::dynamic_shared())

#endif
