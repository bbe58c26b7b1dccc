// Checkpoints that cannot go wrong quietly: the manifest's own checksum
// (random byte flips, deliberate edits, old unsealed manifests), rotation by
// rename, save failures (injected and a real ENOSPC through /dev/full) and
// the checkpoint.on_save_error policy, and the run-directory lock.
#include <unistd.h>

#include <catch2/catch.hpp>

#include "tests/build_paths.h"
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checksum.h"
#include "checkpoint/fault_injection.h"
#include "checkpoint/strict_json.h"
#include "e2e_util.h"
#include "train/checkpoint_saver.h"
#include "train/run_lock.h"

using namespace trainer;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("trainer_integrity_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

struct CaptureStderr {
  std::ostringstream buf;
  std::streambuf* old;
  CaptureStderr() : old(std::cerr.rdbuf(buf.rdbuf())) {}
  ~CaptureStderr() { std::cerr.rdbuf(old); }
  std::string text() const { return buf.str(); }
};

// A real checkpoint of the trainer binary: a 2-layer model after 4 steps,
// its manifest holding the real resolved config, layout and tensor list.
fs::path real_checkpoint(const fs::path& dir) {
  const fs::path tokens = e2e::write_byte_tokens(dir);
  const fs::path cfg = dir / "cfg.yaml";
  std::ofstream(cfg) << "run: {name: integrity, dir: " << (dir / "run").string() << "}\n"
                     << "model: {arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, max_seq_len: 32}\n"
                     << "train: {steps: 4, seq_len: 32, micro_batch_size: 4, global_batch_size: 8}\n"
                     << "data: {train: [" << tokens.string() << "]}\n"
                     << "log: {interval: 1, progress: lines}\n"
                     << "checkpoint: {interval: 4}\n";
  std::string out;
  const int rc = e2e::run(std::string(TRAINER_BIN) + " --config " + cfg.string(), &out);
  INFO(e2e::tail(out));
  REQUIRE(rc == 0);
  const fs::path ck = dir / "run/ckpt/step_00000004";
  REQUIRE(fs::exists(ck / "manifest.json"));
  return ck;
}

// Why a load failed, reduced to the check that caught it (for the tally).
std::string failure_class(const std::string& what) {
  for (const char* k : {"manifest checksum mismatch", "checksum trailer", "CRC32C mismatch", "not valid JSON", "size is"})
    if (what.find(k) != std::string::npos) return k;
  return "other: " + what.substr(0, 120);
}

// Flips one random byte (a random non-zero XOR) at a time, `n` times, each
// undone before the next; returns how many flips load_checkpoint refused,
// checking that each error names `file`, and prints the tally.
int flips_refused(const fs::path& ck, const std::string& file, int n, uint32_t seed) {
  const fs::path path = ck / file;
  const std::string pristine = read_bytes(path);
  std::mt19937 rng(seed);
  std::map<std::string, int> tally;
  int refused = 0;
  for (int i = 0; i < n; ++i) {
    std::string damaged = pristine;
    const size_t at = rng() % damaged.size();
    const unsigned char mask = static_cast<unsigned char>(1 + rng() % 255);
    damaged[at] = char(static_cast<unsigned char>(damaged[at]) ^ mask);
    write_bytes(path, damaged);
    try {
      load_checkpoint(ck.string());
      UNSCOPED_INFO(file << ": flip at byte " << at << " (xor " << int(mask) << ") was accepted");
    } catch (const std::exception& e) {
      ++refused;
      CHECK_THAT(std::string(e.what()), Contains(path.string()));
      ++tally[failure_class(e.what())];
    }
  }
  write_bytes(path, pristine);
  std::printf("[integrity] %s (%zu bytes): %d/%d random single-byte flips refused;", file.c_str(), pristine.size(),
              refused, n);
  for (const auto& [k, v] : tally) std::printf(" %s: %d;", k.c_str(), v);
  std::printf("\n");
  return refused;
}

// Rewrites manifest.json through the JSON library (a valid document, as a
// hand edit would leave it), applying `edit`; the checksum is left alone.
void edit_manifest(const fs::path& ck, const std::function<void(json::Value&)>& edit) {
  json::Value m = json::parse(read_bytes(ck / "manifest.json"));
  edit(m);
  write_bytes(ck / "manifest.json", json::dump(m, 2) + "\n");
}

// Recomputes the checksum after an edit (from the documented format): shows
// what the checksum alone refused, since the resealed edit then loads.
void reseal(const fs::path& ck) {
  std::string text = read_bytes(ck / "manifest.json");
  const std::string key = "\"manifest_crc32c\": \"";
  const size_t at = text.rfind(key);
  REQUIRE(at != std::string::npos);
  text.replace(at + key.size(), 8, crc32c_hex(crc32c(text.data(), at + key.size())));
  write_bytes(ck / "manifest.json", text);
}

Snapshot small_snapshot(int64_t step) {
  Snapshot s;
  s.meta.step = step;
  s.meta.tokens = step * 100;
  s.meta.optimizer_step = step;
  s.meta.layout = "tp1.pp1.dp1.cp1.ep1.zero0";
  s.meta.config_yaml = "x: 1\n";
  ShardTensor t;
  t.name = "model/w";
  t.slice = SliceSpec::whole({4, 4});
  t.data.assign(64, char(step));
  s.tensors.push_back(t);
  return s;
}

std::set<std::string> entries(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

}  // namespace

TEST_CASE("manifest checksum: 100 flips in manifest.json and 100 in a rank file of a real checkpoint, all refused",
          "[checkpoint][integrity][e2e]") {
  const fs::path dir = fresh_dir("flips");
  const fs::path ck = real_checkpoint(dir);
  REQUIRE_NOTHROW(load_checkpoint(ck.string()));
  const int manifest = flips_refused(ck, "manifest.json", 100, 14);
  const int shard = flips_refused(ck, "rank_00000.safetensors", 100, 41);
  std::printf("[integrity] %d/200 flips refused at load\n", manifest + shard);
  CHECK(manifest == 100);
  CHECK(shard == 100);
  REQUIRE_NOTHROW(load_checkpoint(ck.string()));  // every flip was undone
  fs::remove_all(dir);
}

TEST_CASE("manifest checksum: editing optimizer_step, tokens or swapping two tensor names is refused",
          "[checkpoint][integrity][e2e]") {
  const fs::path dir = fresh_dir("edits");
  const fs::path ck = real_checkpoint(dir);
  const std::string pristine = read_bytes(ck / "manifest.json");
  const LoadedCheckpoint good = load_checkpoint(ck.string());
  const std::string manifest = (ck / "manifest.json").string();

  struct Edit {
    std::string what;
    std::function<void(json::Value&)> edit;
    std::function<bool(const LoadedCheckpoint&)> changed;  // the resealed edit loads with another meaning
  };
  // Two tensors of one shape: a parameter's AdamW m and v.
  std::string m_name, v_name;
  const json::Value parsed = json::parse(pristine);
  for (const auto& t : parsed.at("tensors")) {
    const std::string n = t.at("name").get<std::string>();
    if (n.rfind("optim/m/", 0) == 0 && m_name.empty()) {
      m_name = n;
      v_name = "optim/v/" + n.substr(8);
    }
  }
  REQUIRE(!m_name.empty());
  const auto position = [](const LoadedCheckpoint& c, const std::string& n) {
    for (size_t i = 0; i < c.tensors.size(); ++i)
      if (c.tensors[i].name == n) return i;
    return c.tensors.size();
  };
  const std::vector<Edit> edits = {
      {"optimizer_step + 1", [](json::Value& m) { m["optimizer_step"] = m["optimizer_step"].get<int64_t>() + 1; },
       [&](const LoadedCheckpoint& c) { return c.meta.optimizer_step == good.meta.optimizer_step + 1; }},
      {"tokens = 12345", [](json::Value& m) { m["tokens"] = 12345; },
       [](const LoadedCheckpoint& c) { return c.meta.tokens == 12345; }},
      {"swap " + m_name + " and " + v_name,
       [&](json::Value& m) {
         for (auto& t : m["tensors"]) {
           const std::string n = t["name"].get<std::string>();
           if (n == m_name) t["name"] = v_name;
           else if (n == v_name) t["name"] = m_name;
         }
       },
       // The rank file holds both names, so the loaded list changes order only.
       [&](const LoadedCheckpoint& c) { return position(c, m_name) == position(good, v_name); }},
  };
  for (const Edit& e : edits) {
    INFO(e.what);
    write_bytes(manifest, pristine);
    edit_manifest(ck, e.edit);
    REQUIRE(read_bytes(manifest) != pristine);
    std::string error = "(loaded)";
    try {
      load_checkpoint(ck.string());
    } catch (const std::exception& ex) {
      error = ex.what();
    }
    std::printf("[integrity] edit %s: %s\n", e.what.c_str(), error.c_str());
    CHECK_THAT(error, Contains(manifest) && Contains("manifest checksum mismatch"));
    // Resealed, the same edit loads and changes the run: the checksum is
    // what refused it.
    reseal(ck);
    CHECK(e.changed(load_checkpoint(ck.string())));
  }
  write_bytes(manifest, pristine);

  // The same swap in the rank file's own header (names of equal length, so
  // every offset stays valid) would hand m's values to v: its CRC32C refuses it.
  const fs::path shard = ck / "rank_00000.safetensors";
  const std::string bytes = read_bytes(shard);
  std::string swapped = bytes;
  const size_t a = swapped.find("\"" + m_name + "\""), b = swapped.find("\"" + v_name + "\"");
  REQUIRE(a != std::string::npos);
  REQUIRE(b != std::string::npos);
  swapped.replace(a, m_name.size() + 2, "\"" + v_name + "\"");
  swapped.replace(b, v_name.size() + 2, "\"" + m_name + "\"");
  write_bytes(shard, swapped);
  std::string error = "(loaded)";
  try {
    load_checkpoint(ck.string());
  } catch (const std::exception& ex) {
    error = ex.what();
  }
  std::printf("[integrity] swap in the rank file's header: %s\n", error.c_str());
  CHECK_THAT(error, Contains(shard.string()) && Contains("CRC32C mismatch"));
  write_bytes(shard, bytes);
  CHECK_NOTHROW(load_checkpoint(ck.string()));
  fs::remove_all(dir);
}

TEST_CASE("manifest checksum: a manifest without its checksum is refused, version 2 (a downgrade) included",
          "[checkpoint][integrity]") {
  const fs::path dir = fresh_dir("old");
  CheckpointWriter(dir.string(), 0, false).save(small_snapshot(3));
  const fs::path ck = dir / "step_00000003";
  const std::string sealed = read_bytes(ck / "manifest.json");

  // Format version 2 (what builds before the checksum wrote) looks exactly
  // like a sealed manifest whose trailer was cut off and version edited down:
  // refused, naming the file and why (a build before this one accepted it
  // with a warning).
  edit_manifest(ck, [](json::Value& m) {
    m.erase("manifest_crc32c");
    m["format_version"] = 2;
  });
  try {
    load_checkpoint(ck.string());
    FAIL("a version 2 manifest without a checksum was loaded");
  } catch (const std::runtime_error& e) {
    std::printf("[integrity] version 2 manifest: %s\n", e.what());
    CHECK_THAT(std::string(e.what()), Contains((ck / "manifest.json").string()) &&
                                          Contains("without a checksum of its own") && Contains("start a new run"));
  }
  CHECK_THROWS_WITH(describe_checkpoint(ck.string()), Contains("without a checksum of its own"));
  CHECK_THROWS_WITH(resolve_resume(dir.string(), "auto"), Contains("none loadable") && Contains("format_version 2"));

  // Version 3 with its checksum member removed is damage, not an old file.
  edit_manifest(ck, [](json::Value& m) { m["format_version"] = 3; });
  CHECK_THROWS_WITH(load_checkpoint(ck.string()), Contains("manifest.json") && Contains("this one has none"));
  // A trailer cut short or followed by anything is damage too.
  write_bytes(ck / "manifest.json", sealed.substr(0, sealed.size() - 3));
  CHECK_THROWS_WITH(load_checkpoint(ck.string()), Contains("checksum trailer"));
  write_bytes(ck / "manifest.json", sealed + " ");
  CHECK_THROWS_WITH(load_checkpoint(ck.string()), Contains("checksum trailer"));
  // Every byte of the trailer region, flipped in turn (random flips seldom land there).
  int refused = 0;
  const size_t from = sealed.rfind("\"manifest_crc32c\"") - 2;
  for (size_t at = from; at < sealed.size(); ++at) {
    std::string damaged = sealed;
    damaged[at] = char(damaged[at] ^ 0x01);
    write_bytes(ck / "manifest.json", damaged);
    try {
      CaptureStderr err;
      load_checkpoint(ck.string());
    } catch (const std::exception& e) {
      ++refused;
    }
  }
  std::printf("[integrity] trailer: %d/%zu flips of its bytes refused\n", refused, sealed.size() - from);
  CHECK(refused == int(sealed.size() - from));
  write_bytes(ck / "manifest.json", sealed);
  CHECK_NOTHROW(load_checkpoint(ck.string()));
  fs::remove_all(dir);
}

TEST_CASE("rotation: old checkpoints are renamed before deletion, a kill in between leaves nothing loadable",
          "[checkpoint][integrity]") {
  const fs::path dir = fresh_dir("rotation");
  CheckpointWriter w(dir.string(), 2, false);
  w.save(small_snapshot(1));
  w.save(small_snapshot(2));
  // The save of step 3 prunes step 1; the hook stops it (as a kill would)
  // after the rename, before a file was deleted.
  checkpoint_fail_next_save_at("prune");
  {
    CaptureStderr err;
    w.save(small_snapshot(3));
    CHECK_THAT(err.text(), Contains("pruning stopped") && Contains("step_00000001.deleting"));
  }
  CHECK(entries(dir) == std::set<std::string>{"latest", "step_00000001.deleting", "step_00000002", "step_00000003"});
  // A kill during the deletion itself: some files gone, the manifest still there.
  fs::remove(dir / "step_00000001.deleting/rank_00000.safetensors");
  REQUIRE(fs::exists(dir / "step_00000001.deleting/manifest.json"));
  const std::vector<std::string> candidates = resume_candidates(dir.string(), "auto");
  CHECK(candidates == std::vector<std::string>{(dir / "step_00000003").string(), (dir / "step_00000002").string()});
  // Even with `latest` pointing at it (it never does: `latest` moved first).
  write_bytes(dir / "latest", "step_00000001\n");
  for (const std::string& c : resume_candidates(dir.string(), "auto")) CHECK(c.find(".deleting") == std::string::npos);
  write_bytes(dir / "latest", "step_00000003\n");
  CHECK(resolve_resume(dir.string(), "auto")->meta.step == 3);
  // The next save finishes the interrupted deletion and prunes as usual.
  w.save(small_snapshot(4));
  CHECK(entries(dir) == std::set<std::string>{"latest", "step_00000003", "step_00000004"});
  std::printf("[integrity] rotation: kill between rename and delete left step_00000001.deleting, "
              "resume candidates %zu (none of them .deleting); the next save removed it\n",
              candidates.size());
  fs::remove_all(dir);
}

TEST_CASE("save errors: a read-only or full filesystem names the directory and leaves latest untouched",
          "[checkpoint][integrity]") {
  const fs::path dir = fresh_dir("save_errors");
  CheckpointWriter w(dir.string(), 3, false);
  w.save(small_snapshot(1));

  // Injected: the directory of the save cannot be created (read-only filesystem).
  checkpoint_inject_fault({"prepare", EROFS, 0, 1});
  CHECK_THROWS_WITH(w.save(small_snapshot(2)),
                    Contains((dir / "step_00000002.partial").string()) && Contains("Read-only file system"));
  CHECK(read_bytes(dir / "latest") == "step_00000001\n");
  CHECK(entries(dir) == std::set<std::string>{"latest", "step_00000001"});

  // A real ENOSPC: `latest.tmp` leads to /dev/full, where every write fails.
  fs::create_symlink("/dev/full", dir / "latest.tmp");
  std::string error;
  try {
    w.save(small_snapshot(3));
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::printf("[integrity] save through /dev/full: %s\n", error.c_str());
  CHECK_THAT(error, Contains((dir / "latest.tmp").string()) && Contains("No space left on device"));
  CHECK(read_bytes(dir / "latest") == "step_00000001\n");
  // The checkpoint itself was complete before `latest` was to move: it loads.
  CHECK(load_checkpoint((dir / "step_00000003").string()).meta.step == 3);
  fs::remove(dir / "latest.tmp");
  w.save(small_snapshot(4));
  CHECK(read_bytes(dir / "latest") == "step_00000004\n");

  // The hook's spelling in the environment.
  const CheckpointFault f = parse_checkpoint_fault("rank_file:EACCES:2:3");
  CHECK(f.stage == "rank_file");
  CHECK(f.error == EACCES);
  CHECK(f.skip == 2);
  CHECK(f.times == 3);
  CHECK(parse_checkpoint_fault("latest").error == ENOSPC);
  CHECK_THROWS_WITH(parse_checkpoint_fault("nowhere"), Contains("TRAINER_TEST_CHECKPOINT_FAULT") && Contains("unknown stage"));
  CHECK_THROWS_WITH(parse_checkpoint_fault("prepare:EFOO"), Contains("unknown errno"));
  CHECK_THROWS_WITH(parse_checkpoint_fault("prepare:EROFS:x"), Contains("not a count"));
  fs::remove_all(dir);
}

TEST_CASE("on_save_error: stop throws naming step, directory and latest, continue reports and saves again",
          "[checkpoint][integrity]") {
  for (bool async : {false, true}) {
    INFO("async " << async);
    {
      const fs::path dir = fresh_dir("stop");
      CheckpointSaver s(dir.string(), 3, async, CheckpointGroup{}, "stop", true);
      CHECK(s.save(small_snapshot(1)));
      s.wait();  // before arming the hook: step 1 must not be the one that fails
      checkpoint_inject_fault({"rank_file", ENOSPC, 0, 1});
      std::string error;
      try {
        s.save(small_snapshot(2));
        s.save(small_snapshot(3));  // asynchronous: step 2's failure surfaces here
      } catch (const std::exception& e) {
        error = e.what();
      }
      CHECK_THAT(error, Contains("checkpoint save of step 2 under " + dir.string() + " failed") &&
                            Contains("No space left on device") && Contains("`latest` still names step_00000001") &&
                            Contains("on_save_error=stop"));
      CHECK(read_bytes(dir / "latest") == "step_00000001\n");
      CHECK(s.failures() == 1);
      fs::remove_all(dir);
    }
    {
      const fs::path dir = fresh_dir("continue");
      CheckpointSaver s(dir.string(), 3, async, CheckpointGroup{}, "continue", true);
      CHECK(s.save(small_snapshot(1)));
      s.wait();
      checkpoint_inject_fault({"prepare", EROFS, 0, 1});
      {
        CaptureStderr err;
        CHECK(s.save(small_snapshot(2)) == async);  // synchronous: known at once
        CHECK(s.save(small_snapshot(3)));
        s.settle();
        CHECK_THAT(err.text(), Contains("checkpoint: ERROR: checkpoint save of step 2 under " + dir.string()) &&
                                   Contains("Read-only file system") && Contains("training goes on"));
      }
      CHECK(s.failures() == 1);
      CHECK(read_bytes(dir / "latest") == "step_00000003\n");
      if (async) {
        // Mid-run, a failed background save under continue is reported, not thrown.
        checkpoint_inject_fault({"rank_file", ENOSPC, 0, 1});
        CaptureStderr err;
        CHECK(s.save(small_snapshot(5)));
        CHECK_NOTHROW(s.settle());
        CHECK_THAT(err.text(), Contains("checkpoint save of step 5"));
        CHECK(s.failures() == 2);
      }
      CHECK(entries(dir) == std::set<std::string>{"latest", "step_00000001", "step_00000003"});
      // The run's last save must succeed, under continue too.
      checkpoint_inject_fault({"rank_file", ENOSPC, 0, 1});
      CaptureStderr err;
      CHECK(s.save(small_snapshot(4)) == async);
      CHECK_THROWS_WITH(s.wait(), Contains("step 4") && Contains("the run's last save must succeed"));
      fs::remove_all(dir);
    }
  }
  CHECK_THROWS_WITH(CheckpointSaver("x", 1, false, CheckpointGroup{}, "ignore", true), Contains("stop or continue"));
}

TEST_CASE("run lock: a second lock on a directory fails naming the holder, and is free once released",
          "[integrity][lock]") {
  const fs::path dir = fresh_dir("lock");
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  {
    DirectoryLock first((dir / "run").string());
    CHECK(read_bytes(first.file()).rfind("pid " + std::to_string(::getpid()) + " on host " + host, 0) == 0);
    std::string error;
    try {
      DirectoryLock second((dir / "run").string());
    } catch (const DirectoryInUse& e) {
      error = e.what();
    }
    std::printf("[lock] second lock: %s\n", error.c_str());
    CHECK_THAT(error, Contains((dir / "run").string() + " is in use by another trainer: pid " +
                               std::to_string(::getpid()) + " on host " + host));
  }
  CHECK_NOTHROW(DirectoryLock((dir / "run").string()));  // released with the first
  fs::remove_all(dir);
}
