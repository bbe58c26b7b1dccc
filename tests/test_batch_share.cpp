// Each rank's share of a step's batch (data/batch_share.h) against a direct
// enumeration: over every (dp, cp) rank, each token of the one-process batch
// is held exactly once, at the place the layouts expect.
#include <catch2/catch.hpp>

#include <map>
#include <tuple>
#include <vector>

#include "data/batch_share.h"

using namespace trainer;

TEST_CASE("the dp x cp shares of a step cover the one-process batch once", "[batch_share]") {
  const int64_t M = 3, B = 2, T = 16;
  for (int dp : {1, 2, 4})
    for (int cp : {1, 2, 4}) {
      // The one-process step: M micro-batches of B dp sequences of T tokens,
      // token (s, t) of global sequence s holding the value s * T + t.
      const int64_t sequences = M * B * dp;
      std::map<std::pair<int64_t, int64_t>, int> held;  // (sequence, position) -> times held
      for (int d = 0; d < dp; ++d) {
        const std::vector<int64_t> seqs = rank_sequences(M, B, dp, d);
        REQUIRE(int64_t(seqs.size()) == M * B);
        for (int64_t mb = 0; mb < M; ++mb) {
          // Micro-batch mb of every rank is a slice of the same B dp sequences.
          for (int64_t b = 0; b < B; ++b) {
            const int64_t s = seqs[size_t(mb * B + b)];
            CHECK(s / (B * dp) == mb);
          }
          std::vector<int32_t> full(size_t(B * T));
          for (int64_t b = 0; b < B; ++b)
            for (int64_t t = 0; t < T; ++t) full[size_t(b * T + t)] = int32_t(seqs[size_t(mb * B + b)] * T + t);
          for (int c = 0; c < cp; ++c) {
            const std::vector<int32_t> pos = zigzag_positions(T, cp, c);
            std::vector<int32_t> local(size_t(B * T / cp));
            zigzag_tokens(full.data(), B, T, cp, c, local.data());
            for (int64_t b = 0; b < B; ++b)
              for (int64_t t = 0; t < T / cp; ++t) {
                const int32_t v = local[size_t(b * (T / cp) + t)];
                CHECK(v % T == pos[size_t(t)]);  // the token at its global position
                held[{v / T, v % T}] += 1;
              }
          }
        }
      }
      INFO("dp " << dp << " cp " << cp);
      CHECK(int64_t(held.size()) == sequences * T);
      int64_t twice = 0;
      for (const auto& [key, n] : held) twice += n != 1;
      CHECK(twice == 0);
    }
}

TEST_CASE("zigzag: rank r holds chunks r and 2cp-1-r, in that order", "[batch_share]") {
  for (int cp : {1, 2, 3, 4})
    for (int r = 0; r < cp; ++r) {
      const auto chunks = zigzag_chunks(cp, r);
      CHECK(chunks[0] == r);
      CHECK(chunks[1] == 2 * cp - 1 - r);
      const int64_t T = 4 * cp;  // chunks of 2
      const std::vector<int32_t> pos = zigzag_positions(T, cp, r);
      REQUIRE(pos.size() == 4);
      CHECK(pos[0] == 2 * r);
      CHECK(pos[1] == 2 * r + 1);
      CHECK(pos[2] == 2 * (2 * cp - 1 - r));
      CHECK(pos[3] == 2 * (2 * cp - 1 - r) + 1);
    }
  CHECK_THROWS_WITH(zigzag_positions(10, 4, 0), Catch::Contains("do not split into 2 x 4 chunks"));
}

TEST_CASE("rank_sequences: rank r's row b of micro-batch m is sequence m B dp + r B + b", "[batch_share]") {
  const std::vector<int64_t> s = rank_sequences(2, 3, 2, 1);
  CHECK(s == std::vector<int64_t>{3, 4, 5, 9, 10, 11});
  CHECK(rank_sequences(2, 2, 1, 0) == std::vector<int64_t>{0, 1, 2, 3});
}
