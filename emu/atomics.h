// CUDA's atomic functions on global memory. Blocks run on several host
// threads at once, so these are real atomic read-modify-writes
// (std::atomic_ref), relaxed as CUDA's are: they order nothing but the word
// they change. Each returns the old value.
#pragma once

#include <atomic>
#include <type_traits>

namespace trainer::emu {

namespace detail {

template <class T, class Op>
T atomic_update(T* address, Op op) {
  std::atomic_ref<T> ref(*address);
  T old = ref.load(std::memory_order_relaxed);
  while (!ref.compare_exchange_weak(old, op(old), std::memory_order_relaxed)) {
  }
  return old;
}

}  // namespace detail

// int, unsigned, unsigned long long, float, double (floating point as a
// compare-and-swap loop, as CUDA does for double on old GPUs).
template <class T>
T atomic_add(T* address, T value) {
  static_assert(std::is_arithmetic_v<T>, "atomic_add takes an integer or floating-point value");
  if constexpr (std::is_integral_v<T>) {
    return std::atomic_ref<T>(*address).fetch_add(value, std::memory_order_relaxed);
  } else {
    return detail::atomic_update(address, [value](T old) { return old + value; });
  }
}

template <class T>
T atomic_sub(T* address, T value) {
  static_assert(std::is_integral_v<T>, "atomic_sub takes an integer");
  return std::atomic_ref<T>(*address).fetch_sub(value, std::memory_order_relaxed);
}

template <class T>
T atomic_max(T* address, T value) {
  static_assert(std::is_integral_v<T>, "atomic_max takes an integer");
  return detail::atomic_update(address, [value](T old) { return old < value ? value : old; });
}

template <class T>
T atomic_min(T* address, T value) {
  static_assert(std::is_integral_v<T>, "atomic_min takes an integer");
  return detail::atomic_update(address, [value](T old) { return value < old ? value : old; });
}

template <class T>
T atomic_exch(T* address, T value) {
  static_assert(std::is_trivially_copyable_v<T>, "atomic_exch takes a plain value");
  return std::atomic_ref<T>(*address).exchange(value, std::memory_order_relaxed);
}

// atomicCAS: stores `value` if *address equals `compare`; the old value
// either way.
template <class T>
T atomic_cas(T* address, T compare, T value) {
  static_assert(std::is_integral_v<T>, "atomic_cas takes an integer (int, unsigned, unsigned long long)");
  std::atomic_ref<T>(*address).compare_exchange_strong(compare, value, std::memory_order_relaxed);
  return compare;
}

}  // namespace trainer::emu
