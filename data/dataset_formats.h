// One opener per on-disk layout; open_token_source (token_file.cpp) picks.
// Kept out of token_file.h because nothing but the factory and the tests
// should depend on which concrete class backs a source.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "data/token_file.h"

namespace trainer {

// nanoGPT .bin: little-endian tokens of token_bytes (2 or 4) each, no header.
std::unique_ptr<TokenSource> open_raw_tokens(const std::string& path, int token_bytes);

// llm.c shard: 256 int32 header {magic, version, count, ...} then the tokens.
constexpr int32_t kLlmcMagic = 20240520;         // GPT-2 shards, version 1, uint16
constexpr int32_t kLlmcMagicLlama3 = 20240801;   // Llama-3 shards, version 7, uint32
constexpr uint64_t kLlmcHeaderBytes = 1024;
std::unique_ptr<TokenSource> open_llmc_tokens(const std::string& path);

// Megatron-LM indexed dataset: PREFIX.idx (index) + PREFIX.bin (tokens).
// path may be the prefix, PREFIX.bin or PREFIX.idx.
std::unique_ptr<TokenSource> open_megatron_tokens(const std::string& path);

// Little-endian loads from possibly unaligned addresses: the Megatron index
// puts its int32/int64 arrays at odd offsets (after a 34-byte header).
template <class T>
T load_le(const unsigned char* p) {
  T v;
  __builtin_memcpy(&v, p, sizeof(T));
  return v;
}

// Min and max of n little-endian T at p: the inner loop of the start-up
// token scan. Branch-free and through load_le, so the compiler vectorises
// it whatever the alignment (about memory bandwidth on one core).
template <class T>
TokenRange min_max_le(const unsigned char* p, int64_t n) {
  T lo = std::numeric_limits<T>::max(), hi = std::numeric_limits<T>::lowest();
  for (int64_t i = 0; i < n; ++i) {
    const T v = load_le<T>(p + size_t(i) * sizeof(T));
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  TokenRange r;
  if (n > 0) r = TokenRange{int64_t(lo), int64_t(hi)};
  return r;
}

}  // namespace trainer
