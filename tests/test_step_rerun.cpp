// A flagged step run again (train.rerun_flagged, issue 45 item 2), through
// the real binary: a NaN that fires once is a transient fault (the rank
// that computed it named, the run goes on with the re-run's result and ends
// bit for bit where a run without the NaN ends); a bad sequence planted in
// the data file spikes the loss the same way twice (reproducible: the
// step's sequences named by file and offset, the planted ones among them).
// On one process and on tp2 x dp2.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "e2e_util.h"
#include "train/step_policy.h"

namespace fs = std::filesystem;
using namespace trainer;

namespace {

const char* const kLlama =
    "{arch: llama, vocab_size: 256, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32}";

// The "rerun" records of a run's metrics.jsonl.
std::vector<nlohmann::json> reruns(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(fs::path(run_dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("rerun")) out.push_back(j);
  }
  return out;
}

// A token file whose text repeats with a period of 7 (the model learns it
// within a few steps), long enough that a few planted windows are rarely
// met by the sequences of other steps.
fs::path write_periodic_tokens(const fs::path& dir) {
  std::vector<uint16_t> toks(size_t(1) << 21);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = uint16_t('a' + i % 7);
  const fs::path p = dir / "periodic.bin";
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(toks.data()), std::streamsize(toks.size() * 2));
  return p;
}

// Random bytes over every named sequence's window (seq_len + 1 tokens).
void plant(const fs::path& file, const nlohmann::json& sequences) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t z = 12345;
  for (const auto& s : sequences) {
    const std::string where = s.get<std::string>();
    const int64_t offset = std::stoll(where.substr(where.rfind(':') + 1));
    for (int64_t t = 0; t < 33; ++t) {
      z = z * 6364136223846793005ull + 1442695040888963407ull;
      const uint16_t tok = uint16_t(z >> 56);
      f.seekp(std::streamoff((offset + t) * 2));
      f.write(reinterpret_cast<const char*>(&tok), 2);
    }
  }
}

const char* const kTrain =
    "steps: 30, seq_len: 32, micro_batch_size: 2, global_batch_size: 8, eval_interval: 0, rerun_flagged: true";
// A spike is judged against the last 20 healthy steps, at 6 robust standard deviations.
const char* const kTrainSpikes =
    "steps: 30, seq_len: 32, micro_batch_size: 2, global_batch_size: 8, eval_interval: 0, spike_window: 20, "
    "spike_zscore: 6, rerun_flagged: true";

}  // namespace

TEST_CASE("a flagged step re-run: a NaN that fires once is transient and named by rank, one process and tp2 x dp2",
          "[rerun][e2e]") {
  const e2e::Setup s = e2e::make_setup_config("rerun", "nan", kLlama, kTrain);
  struct Layout {
    const char* label;
    int world;
    const char* set;
    int rank;
  };
  for (const Layout& l : {Layout{"one process", 1, "", 0}, Layout{"tp2 x dp2", 4, "--set parallel.tp=2", 1}}) {
    const std::string label = l.label;
    const std::string dir_label = l.world == 1 ? "one" : "tp2dp2";
    const std::string clean = (s.dir / (dir_label + "_clean")).string(), hooked = (s.dir / (dir_label + "_nan")).string();
    std::string out;
    REQUIRE(e2e::run_by_hand(s.cfg, l.world, clean, &out, l.set) == 0);
    setenv("TRAINER_TEST_HOOKS", ("nan_grad=" + std::to_string(l.rank) + ":12").c_str(), 1);
    out.clear();
    const int rc = e2e::run_by_hand(s.cfg, l.world, hooked, &out, l.set);
    unsetenv("TRAINER_TEST_HOOKS");
    INFO(e2e::tail(out));
    REQUIRE(rc == 0);
    const auto recs = reruns(hooked);
    REQUIRE(recs.size() == 1);
    const auto& r = recs[0]["rerun"];
    const double w = e2e::weight_diff(fs::path(hooked) / "ckpt/step_00000020", fs::path(clean) / "ckpt/step_00000020");
    std::printf("[rerun] %s, NaN on rank %d at step 12: reproducible %s, ranks changed %s, loss %s -> %s; final weights "
                "against the run without the NaN: %.3g (required: 0)\n",
                l.label, l.rank, r["reproducible"].dump().c_str(), r["ranks_changed"].dump().c_str(),
                r["first"]["loss"].dump().c_str(), r["again"]["loss"].dump().c_str(), w);
    CHECK(recs[0]["step"] == 12);
    CHECK(r["reproducible"] == false);
    CHECK(r["ranks_changed"] == nlohmann::json::array({l.rank}));
    CHECK(out.find("step 12: flagged (") != std::string::npos);
    CHECK(out.find("a transient fault; the values of rank " + std::to_string(l.rank) + " on ") != std::string::npos);
    CHECK(out.find("update skipped") == std::string::npos);
    CHECK(w == 0);
  }
  // rerun_transient=stop: exit 4 naming the rank.
  setenv("TRAINER_TEST_HOOKS", "nan_grad=0:12", 1);
  std::string out;
  std::vector<int> codes;
  e2e::run_by_hand(s.cfg, 1, (s.dir / "stop").string(), &out, "--set train.rerun_transient=stop", &codes);
  unsetenv("TRAINER_TEST_HOOKS");
  INFO(e2e::tail(out));
  CHECK(codes == std::vector<int>{kStoppedByPolicyExitCode});
  CHECK(out.find("a transient fault; the values of rank 0") != std::string::npos);
  fs::remove_all(s.dir);
}

TEST_CASE("a flagged step re-run: a bad sequence planted in the data spikes it twice, its file and offset named",
          "[rerun][e2e]") {
  const fs::path dir = fs::temp_directory_path() / ("trainer_rerun_data_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path data = write_periodic_tokens(dir);
  const e2e::Setup s = e2e::make_setup_config("rerun", "plant", kLlama, kTrainSpikes,
                                              "train: [" + data.string() + "], valid: [" + data.string() + "]");
  // Which sequences step 25 reads: the skip hook flags it without a fault,
  // and the re-run, the same bit for bit, names them.
  setenv("TRAINER_TEST_HOOKS", "skip=*:25", 1);
  std::string out;
  const std::string probe = (s.dir / "probe").string();
  // A learning rate at which the model has learnt the period by step 25 (loss ~0.01).
  const std::string lr = "--set optim.lr=2e-2 ";
  const int rc = e2e::run_by_hand(s.cfg, 1, probe, &out, lr);
  unsetenv("TRAINER_TEST_HOOKS");
  INFO(e2e::tail(out));
  REQUIRE(rc == 0);
  const auto probed = reruns(probe);
  REQUIRE(probed.size() == 1);
  REQUIRE(probed[0]["rerun"]["reproducible"] == true);
  const nlohmann::json planted = probed[0]["rerun"]["sequences"];
  REQUIRE(planted.size() == 8);
  plant(data, planted);
  for (const auto& [label, world, set] : {std::tuple<std::string, int, std::string>{"one process", 1, ""},
                                          {"tp2 x dp2", 4, "--set parallel.tp=2"}}) {
    const std::string run_dir = (s.dir / (world == 1 ? "one" : "tp2dp2")).string();
    out.clear();
    REQUIRE(e2e::run_by_hand(s.cfg, world, run_dir, &out, lr + set) == 0);
    const auto recs = reruns(run_dir);
    INFO(e2e::tail(out));
    nlohmann::json at25;
    for (const auto& r : recs)
      if (r["step"] == 25) at25 = r["rerun"];
    std::printf("[rerun] %s, random bytes planted in step 25's 8 sequences: %zu flagged steps re-run; step 25: %s, "
                "reproducible %s, named %s\n",
                label.c_str(), recs.size(), at25.is_null() ? "not flagged" : at25["flag"].dump().c_str(),
                at25.is_null() ? "-" : at25["reproducible"].dump().c_str(),
                at25.is_null() ? "-" : at25["sequences"].dump().c_str());
    REQUIRE(!at25.is_null());
    CHECK(at25["reproducible"] == true);
    CHECK(at25["sequences"] == planted);
    CHECK(at25["flag"].get<std::string>().find("loss spike") != std::string::npos);
    CHECK(out.find("step 25: flagged (") != std::string::npos);
    CHECK(out.find("the cause is the data or the numerics") != std::string::npos);
  }
  fs::remove_all(s.dir);
  fs::remove_all(dir);
}
