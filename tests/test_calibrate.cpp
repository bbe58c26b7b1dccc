// `trainer calibrate`'s pieces that need no cluster: the fits
// (planner/link_fit.h) recover the numbers synthetic times were made from
// and predict the sizes left out; the hardware section it writes reads
// back through `hardware.calibration` to the same planner numbers, with
// the configuration's own keys winning; bad calibration files are refused
// naming the key and the file; the links the hosts give; the model's
// linears add up to the model's matmul FLOPs. The measurement on a real
// (namespace) cluster is tests/calibrate_netns_test.sh.
#include <catch2/catch.hpp>

#include "tests/error_of.h"

#include <cmath>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "app/plan_command.h"
#include "calibrate/calibration_report.h"
#include "calibrate/link_groups.h"
#include "calibrate/matmul_timing.h"
#include "calibrate/model_linears.h"
#include "config/config.h"
#include "config/hardware_file.h"
#include "model/dims.h"
#include "model/flops.h"
#include "planner/collective_cost.h"
#include "planner/link_fit.h"
#include "tests/build_paths.h"
#include "tests/temp_dir.h"

using namespace trainer;

namespace {

const std::string kSource = TRAINER_SOURCE_DIR;

constexpr auto& error_of = trainer::test::config_error_of;

// A cluster the fits must find again: 2 ranks per node, a 10 Gbit/s
// network, 50 GB/s (data sheet) inside a node.
Hardware known_cluster() {
  Hardware h;
  h.name = "synthetic";
  h.nvlink_gb_s = 50;
  h.network_gbit_s = 10;
  h.gpus_per_node = 2;
  h.collective_latency_us = 20;
  h.nvlink_latency_us = 5;
  h.network_latency_us = 30;
  return h;
}

const CommKind kKinds[] = {CommKind::AllReduce, CommKind::AllGather, CommKind::ReduceScatter, CommKind::Send};

// Every collective of a link timed as the planner prices it on `h`, each
// time multiplied by (1 + noise x a uniform draw in [-1, 1]).
std::vector<CollectiveTimes> synthetic_link(const Hardware& h, bool across, int ranks, double noise, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<CollectiveTimes> out;
  for (CommKind k : kKinds) {
    CollectiveTimes t;
    t.kind = k;
    t.across_nodes = across;
    t.ranks = ranks;
    for (double n = 4096; n <= 64.0 * (1 << 20); n *= 4) {
      t.bytes.push_back(n);
      t.seconds.push_back(collective_seconds(k, ranks, n, across, 1, h) * (1 + noise * u(rng)));
    }
    out.push_back(t);
  }
  return out;
}

// A report of calibrate from synthetic links and matmul rates.
Calibration synthetic_calibration(std::mt19937& rng) {
  const Hardware h = known_cluster();
  Calibration c;
  c.when = "2025-01-01 00:00:00 UTC";
  c.config = "run.yaml";
  c.device = "cpu";
  c.storage = "fp32";
  c.memory_gib = 31.2;
  c.host_of_rank = {"n0", "n0", "n1", "n1"};
  c.gpus_per_node = 2;
  c.sizes = "4 KiB .. 64 MiB";
  for (bool across : {false, true})
    for (const CollectiveTimes& t : synthetic_link(h, across, 2, 0.0, rng)) {
      c.links.push_back(t);
      c.link_labels.push_back(across ? "across nodes" : "inside node n0");
    }
  c.rank_flop_per_s = {52e9, 48e9, 50e9, 51e9};
  return c;
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

}  // namespace

TEST_CASE("calibrate: the line fit recovers a and B, and predicts the held-out sizes", "[calibrate][fit]") {
  const double a = 150e-6, B = 12.5e6;
  std::vector<double> n, t;
  for (double s = 4096; s <= 64.0 * (1 << 20); s *= 4) {
    n.push_back(s);
    t.push_back(a + s / B);
  }
  LineFit f = fit_line(fitting_half(n), fitting_half(t));
  CHECK(std::abs(f.a - a) <= 1e-9 * a);
  CHECK(std::abs(f.B - B) <= 1e-9 * B);
  for (size_t i = 0; i < held_out_half(n).size(); ++i)
    CHECK(std::abs(relative_error(f.at(held_out_half(n)[i]), held_out_half(t)[i])) < 1e-9);

  // 3% noise: a and B within a few per cent, every held-out size within 8%.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-0.03, 0.03);
  std::vector<double> noisy;
  for (double x : t) noisy.push_back(x * (1 + u(rng)));
  f = fit_line(fitting_half(n), fitting_half(noisy));
  INFO("a " << f.a << " (true " << a << "), B " << f.B << " (true " << B << ")");
  CHECK(std::abs(f.B / B - 1) < 0.05);
  CHECK(std::abs(f.a / a - 1) < 0.1);
  double worst = 0;
  for (size_t i = 0; i < held_out_half(n).size(); ++i)
    worst = std::max(worst, std::abs(relative_error(f.at(held_out_half(n)[i]), held_out_half(noisy)[i])));
  CHECK(worst < 0.08);

  // Pure bandwidth, the smallest size 10% faster than the line: a free fit
  // would take a negative a; it is held at zero and B refitted (one point
  // of eight 10% off moves B by about 1.5%).
  std::vector<double> pure;
  for (size_t i = 0; i < n.size(); ++i) pure.push_back(n[i] / B * (i == 0 ? 0.9 : 1.0));
  f = fit_line(n, pure);
  CHECK(f.a == 0);
  CHECK(std::abs(f.B / B - 1) < 0.03);

  CHECK_THROWS_AS(fit_line({4096}, {1e-3}), std::invalid_argument);
  CHECK_THROWS_AS(fit_line({4096, 16384, 65536}, {1e-3, 1e-3, 1e-3}), std::invalid_argument);
  CHECK_THROWS_AS(fit_line({4096, 16384}, {1e-3, -1}), std::invalid_argument);
}

TEST_CASE("calibrate: the planner's fit finds the hardware numbers the times were made from", "[calibrate][fit]") {
  const Hardware h = known_cluster();
  std::mt19937 rng(11);
  for (double noise : {0.0, 0.03}) {
    std::vector<CollectiveTimes> all = synthetic_link(h, false, 4, noise, rng);  // inside: a group of 4
    for (const CollectiveTimes& t : synthetic_link(h, true, 2, noise, rng)) all.push_back(t);
    const PlannerLinks f = fit_planner_links(all);
    const Hardware got = with_links(Hardware{}, f);
    INFO("noise " << noise << ": nvlink " << got.nvlink_gb_s << " GB/s, network " << got.network_gbit_s
                  << " Gbit/s, latencies " << got.collective_latency_us << " / " << got.nvlink_latency_us << " / "
                  << got.network_latency_us << " us");
    REQUIRE(f.inside);
    REQUIRE(f.across);
    const double tol = noise == 0 ? 1e-6 : 0.05;
    CHECK(std::abs(got.nvlink_gb_s / h.nvlink_gb_s - 1) < tol);
    CHECK(std::abs(got.network_gbit_s / h.network_gbit_s - 1) < tol);
    if (noise == 0) {
      CHECK(std::abs(got.collective_latency_us - h.collective_latency_us) < 1e-3);
      CHECK(std::abs(got.nvlink_latency_us - h.nvlink_latency_us) < 1e-3);
      CHECK(std::abs(got.network_latency_us - h.network_latency_us) < 1e-3);
    }
    // The fitted numbers price every size, the held-out ones included, as measured.
    double worst = 0;
    for (const CollectiveTimes& t : all)
      for (size_t i = 0; i < t.bytes.size(); ++i)
        worst = std::max(worst, std::abs(relative_error(
                                    collective_seconds(t.kind, t.ranks, t.bytes[i], t.across_nodes, 1, got), t.seconds[i])));
    CHECK(worst < (noise == 0 ? 1e-6 : 0.1));
  }
}

TEST_CASE("calibrate: the hardware section reads back through hardware.calibration", "[calibrate][file]") {
  test::TempDir dir("calibrate", "roundtrip");
  std::mt19937 rng(3);
  const CalibrationReport r = make_calibration_report(synthetic_calibration(rng));
  // The section holds the slowest rank's rate as the CPU's peak and the
  // fitted links; the held-out sizes are priced as measured.
  CHECK(r.numbers.hardware.gpu == "calibrated-cpu");
  CHECK(r.numbers.hardware.bf16_tflops == Approx(0.048));
  CHECK(r.numbers.hardware.matmul_efficiency == 1);
  CHECK(r.numbers.hardware.gpus_per_node == 2);
  CHECK(r.numbers.hardware.network_gbit_s == Approx(10).epsilon(1e-3));
  CHECK(r.numbers.hardware.nvlink_gb_s == Approx(50).epsilon(1e-3));
  CHECK(r.worst_held_out < 0.01);
  const std::string file = dir / "hardware.yaml";
  write(file, r.yaml);

  const Config c = load_config_file(kSource + "/configs/tiny.yaml", {"hardware.calibration=" + file}, 1);
  const Hardware got = resolve_hardware(c);
  CHECK(got.name == r.hardware.name);
  CHECK(got.memory_gib == r.hardware.memory_gib);
  CHECK(got.bf16_tflops == r.hardware.bf16_tflops);
  CHECK(got.matmul_efficiency == r.hardware.matmul_efficiency);
  CHECK(got.nvlink_gb_s == r.hardware.nvlink_gb_s);
  CHECK(got.network_gbit_s == r.hardware.network_gbit_s);
  CHECK(got.gpus_per_node == r.hardware.gpus_per_node);
  CHECK(got.collective_latency_us == r.hardware.collective_latency_us);
  CHECK(got.nvlink_latency_us == r.hardware.nvlink_latency_us);
  CHECK(got.network_latency_us == r.hardware.network_latency_us);
  // Only the configuration's own keys count as given: the run's link report
  // turns on with hardware.calibration alone (train/session.cpp).
  CHECK(c.given.count("hardware.calibration") == 1);
  CHECK(c.given.count("hardware.network_gbit_s") == 0);

  // A key of the configuration (or --set) wins over the file's.
  const Config own = load_config_file(kSource + "/configs/tiny.yaml",
                                      {"hardware.calibration=" + file, "hardware.gpus_per_node=8"}, 1);
  CHECK(resolve_hardware(own).gpus_per_node == 8);
  CHECK(resolve_hardware(own).network_gbit_s == r.hardware.network_gbit_s);

  // `trainer plan` prices on the calibrated numbers.
  PlanOptions po;
  Config pc = load_plan_config(kSource + "/configs/tiny.yaml", {"hardware.calibration=" + file}, po);
  const std::string plan = describe_plan(pc, po);
  INFO(plan);
  CHECK(plan.find("of calibrated-cpu (2 per node)") != std::string::npos);
}

TEST_CASE("calibrate: a missing or malformed calibration file is refused naming the key and the file", "[calibrate][file]") {
  test::TempDir dir("calibrate", "bad");
  struct Case {
    const char* what;
    const char* text;  // nullptr: the file does not exist
    std::string also;  // a further fragment of the message
  };
  for (const Case& k : std::vector<Case>{
           {"missing", nullptr, "no such file (write it with `trainer calibrate"},
           {"not YAML", "hardware: {gpu: [\n", "invalid YAML"},
           {"empty", "# nothing\n", "holds no hardware section"},
           {"another section", "hardware: {gpu: x}\nmodel: {d_model: 64}\n", "holds 'model.d_model'"},
           {"a calibration inside", "hardware: {calibration: other.yaml}\n", "names another calibration file"},
           {"a value out of range", "hardware:\n  memory_gib: -1\n", ":2:"},
           {"a misspelt key", "hardware:\n  nvlink_gbs: 4\n", "did you mean 'hardware.nvlink_gb_s'"},
           {"a word for a number", "hardware:\n  network_gbit_s: fast\n", "expected a number"},
       }) {
    const std::string file = dir / (std::string(k.what) + ".yaml");
    if (k.text) write(file, k.text);
    const std::string e = error_of([&] { load_config_file(kSource + "/configs/tiny.yaml", {"hardware.calibration=" + file}, 1); });
    INFO(k.what << ": " << e);
    CHECK(e.rfind("hardware.calibration: ", 0) == 0);
    CHECK(e.find(file) != std::string::npos);
    CHECK(e.find(k.also) != std::string::npos);
  }
  const std::string e = error_of([&] { load_config_file(kSource + "/configs/tiny.yaml", {"hardware.calibration=" + dir.path.string()}, 1); });
  CHECK(e.find("is a directory") != std::string::npos);
  CHECK(error_of([&] { load_config_file(kSource + "/configs/tiny.yaml", {"hardware.calibration=/dev/zero"}, 1); })
            .find("not a regular file") != std::string::npos);
}

TEST_CASE("calibrate: the links the ranks' hosts give", "[calibrate]") {
  std::vector<std::string> notes;
  std::vector<LinkGroup> g = link_groups({"a", "a", "b", "b"}, &notes);
  REQUIRE(g.size() == 2);
  CHECK(!g[0].across_nodes);
  CHECK(g[0].members == std::vector<int>{0, 1});
  CHECK(g[1].across_nodes);
  CHECK(g[1].members == std::vector<int>{0, 2});
  CHECK(notes.empty());
  CHECK(ranks_on_first_node({"a", "a", "b", "b"}) == 2);

  g = link_groups({"a", "b", "c"}, &notes);
  REQUIRE(g.size() == 1);
  CHECK(g[0].members == std::vector<int>{0, 1, 2});
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].find("no link inside a node") != std::string::npos);

  notes.clear();
  g = link_groups({"a", "a", "a"}, &notes);
  REQUIRE(g.size() == 1);
  CHECK(!g[0].across_nodes);
  CHECK(notes.at(0).find("one node") != std::string::npos);

  notes.clear();
  CHECK(link_groups({"a"}, &notes).empty());
  CHECK(notes.at(0).find("a world of 1 rank") != std::string::npos);
}

TEST_CASE("calibrate: the model's linears are its matmul FLOPs, divided by tp", "[calibrate]") {
  for (const std::vector<std::string>& set : std::vector<std::vector<std::string>>{
           {"model.arch=llama"},
           {"model.arch=gpt2", "model.n_kv_heads=4"},
           {"model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.every=2"}}) {
    std::vector<std::string> o = {"model.vocab_size=256", "model.d_model=64", "model.n_layers=4", "model.n_heads=4",
                                  "train.seq_len=32", "model.max_seq_len=64", "train.micro_batch_size=2"};
    o.insert(o.end(), set.begin(), set.end());
    const Config c = load_config_file(kSource + "/configs/tiny.yaml", o, 1);
    const ModelDims g = make_dims(c, 2, 32);
    double model = head_matmul_flops(g), ours = 0;
    for (int64_t i = 0; i < g.L; ++i) model += layer_matmul_flops(g, i);
    for (const LinearShape& s : model_linears(c)) ours += s.count * s.flops();
    INFO(set.front() << ": linears " << ours << " FLOPs, model/flops.h " << model);
    CHECK(std::abs(ours - model) <= 1e-9 * model);

    // Under tp 2 each rank computes half (the vocabulary divides here).
    std::vector<std::string> o2 = o;
    o2.push_back("parallel.tp=2");
    const Config c2 = load_config_file(kSource + "/configs/tiny.yaml", o2, 2);
    double half = 0;
    for (const LinearShape& s : model_linears(c2)) half += s.count * s.flops();
    // The router is not cut by tp.
    const double router = set.size() == 3 ? 2.0 * 2 * 32 * 64 * 4 * 2 : 0;
    CHECK(std::abs(half - (model - router) / 2 - router) <= 1e-9 * model);
  }
}

TEST_CASE("calibrate: the matmul timer runs the model's shapes on the CPU", "[calibrate]") {
  const Config c = load_config_file(kSource + "/configs/tiny.yaml", {"train.micro_batch_size=2"}, 1);
  const std::vector<LinearShape> shapes = model_linears(c);
  MatmulTimingOptions o;
  o.warmup = 1;
  o.repetitions = 3;
  o.budget_s = 0.3;
  const std::vector<MatmulTiming> t = time_linears(shapes, Device::CPU, DType::F32, o);
  REQUIRE(t.size() == shapes.size());
  for (const MatmulTiming& m : t) {
    CHECK(m.forward_s > 0);
    CHECK(m.backward_input_s > 0);
    CHECK(m.backward_weight_s > 0);
  }
  const double rate = model_matmul_rate(t);
  std::printf("[calibrate] tiny.yaml's linears on this CPU: %.3g GFLOP/s\n", rate / 1e9);
  CHECK(rate > 1e6);
  CHECK(linear_buffer_bytes(shapes, DType::F32) > 0);
}
