#include "data/batch_share.h"

#include <stdexcept>
#include <string>

namespace trainer {

std::vector<int64_t> rank_sequences(int64_t micro_steps, int64_t micro_batch, int dp, int dp_rank) {
  std::vector<int64_t> out;
  out.reserve(size_t(micro_steps * micro_batch));
  for (int64_t mb = 0; mb < micro_steps; ++mb)
    for (int64_t b = 0; b < micro_batch; ++b) out.push_back(mb * micro_batch * dp + dp_rank * micro_batch + b);
  return out;
}

std::array<int64_t, 2> zigzag_chunks(int cp, int rank) { return {int64_t(rank), int64_t(2 * cp - 1 - rank)}; }

std::vector<int32_t> zigzag_positions(int64_t T, int cp, int rank) {
  if (cp < 1 || T % (2 * int64_t(cp)) != 0 || rank < 0 || rank >= cp)
    throw std::invalid_argument("zigzag_positions: " + std::to_string(T) + " tokens do not split into 2 x " +
                                std::to_string(cp) + " chunks (rank " + std::to_string(rank) + ")");
  const int64_t c = T / (2 * cp);
  std::vector<int32_t> pos;
  pos.reserve(size_t(2 * c));
  for (const int64_t chunk : zigzag_chunks(cp, rank))
    for (int64_t t = 0; t < c; ++t) pos.push_back(int32_t(chunk * c + t));
  return pos;
}

void zigzag_tokens(const int32_t* full, int64_t B, int64_t T, int cp, int rank, int32_t* out) {
  const std::vector<int32_t> pos = zigzag_positions(T, cp, rank);
  const int64_t Tl = int64_t(pos.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tl; ++t) out[b * Tl + t] = full[b * T + pos[size_t(t)]];
}

}  // namespace trainer
