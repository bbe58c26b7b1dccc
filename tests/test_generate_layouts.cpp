// `trainer generate` from checkpoints of parallel layouts: a gpt2 (tied
// embeddings) trained at tp2 x pp2 and a MoE at dp2 x ep2 reach the
// one-process weights (within 1e-4, e2e::expect_same_run); generating
// from their checkpoints, whose pieces are assembled whole, gives the
// one-process checkpoint's tokens, and the cached tokens equal the no-cache
// path's (--compare). Sampled at temperature 1 with one seed rather than
// greedily: a barely trained model's greedy text is one token repeated,
// while each sampled token depends on the whole distribution. The models have no tokenizer and more than
// 256 ids, so the prompt and the output are token ids.
#include <catch2/catch.hpp>

#include "tests/build_paths.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "e2e_util.h"

using namespace trainer;

namespace {

struct Generated {
  int rc = -1;
  std::string text, log;
};

Generated generate(const std::string& ckpt) {
  Generated g;
  const std::string base = std::string(TRAINER_BIN) + " generate --checkpoint " + ckpt +
                           " --prompt '84 104 101 32 108' --tokens 20 --temperature 1 --seed 5 --compare";
  g.rc = e2e::run("(" + base + " 2> " + ckpt + ".stderr)", &g.text);
  e2e::run("cat " + ckpt + ".stderr", &g.log);
  return g;
}

void check_layout(const std::string& name, const std::string& model, const e2e::Case& layout) {
  const e2e::Setup s = e2e::make_setup("generate", name, model);
  e2e::run_cases(s, "generate", {layout}, {});
  std::string dir = layout.label;
  std::replace(dir.begin(), dir.end(), ' ', '_');
  const Generated one = generate(s.single() + "/ckpt/step_00000020");
  const Generated split = generate((s.dir / dir / "ckpt/step_00000020").string());
  INFO(one.log << split.log);
  REQUIRE(one.rc == 0);
  REQUIRE(split.rc == 0);
  std::printf("[generate] %s: one process: %s[generate] %s: %s:     %s", name.c_str(), one.text.c_str(), name.c_str(),
              layout.label, split.text.c_str());
  CHECK(split.text == one.text);
  CHECK(one.text.rfind("84 104 101 32 108 ", 0) == 0);
  // Not one token repeated: the comparison means something.
  CHECK(one.text.find(" 32 32 32 32 32 32 32 32") == std::string::npos);
  CHECK(one.log.find("tokens agree: 20 of 20") != std::string::npos);
  CHECK(split.log.find("tokens agree: 20 of 20") != std::string::npos);
  CHECK(split.log.find("tokenizer ids") != std::string::npos);
  // On the CPU it names the OpenBLAS kernels, as a training run does.
  if (one.log.find("device: cpu") != std::string::npos) CHECK(one.log.find("\nBLAS: core ") != std::string::npos);
}

}  // namespace

TEST_CASE("generate: a gpt2 checkpoint saved at tp2 x pp2 generates the one-process tokens", "[generate][e2e]") {
  check_layout("gpt2", "{arch: gpt2, vocab_size: 259, d_model: 32, n_layers: 2, n_heads: 4, tie_embeddings: true, "
                       "max_seq_len: 32}",
               {"gpt2 tp2 pp2", 4, "--set parallel.tp=2 --set parallel.pp=2"});
}

TEST_CASE("generate: a MoE checkpoint saved at dp2 x ep2 generates the one-process tokens", "[generate][e2e]") {
  check_layout("moe", "{arch: llama, vocab_size: 260, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, "
                      "max_seq_len: 32, moe: {num_experts: 4, top_k: 2, d_ff: 32}}",
               {"moe dp2 ep2", 2, "--set parallel.ep=2"});
}
