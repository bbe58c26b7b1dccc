// TensorBoard event files (observe/tensorboard.h, log.tensorboard): read
// back with a reader written here from the format's description (TFRecord
// framing with masked CRC32C, Event and Summary protobufs), independent of
// the writer's code: its own bitwise CRC32C and a generic protobuf decoder.
// The scalars must equal metrics.jsonl's, as floats.
#include <catch2/catch.hpp>

#include "tests/build_paths.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "e2e_util.h"
#include "observe/tensorboard.h"

using namespace trainer;
namespace fs = std::filesystem;

namespace {

// CRC32C, bit by bit: reflected Castagnoli polynomial 0x82F63B78, initial
// and final XOR 0xFFFFFFFF.
uint32_t crc32c_slow(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked(const unsigned char* p, size_t n) {
  const uint32_t c = crc32c_slow(p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

template <class T>
T le(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// One protobuf field as read from the wire.
struct Field {
  int number = 0, type = 0;
  uint64_t varint = 0;     // type 0
  uint64_t fixed = 0;      // types 1 (8 bytes) and 5 (4 bytes)
  std::string bytes;       // type 2
};

uint64_t read_varint(const std::string& s, size_t& at) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    REQUIRE(at < s.size());
    const uint8_t b = uint8_t(s[at++]);
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  FAIL("varint longer than 10 bytes");
  return 0;
}

std::vector<Field> decode(const std::string& msg) {
  std::vector<Field> out;
  size_t at = 0;
  while (at < msg.size()) {
    Field f;
    const uint64_t key = read_varint(msg, at);
    f.number = int(key >> 3);
    f.type = int(key & 7);
    switch (f.type) {
      case 0: f.varint = read_varint(msg, at); break;
      case 1:
        REQUIRE(at + 8 <= msg.size());
        f.fixed = le<uint64_t>(reinterpret_cast<const unsigned char*>(msg.data()) + at);
        at += 8;
        break;
      case 2: {
        const uint64_t n = read_varint(msg, at);
        REQUIRE(at + n <= msg.size());
        f.bytes = msg.substr(at, n);
        at += n;
        break;
      }
      case 5:
        REQUIRE(at + 4 <= msg.size());
        f.fixed = le<uint32_t>(reinterpret_cast<const unsigned char*>(msg.data()) + at);
        at += 4;
        break;
      default: FAIL("wire type " << f.type << " in an event file");
    }
    out.push_back(std::move(f));
  }
  return out;
}

struct Event {
  double wall_time = 0;
  int64_t step = -1;
  std::string file_version;
  std::map<std::string, float> scalars;
};

// Reads every record of an event file, checking both CRCs of each.
std::vector<Event> read_events(const std::string& path, int* crc_checks) {
  std::ifstream in(path, std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  std::vector<Event> out;
  size_t at = 0;
  while (at < data.size()) {
    REQUIRE(at + 12 <= data.size());
    const uint64_t len = le<uint64_t>(p + at);
    CHECK(le<uint32_t>(p + at + 8) == masked(p + at, 8));
    REQUIRE(at + 12 + len + 4 <= data.size());
    CHECK(le<uint32_t>(p + at + 12 + len) == masked(p + at + 12, len));
    *crc_checks += 2;
    const std::string msg = data.substr(at + 12, len);
    at += 12 + len + 4;
    Event ev;
    for (const Field& f : decode(msg)) {
      if (f.number == 1 && f.type == 1) std::memcpy(&ev.wall_time, &f.fixed, 8);
      else if (f.number == 2 && f.type == 0) ev.step = int64_t(f.varint);
      else if (f.number == 3 && f.type == 2) ev.file_version = f.bytes;
      else if (f.number == 5 && f.type == 2) {
        for (const Field& v : decode(f.bytes)) {
          REQUIRE((v.number == 1 && v.type == 2));  // Summary.value
          std::string tag;
          float value = NAN;
          bool has_value = false;
          for (const Field& x : decode(v.bytes)) {
            if (x.number == 1 && x.type == 2) tag = x.bytes;
            if (x.number == 2 && x.type == 5) {
              const uint32_t bits = uint32_t(x.fixed);
              std::memcpy(&value, &bits, 4);
              has_value = true;
            }
          }
          CHECK(has_value);
          ev.scalars[tag] = value;
        }
      } else {
        FAIL("unexpected Event field " << f.number << " of wire type " << f.type);
      }
    }
    out.push_back(ev);
  }
  return out;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("tensorboard: records framed with masked CRC32C, events decoded", "[tensorboard]") {
  const fs::path dir = fs::temp_directory_path() / ("trainer_tb_unit_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  // The framing of a known record, against the CRC written here.
  const std::string framed = tfrecord_frame("abc");
  REQUIRE(framed.size() == 8 + 4 + 3 + 4);
  const auto* fp = reinterpret_cast<const unsigned char*>(framed.data());
  CHECK(le<uint64_t>(fp) == 3);
  CHECK(le<uint32_t>(fp + 8) == masked(fp, 8));
  CHECK(le<uint32_t>(fp + 15) == masked(fp + 12, 3));
  // CRC32C("123456789") = 0xE3069283, the standard check value.
  CHECK(crc32c_slow(reinterpret_cast<const unsigned char*>("123456789"), 9) == 0xE3069283u);
  std::string path;
  {
    TensorBoardWriter w(dir.string());
    path = w.path();
    w.scalars(1, {{"train/loss", 5.5}, {"train/lr", 1e-4}});
    w.scalars(300, {{"val/loss", 2.25}});
    w.scalars(int64_t(1) << 40, {{"big", -3.0}, {"nan", NAN}});
    TensorBoardWriter second(dir.string());  // same second: a new file, not the old one truncated
    CHECK(second.path() != path);
  }
  CHECK(fs::path(path).filename().string().rfind("events.out.tfevents.", 0) == 0);
  int crcs = 0;
  const auto ev = read_events(path, &crcs);
  REQUIRE(ev.size() == 4);
  CHECK(ev[0].file_version == "brain.Event:2");
  CHECK(ev[0].scalars.empty());
  CHECK(ev[1].step == 1);
  CHECK(ev[1].scalars.at("train/loss") == 5.5f);
  CHECK(ev[1].scalars.at("train/lr") == float(1e-4));
  CHECK(ev[2].step == 300);
  CHECK(ev[2].scalars.at("val/loss") == 2.25f);
  CHECK(ev[3].step == int64_t(1) << 40);
  CHECK(ev[3].scalars.at("big") == -3.0f);
  CHECK(std::isnan(ev[3].scalars.at("nan")));
  const double now = double(::time(nullptr));
  for (const Event& e : ev) CHECK(std::fabs(e.wall_time - now) < 600);
  std::printf("[tensorboard] %s: %zu events, %d CRCs checked\n", path.c_str(), ev.size(), crcs);
  fs::remove_all(dir);
}

TEST_CASE("tensorboard: a run's event file holds metrics.jsonl's scalars", "[tensorboard][binary]") {
  const fs::path dir = fs::temp_directory_path() / ("trainer_tb_run_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string tokens = e2e::write_byte_tokens(dir).string();
  // MoE (aux_loss) with dynamic loss scaling (loss_scale, exact in fp32),
  // logged every other step, evaluated twice.
  const std::string cfg = (dir / "cfg.yaml").string();
  std::ofstream(cfg) << "run: {name: tb, dir: " << (dir / "run").string() << "}\n"
                     << "model: {vocab_size: 256, d_model: 32, n_layers: 2, n_heads: 2, max_seq_len: 32,"
                     << " moe: {num_experts: 4, top_k: 2}}\n"
                     << "train: {steps: 8, seq_len: 32, micro_batch_size: 2, global_batch_size: 4, device: cpu,"
                     << " threads: 1, eval_interval: 4, eval_steps: 1, loss_scaling: dynamic}\n"
                     << "optim: {lr: 3.0e-3, warmup_steps: 2}\n"
                     << "data: {train: [" << tokens << "], valid: [" << tokens << "]}\n"
                     << "log: {interval: 2, progress: lines, tensorboard: true}\n";
  std::string out;
  REQUIRE(e2e::run(std::string(TRAINER_BIN) + " --config " + cfg, &out) == 0);
  const auto files = event_files(dir / "run/tensorboard");
  REQUIRE(files.size() == 1);
  int crcs = 0;
  const auto ev = read_events(files[0].string(), &crcs);

  // metrics.jsonl: step rows, val_loss rows and the windows' time rows, in order.
  std::vector<nlohmann::json> steps, evals, times;
  std::ifstream jl(dir / "run/metrics.jsonl");
  for (std::string line; std::getline(jl, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) evals.push_back(j);
    else if (j.contains("loss")) steps.push_back(j);
    else if (j.contains("time_ms")) times.push_back(j);
  }
  REQUIRE(steps.size() == 4);  // steps 2, 4, 6, 8
  REQUIRE(evals.size() == 2);  // steps 4, 8
  REQUIRE(times.size() == 4);  // each logged window's time per step
  REQUIRE(ev.size() == 1 + steps.size() + evals.size() + times.size());
  CHECK(ev[0].file_version == "brain.Event:2");
  size_t si = 0, vi = 0, ti = 0, compared = 0;
  for (size_t i = 1; i < ev.size(); ++i) {
    const Event& e = ev[i];
    if (e.scalars.count("time/forward_ms")) {
      // The time parts ("time/<part>_ms"), each group's exposed and busy
      // communication ("comm/<group>_exposed_ms", "_busy_ms"), to the 4
      // decimals of metrics.jsonl's milliseconds.
      REQUIRE(ti < times.size());
      const auto& j = times[ti++];
      CHECK(e.step == j["step"].get<int64_t>());
      for (const auto& [tag, value] : e.scalars) {
        INFO(tag);
        const std::string name = tag.substr(tag.find('/') + 1, tag.size() - tag.find('/') - 4);  // without "_ms"
        double want = 0;
        if (tag.rfind("time/", 0) == 0) {
          want = j["time_ms"].at(name).get<double>();
        } else if (name.size() > 8 && name.compare(name.size() - 8, 8, "_exposed") == 0) {
          want = j["time_ms"].at("comm_" + name.substr(0, name.size() - 8)).get<double>();
        } else {
          REQUIRE(name.size() > 5);
          REQUIRE(name.compare(name.size() - 5, 5, "_busy") == 0);
          want = j["comm_busy_ms"].at(name.substr(0, name.size() - 5)).get<double>();
        }
        CHECK(std::abs(double(value) - want) <= 6e-5 + 1e-6 * std::abs(want));
        ++compared;
      }
      continue;
    }
    if (e.scalars.count("val/loss")) {
      REQUIRE(vi < evals.size());
      CHECK(e.step == evals[vi]["step"].get<int64_t>());
      CHECK(e.scalars.at("val/loss") == float(evals[vi]["val_loss"].get<double>()));
      CHECK(e.scalars.size() == 1);
      ++vi, ++compared;
      continue;
    }
    REQUIRE(si < steps.size());
    const auto& j = steps[si++];
    INFO("step " << e.step);
    CHECK(e.step == j["step"].get<int64_t>());
    const std::map<std::string, std::string> tags = {{"train/loss", "loss"},           {"train/lr", "lr"},
                                                     {"train/grad_norm", "grad_norm"}, {"train/tokens_per_s", "tokens_per_s"},
                                                     {"train/aux_loss", "aux_loss"},   {"train/loss_scale", "loss_scale"},
                                                     {"train/tflops_per_device", "tflops_per_device"}};
    CHECK(e.scalars.size() == tags.size());
    for (const auto& [tag, key] : tags) {
      INFO(tag);
      REQUIRE(e.scalars.count(tag) == 1);
      REQUIRE(j.contains(key));
      CHECK(e.scalars.at(tag) == float(j[key].get<double>()));
      ++compared;
    }
  }
  CHECK(si == steps.size());
  CHECK(vi == evals.size());
  CHECK(ti == times.size());
  const Event* last = nullptr;
  for (const Event& e : ev)
    if (e.scalars.count("train/loss")) last = &e;
  REQUIRE(last);
  std::printf("[tensorboard] run: %zu events, %d CRCs checked, %zu scalars equal to metrics.jsonl's "
              "(step 8: loss %.4f, aux %.4f, loss scale %g)\n",
              ev.size(), crcs, compared, last->scalars.at("train/loss"), last->scalars.at("train/aux_loss"),
              last->scalars.at("train/loss_scale"));

  // Off by default: no directory at all.
  std::string out2;
  REQUIRE(e2e::run(std::string(TRAINER_BIN) + " --config " + cfg + " --set log.tensorboard=false --set run.dir=" +
                       (dir / "off").string(),
                   &out2) == 0);
  CHECK_FALSE(fs::exists(dir / "off/tensorboard"));
  fs::remove_all(dir);
}
