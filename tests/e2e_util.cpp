#include "e2e_util.h"

#include <catch2/catch.hpp>

#include "tests/build_paths.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

#include "checkpoint/checkpoint.h"

namespace fs = std::filesystem;

namespace trainer::e2e {

namespace {
bool can_bind(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}
}  // namespace

int free_port() {
  // Not a port the kernel hands out (Linux's ephemeral range starts at 32768):
  // there, between this check and the server's bind, any concurrent test's
  // outgoing connection or Gloo listener may take it, and under ctest -j that
  // happens. Chosen at random so parallel tests rarely try the same one; its
  // neighbours are free too, as the store listens at MASTER_PORT + 1 under
  // torchrun and run_by_hand exports port - 1.
  static std::mt19937 rng(std::random_device{}() ^ unsigned(::getpid()));
  for (int attempt = 0; attempt < 2000; ++attempt) {
    const int p = 20001 + int(rng() % 12000);
    if (can_bind(p - 1) && can_bind(p) && can_bind(p + 1)) return p;
  }
  FAIL("no three adjacent free ports in 20000..32001");
  return 0;
}

std::string tail(const std::string& out, size_t chars) {
  return out.size() <= chars ? out : "[...]" + out.substr(out.size() - chars);
}

int run(const std::string& cmd, std::string* out) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  const int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

fs::path write_byte_tokens(const fs::path& dir) {
  std::vector<uint16_t> toks;
  std::ifstream in("/usr/share/common-licenses/GPL-3", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (unsigned char c : text) toks.push_back(c);
  const fs::path tokens = dir / "tokens.bin";
  std::ofstream(tokens, std::ios::binary)
      .write(reinterpret_cast<const char*>(toks.data()), std::streamsize(toks.size() * 2));
  return tokens;
}

void write_megatron(const fs::path& prefix, const std::vector<uint16_t>& tokens, const std::vector<int64_t>& sizes) {
  std::ofstream(prefix.string() + ".bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 2));
  std::ofstream idx(prefix.string() + ".idx", std::ios::binary);
  auto put = [&](const void* p, size_t n) { idx.write(static_cast<const char*>(p), std::streamsize(n)); };
  put("MMIDIDX\0\0", 9);
  const uint64_t version = 1, seqs = sizes.size(), docs = sizes.size() + 1;
  const uint8_t code = 8;  // uint16
  put(&version, 8);
  put(&code, 1);
  put(&seqs, 8);
  put(&docs, 8);
  for (int64_t n : sizes) {
    const int32_t v = int32_t(n);
    put(&v, 4);
  }
  int64_t at = 0;
  for (int64_t n : sizes) {
    put(&at, 8);
    at += 2 * n;
  }
  for (int64_t d = 0; d <= int64_t(sizes.size()); ++d) put(&d, 8);
}

std::vector<double> metric(const fs::path& metrics, const std::string& key) {
  std::vector<double> out;
  std::ifstream in(metrics);
  std::string line;
  const std::string tag = "\"" + key + "\": ";
  while (std::getline(in, line)) {
    const auto k = line.find(tag);
    if (k != std::string::npos) out.push_back(std::stod(line.substr(k + tag.size())));
  }
  return out;
}

std::vector<double> losses(const fs::path& metrics) { return metric(metrics, "loss"); }

std::vector<double> joined_losses(const std::vector<std::string>& run_dirs) {
  std::vector<double> out;
  for (const std::string& d : run_dirs) {
    const auto part = losses(fs::path(d) / "metrics.jsonl");
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = a.size() == b.size() ? 0 : INFINITY;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::fabs(a[i] - b[i]) / std::fabs(b[i]));
  return worst;
}

std::map<std::string, std::vector<float>> model_tensors(const fs::path& dir) {
  const LoadedCheckpoint ck = load_checkpoint(dir.string());
  std::map<std::string, std::vector<float>> out;
  for (const ShardTensor& t : ck.tensors) {
    if (t.name.rfind("model/", 0) != 0) continue;
    const SliceSpec whole = SliceSpec::whole(t.slice.global_shape);
    std::vector<float>& v = out[t.name];
    if (v.empty()) v.resize(size_t(whole.numel()), std::nanf(""));
    copy_overlap(t, whole, v.data());
  }
  return out;
}

double weight_diff(const fs::path& a, const fs::path& b, std::string* where) {
  const auto ta = model_tensors(a), tb = model_tensors(b);
  REQUIRE(ta.size() == tb.size());
  double worst = 0;
  for (const auto& [name, x] : ta) {
    REQUIRE(tb.count(name) == 1);
    if (name.size() > 12 && name.compare(name.size() - 12, 12, "attn.wk.bias") == 0) continue;
    const std::vector<float>& y = tb.at(name);
    REQUIRE(x.size() == y.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double d = double(x[i]) - double(y[i]);
      num += std::isnan(d) ? INFINITY : d * d;
      den += double(y[i]) * double(y[i]);
    }
    const double rel = std::sqrt(num) / std::max(std::sqrt(den), 1e-12);
    if (rel > worst && where) *where = name;
    worst = std::max(worst, rel);
  }
  return worst;
}

int run_by_hand(const std::string& cfg, int world, const std::string& run_dir, std::string* out,
                const std::string& extra, std::vector<int>* codes) {
  const int port = free_port();  // the store takes MASTER_PORT + 1 under torchrun variables
  std::string cmd = "(pids=''; ";
  for (int r = 0; r < world; ++r)
    cmd += "RANK=" + std::to_string(r) + " WORLD_SIZE=" + std::to_string(world) + " LOCAL_RANK=" +
           std::to_string(r) + " LOCAL_WORLD_SIZE=" + std::to_string(world) +
           " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port - 1) + " " + TRAINER_BIN + " --config " + cfg +
           " --set run.dir=" + run_dir + " " + extra + " > " + run_dir + ".rank" + std::to_string(r) +
           ".log 2>&1 & pids=\"$pids $!\"; ";
  cmd += "fail=0; r=0; for p in $pids; do wait $p; c=$?; echo \"rank $r exit $c\"; [ $c = 0 ] || fail=1; "
         "r=$((r+1)); done; exit $fail)";
  const int rc = run(cmd, out);
  if (codes) {
    codes->assign(size_t(world), -1);
    for (int r = 0; r < world; ++r) {
      const std::string tag = "rank " + std::to_string(r) + " exit ";
      const auto k = out->find(tag);
      if (k != std::string::npos) (*codes)[size_t(r)] = std::stoi(out->substr(k + tag.size()));
    }
  }
  for (int r = 0; r < world; ++r) {
    std::ifstream in(run_dir + ".rank" + std::to_string(r) + ".log");
    out->append(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
  }
  return rc;
}

}  // namespace trainer::e2e

namespace trainer::e2e {

Setup make_setup_config(const std::string& prefix, const std::string& name, const std::string& model,
                        const std::string& train, const std::string& data) {
  Setup s;
  s.dir = fs::temp_directory_path() / ("trainer_" + prefix + "_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(s.dir);
  fs::create_directories(s.dir);
  const fs::path tokens = write_byte_tokens(s.dir);
  const std::string data_map =
      data.empty() ? "train: [" + tokens.string() + "], valid: [" + tokens.string() + "]" : data;
  s.cfg = (s.dir / "cfg.yaml").string();
  std::ofstream(s.cfg) << "run: {name: " << prefix << "}\n"
                       << "model: " << model << "\n"
                       << "train: {" << train << "}\n"
                       << "optim: {lr: 3.0e-3, warmup_steps: 3}\n"
                       << "data: {" << data_map << "}\n"
                       << "checkpoint: {interval: 20}\n"
                       << "log: {interval: 1, progress: lines}\n"
                       << "parallel: {timeout_s: 60}\n";
  return s;
}

Setup make_setup(const std::string& prefix, const std::string& name, const std::string& model,
                 const std::string& data) {
  const Setup s = make_setup_config(prefix, name, model,
                                    "steps: 20, seq_len: 32, micro_batch_size: 2, global_batch_size: 8, "
                                    "eval_interval: 10, eval_steps: 1",
                                    data);
  std::string out;
  const int rc = run(std::string(TRAINER_BIN) + " --config " + s.cfg + " --set run.dir=" + s.single(), &out);
  INFO(e2e::tail(out));
  REQUIRE(rc == 0);
  return s;
}

void expect_same_run(const Setup& s, const std::string& tag, const std::string& label, const std::string& run_dir) {
  expect_same_run(s.single(), tag, label, run_dir);
}

void expect_same_run(const std::string& reference, const std::string& tag, const std::string& label,
                     const std::string& run_dir) {
  const auto a = losses(fs::path(reference) / "metrics.jsonl"), b = losses(fs::path(run_dir) / "metrics.jsonl");
  REQUIRE(a.size() == 20);
  REQUIRE(b.size() == 20);
  const auto va = metric(fs::path(reference) / "metrics.jsonl", "val_loss"),
             vb = metric(fs::path(run_dir) / "metrics.jsonl", "val_loss");
  REQUIRE(va.size() == 2);
  REQUIRE(vb.size() == 2);
  const double worst = max_rel_diff(b, a), vworst = max_rel_diff(vb, va);
  // MoE runs log the load-balancing loss: the same objective on every layout.
  const auto xa = metric(fs::path(reference) / "metrics.jsonl", "aux_loss"),
             xb = metric(fs::path(run_dir) / "metrics.jsonl", "aux_loss");
  REQUIRE(xa.size() == xb.size());
  const double xworst = xa.empty() ? 0.0 : max_rel_diff(xb, xa);
  std::string where;
  const double w =
      weight_diff(fs::path(reference) / "ckpt/step_00000020", fs::path(run_dir) / "ckpt/step_00000020", &where);
  char aux_part[32] = "";
  if (!xa.empty()) std::snprintf(aux_part, sizeof aux_part, ", aux %.2e", xworst);
  std::printf("[%s] %-36s losses max rel diff %.2e, val %.2e%s (tol 1e-5), final weights rel L2 %.2e (tol 1e-4%s%s)\n",
              tag.c_str(), label.c_str(), worst, vworst, aux_part, w, where.empty() ? "" : ", worst ",
              where.c_str());
  // Only the summation order differs from one process.
  CHECK(worst < 1e-5);
  CHECK(vworst < 1e-5);
  CHECK(xworst < 1e-5);
  CHECK(w < 1e-4);
}

std::string reference_run(const Setup& s, const std::string& setting) {
  std::string name = "single_" + setting;
  std::replace(name.begin(), name.end(), '=', '_');
  const std::string dir = (s.dir / name).string();
  if (fs::exists(fs::path(dir) / "metrics.jsonl")) return dir;
  std::string out;
  const int rc = run(std::string(TRAINER_BIN) + " --config " + s.cfg + " --set run.dir=" + dir + " --set " + setting, &out);
  INFO(e2e::tail(out));
  REQUIRE(rc == 0);
  return dir;
}

void run_cases(const Setup& s, const std::string& tag, const std::vector<Case>& cases,
               const std::vector<std::string>& must_print) {
  for (const Case& c : cases) {
    std::string out, dir_name = c.label;
    std::replace(dir_name.begin(), dir_name.end(), ' ', '_');
    const std::string rd = (s.dir / dir_name).string();
    const int rc = run_by_hand(s.cfg, c.world, rd, &out, c.set);
    INFO(c.label << "\n" << e2e::tail(out));
    REQUIRE(rc == 0);
    for (const std::string& m : must_print) CHECK(out.find(m) != std::string::npos);
    // A case of one sequence per micro-batch is compared with one process
    // that also takes one: with two, the weight gradients sum the tokens in
    // another order, and AdamW turns those ulps into differences of a
    // fraction of its step on weights whose gradient is near zero.
    const std::string mb1 = "train.micro_batch_size=1";
    expect_same_run(std::string(c.set).find(mb1) == std::string::npos ? s.single() : reference_run(s, mb1), tag,
                    c.label, rd);
  }
}

void check_reshard_to_one(const Setup& s, const std::string& tag, const std::string& label, int world,
                          const std::string& layout) {
  const auto straight = losses(fs::path(s.single()) / "metrics.jsonl");
  REQUIRE(straight.size() == 20);
  const std::string a = (s.dir / "a").string(), b = (s.dir / "b").string();
  std::string out;
  REQUIRE(run_by_hand(s.cfg, world, a, &out, layout + " --stop-after 10") == 0);
  out.clear();
  REQUIRE(run(std::string(TRAINER_BIN) + " --config " + s.cfg + " --set run.dir=" + b + " --set checkpoint.resume=" +
                  a + "/ckpt/step_00000010",
              &out) == 0);
  INFO(e2e::tail(out));
  CHECK(out.find("resumed from " + a + "/ckpt/step_00000010 at step 10") != std::string::npos);
  const std::vector<double> joined = joined_losses({a, b});
  REQUIRE(joined.size() == 20);
  const double worst = max_rel_diff(joined, straight);
  const double w = weight_diff(fs::path(s.single()) / "ckpt/step_00000020", fs::path(b) / "ckpt/step_00000020");
  std::printf("[%s] reshard %s -> 1: losses max rel diff %.2e (tol 1e-5), final weights %.2e (tol 1e-4)\n",
              tag.c_str(), label.c_str(), worst, w);
  CHECK(worst < 1e-5);
  CHECK(w < 1e-4);
}

void expect_config_errors(const std::vector<ConfigMistake>& cases) {
  const std::string cfg = std::string(TRAINER_SOURCE_DIR) + "/configs/tiny.yaml";
  for (const ConfigMistake& c : cases) {
    std::string out;
    const int rc = run(std::string(TRAINER_BIN) + " schedule --config " + cfg + " " + c.args, &out);
    INFO(c.args << "\n" << out);
    CHECK(rc == 2);
    CHECK(out.find(c.want) != std::string::npos);
  }
}

void check_smoke(const std::string& log0, const std::vector<int>& codes) {
  REQUIRE(!codes.empty());
  REQUIRE(codes[0] >= 0);
  for (size_t r = 1; r < codes.size(); ++r) CHECK(codes[r] == codes[0]);  // one verdict for the job
  CHECK(log0.find("on " + std::to_string(codes.size()) + " ranks") != std::string::npos);
  for (const char* check : {"memory plan fits the device", "no NaN/Inf in loss or gradients", "loss falling",
                            "checkpoint save -> load round trip"})
    CHECK(log0.find(std::string("PASS  ") + check) != std::string::npos);
  CHECK(log0.find("tensors identical after save -> load") != std::string::npos);
}

}  // namespace trainer::e2e
