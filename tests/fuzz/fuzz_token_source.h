// What the sampler and the start-up scan ask of any token source, bounded
// so that a large but valid stream costs little per input: the targets of
// the token file formats call it on whatever the reader opened.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "data/token_file.h"

namespace fuzz {

inline void use_token_source(const trainer::TokenSource& s) {
  const int64_t n = s.size();
  if (n < 0) std::abort();
  s.format();
  s.stamps();
  if (n == 0) return;
  const int64_t k = std::min<int64_t>(n, 4096);
  s.min_max(0, k);
  s.min_max(n - k, k);
  std::vector<int64_t> buf(static_cast<size_t>(k));
  s.read(0, k, buf.data());
  s.read(n - k, k, buf.data());
  for (int64_t i : {int64_t(0), n / 2, n - 1}) {
    s.at(i);
    s.byte_offset(i);
  }
}

}  // namespace fuzz
