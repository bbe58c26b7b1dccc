// CUDA's atomic functions (atomicAdd, atomicCAS, ...) for kernels compiled by
// a host compiler, over emu/atomics.h. The value parameter is not deduced
// (std::type_identity_t), so `atomicAdd(&count[e], 1)` on an unsigned
// counter converts the literal as CUDA's overloads would.
#pragma once

#include <type_traits>

#include "emu/atomics.h"

template <class T>
T atomicAdd(T* address, std::type_identity_t<T> value) {
  return ::trainer::emu::atomic_add(address, value);
}
template <class T>
T atomicSub(T* address, std::type_identity_t<T> value) {
  return ::trainer::emu::atomic_sub(address, value);
}
template <class T>
T atomicMax(T* address, std::type_identity_t<T> value) {
  return ::trainer::emu::atomic_max(address, value);
}
template <class T>
T atomicMin(T* address, std::type_identity_t<T> value) {
  return ::trainer::emu::atomic_min(address, value);
}
template <class T>
T atomicExch(T* address, std::type_identity_t<T> value) {
  return ::trainer::emu::atomic_exch(address, value);
}
template <class T>
T atomicCAS(T* address, std::type_identity_t<T> compare, std::type_identity_t<T> value) {
  return ::trainer::emu::atomic_cas(address, compare, value);
}
