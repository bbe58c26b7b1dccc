// Saving a checkpoint. The order of operations is what makes a crash at any
// point harmless: files are complete and fsynced before the directory is
// renamed from step_N.partial to step_N, the rename is fsynced before `latest`
// names it, and old checkpoints are deleted only after `latest` moved on.
// With several ranks, rank 0 alone creates, publishes and deletes
// directories; the others only add their file to step_N.partial and report
// it through the store (protocol in checkpoint.h).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <unordered_set>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_internal.h"
#include "checkpoint/checksum.h"
#include "checkpoint/json.h"
#include "checkpoint/safetensors.h"
#include "comm/store.h"

namespace trainer {

namespace fs = std::filesystem;
using namespace ckpt_detail;

namespace {

std::mutex g_fault_mu;
std::string g_fault_stage;

void maybe_inject_failure(const char* stage) {
  std::lock_guard<std::mutex> lock(g_fault_mu);
  if (g_fault_stage.empty() || g_fault_stage != stage) return;
  g_fault_stage.clear();
  throw std::runtime_error(std::string("injected failure at stage '") + stage + "' (test hook): " +
                           std::strerror(ENOSPC));
}

// A rename or a new file is durable only once its directory entry is: fsync
// the directory itself.
void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd < 0) throw std::runtime_error(path + ": cannot open for fsync: " + std::strerror(errno));
  const bool ok = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) throw std::runtime_error(path + ": fsync failed: " + std::strerror(err));
}

void write_text_synced(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(path + ": cannot create: " + std::strerror(errno));
  const char* p = text.data();
  size_t left = text.size();
  int err = 0;
  while (!err && left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      err = w < 0 ? errno : EIO;
    } else {
      p += w;
      left -= size_t(w);
    }
  }
  if (!err && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && !err) err = errno;
  if (err) throw std::runtime_error(path + ": write failed: " + std::strerror(err));
}

void rename_or_throw(const fs::path& from, const fs::path& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    throw std::runtime_error("cannot rename " + from.string() + " to " + to.string() + ": " + std::strerror(errno));
}

std::string utc_now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

json::Value int_array(const std::vector<int64_t>& v) {
  json::Value a = json::Value::array();
  for (int64_t x : v) a.push_back(x);
  return a;
}

// Catches caller mistakes before anything touches the disk, so a bad snapshot
// can never produce a checkpoint that fails to load later.
void validate_snapshot(Snapshot& snap) {
  if (snap.meta.world_size < 1)
    throw std::invalid_argument("checkpoint save: world_size " + std::to_string(snap.meta.world_size) + " < 1");
  if (snap.rank < 0 || snap.rank >= snap.meta.world_size)
    throw std::invalid_argument("checkpoint save: rank " + std::to_string(snap.rank) + " outside world size " +
                                std::to_string(snap.meta.world_size));
  if (snap.meta.step < 0) throw std::invalid_argument("checkpoint save: negative step " + std::to_string(snap.meta.step));
  std::unordered_set<std::string> names;
  for (ShardTensor& t : snap.tensors) {
    const std::string where = "checkpoint save: tensor \"" + t.name + "\": ";
    if (t.name.empty()) throw std::invalid_argument("checkpoint save: a tensor has an empty name");
    if (!names.insert(t.name).second) throw std::invalid_argument(where + "name appears twice in one rank's snapshot");
    // The header's convention: a rank holding the whole tensor may leave it empty.
    if (t.offset.empty()) t.offset.assign(t.shape.size(), 0);
    if (t.global_shape.size() != t.shape.size() || t.offset.size() != t.shape.size())
      throw std::invalid_argument(where + "shape " + shape_str(t.shape) + ", offset " + shape_str(t.offset) +
                                  " and global shape " + shape_str(t.global_shape) + " differ in rank");
    for (size_t d = 0; d < t.shape.size(); ++d)
      if (t.offset[d] < 0 || t.shape[d] < 0 || t.offset[d] > t.global_shape[d] - t.shape[d])
        throw std::invalid_argument(where + "slice at " + shape_str(t.offset) + " of shape " + shape_str(t.shape) +
                                    " does not fit in the global shape " + shape_str(t.global_shape));
    const auto numel = checked_numel(t.shape);
    if (!numel) throw std::invalid_argument(where + "invalid shape " + shape_str(t.shape));
    const uint64_t need = uint64_t(*numel) * dtype_size(t.dtype);
    if (t.data.size() != need)
      throw std::invalid_argument(where + "holds " + std::to_string(t.data.size()) + " bytes, shape " +
                                  shape_str(t.shape) + " of " + dtype_name(t.dtype) + " needs " + std::to_string(need));
  }
}

// What one rank contributes to the manifest: its file and the slices in it
// (tensor data not included).
struct RankReport {
  int rank = 0;
  std::string file;
  WrittenFile written;
  std::vector<ShardTensor> slices;
};

RankReport write_rank_file(const fs::path& partial, const Snapshot& snap) {
  RankReport r;
  r.rank = snap.rank;
  r.file = rank_file_name(snap.rank);
  std::vector<SafetensorsView> views;
  views.reserve(snap.tensors.size());
  for (const ShardTensor& t : snap.tensors) {
    views.push_back({t.name, t.dtype, t.shape, t.data.data()});
    ShardTensor meta = t;
    meta.data.clear();
    meta.data.shrink_to_fit();
    r.slices.push_back(std::move(meta));
  }
  r.written = write_safetensors_synced((partial / r.file).string(), views);
  return r;
}

json::Value build_manifest(const CheckpointMeta& meta, const std::vector<RankReport>& reports) {
  json::Value files = json::Value::object();
  json::Value tensors = json::Value::array();
  std::map<std::string, size_t> index;  // name -> position in `tensors`
  std::map<std::string, std::vector<SliceBox>> boxes;
  for (const RankReport& r : reports) {
    json::Value f = json::Value::object();
    f["bytes"] = r.written.bytes;
    f["crc32c"] = crc32c_hex(r.written.crc32c);
    files.as_object().emplace_back(r.file, std::move(f));
    for (const ShardTensor& t : r.slices) {
      auto [it, fresh] = index.emplace(t.name, tensors.as_array().size());
      if (fresh) {
        json::Value e = json::Value::object();
        e["name"] = t.name;
        e["dtype"] = dtype_name(t.dtype);
        e["global_shape"] = int_array(t.global_shape);
        e["slices"] = json::Value::array();
        tensors.push_back(std::move(e));
      }
      json::Value& e = tensors.as_array()[it->second];
      if (e.at("dtype").as_string() != dtype_name(t.dtype) || e.at("global_shape") != int_array(t.global_shape))
        throw std::logic_error("checkpoint save: ranks disagree on dtype or global shape of \"" + t.name + "\"");
      json::Value s = json::Value::object();
      s["rank"] = r.rank;
      s["file"] = r.file;
      s["offset"] = int_array(t.offset);
      s["shape"] = int_array(t.shape);
      e["slices"].push_back(std::move(s));
      boxes[t.name].push_back(SliceBox{t.offset, t.shape});
    }
  }
  for (const auto& e : tensors.as_array()) {
    const std::string& name = e.at("name").as_string();
    std::vector<int64_t> global;
    for (const auto& d : e.at("global_shape").as_array()) global.push_back(d.as_int64());
    const std::string bad = check_slice_cover(global, boxes[name]);
    if (!bad.empty()) throw std::logic_error("checkpoint save: tensor \"" + name + "\": " + bad);
  }

  json::Value m = json::Value::object();
  m["format"] = kFormatName;
  m["format_version"] = kFormatVersion;
  m["step"] = meta.step;
  m["tokens"] = meta.tokens;
  m["seed"] = meta.seed;
  m["optimizer_step"] = meta.optimizer_step;
  m["world_size"] = meta.world_size;
  m["layout"] = meta.layout;
  m["created"] = utc_now_iso8601();
  m["files"] = std::move(files);
  m["tensors"] = std::move(tensors);
  m["config_yaml"] = meta.config_yaml;
  return m;
}

void warn(const std::string& msg) { std::cerr << "checkpoint: " << msg << "\n"; }

// Deletes leftovers of interrupted saves and the complete checkpoints beyond
// keep_last. The one just written is always kept, even when older-looking
// steps exist from an earlier run, so a resume from an older checkpoint never
// deletes its own progress. Failures only warn: the save itself succeeded.
void prune(const fs::path& root, int keep_last, const std::string& current) {
  std::error_code ec;
  std::vector<std::pair<int64_t, fs::path>> complete;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == current || !it->is_directory()) continue;
    const size_t dot = name.find('.');
    const std::string base = name.substr(0, dot);
    if (!parse_step_dir_name(base)) continue;
    if (dot != std::string::npos) {
      const std::string suffix = name.substr(dot);
      if (suffix == kPartialSuffix || suffix == kReplacedSuffix) {
        std::error_code rm;
        fs::remove_all(it->path(), rm);
        if (rm) warn("could not remove stale " + it->path().string() + ": " + rm.message());
      }
      continue;
    }
    // A step directory without a manifest is not ours to judge (it might be
    // inspected by hand); resume skips it and it is left alone.
    if (fs::exists(it->path() / kManifestName)) complete.emplace_back(*parse_step_dir_name(base), it->path());
  }
  if (ec) {
    warn("could not list " + root.string() + " for pruning: " + ec.message());
    return;
  }
  if (keep_last <= 0) return;
  std::sort(complete.begin(), complete.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = size_t(keep_last - 1); i < complete.size(); ++i) {
    std::error_code rm;
    fs::remove_all(complete[i].second, rm);
    if (rm) warn("could not remove old checkpoint " + complete[i].second.string() + ": " + rm.message());
  }
}

// Makes a finished .partial directory the checkpoint of its step and points
// `latest` at it.
void publish(const fs::path& root, const fs::path& partial, const fs::path& final_dir) {
  std::error_code ec;
  fs::path aside;
  if (fs::exists(fs::symlink_status(final_dir, ec))) {
    // rename() cannot replace a non-empty directory; move the old one aside
    // first and delete it only after the new one is in place.
    aside = final_dir;
    aside += kReplacedSuffix;
    fs::remove_all(aside, ec);
    if (ec) throw std::runtime_error("cannot remove " + aside.string() + ": " + ec.message());
    rename_or_throw(final_dir, aside);
  }
  try {
    maybe_inject_failure("publish");
    rename_or_throw(partial, final_dir);
  } catch (...) {
    if (!aside.empty()) std::rename(aside.c_str(), final_dir.c_str());
    throw;
  }
  fsync_path(root.string(), true);

  maybe_inject_failure("latest");
  const fs::path latest = root / kLatestName;
  fs::path tmp = latest;
  tmp += ".tmp";
  write_text_synced(tmp.string(), final_dir.filename().string() + "\n");
  rename_or_throw(tmp, latest);
  fsync_path(root.string(), true);

  if (!aside.empty()) {
    fs::remove_all(aside, ec);
    if (ec) warn("could not remove replaced " + aside.string() + ": " + ec.message());
  }
}

// The directories of one save.
struct SavePaths {
  fs::path root, partial, final_dir;
  std::string name;  // "step_00001000"
};

SavePaths save_paths(const std::string& root, int64_t step) {
  SavePaths p;
  p.root = fs::path(root);
  p.name = checkpoint_dir_name(step);
  p.final_dir = p.root / p.name;
  p.partial = p.root / (p.name + kPartialSuffix);
  return p;
}

// Leaves an empty step_N.partial (creating the root as needed).
void prepare_partial(const SavePaths& p) {
  std::error_code ec;
  fs::create_directories(p.root, ec);
  if (ec || !fs::is_directory(p.root))
    throw std::runtime_error(p.root.string() + ": cannot create checkpoint directory: " +
                             (ec ? ec.message() : std::string("exists and is not a directory")));
  // A .partial of this step is a crashed earlier attempt; its contents are
  // unknown, so start over.
  fs::remove_all(p.partial, ec);
  if (ec) throw std::runtime_error("cannot remove stale " + p.partial.string() + ": " + ec.message());
  if (!fs::create_directory(p.partial, ec) || ec)
    throw std::runtime_error(p.partial.string() + ": cannot create: " + (ec ? ec.message() : "exists"));
}

// Nothing of a failed save may look like a checkpoint; `latest` and the
// existing step directories were not touched (publish restores them).
void remove_partial(const SavePaths& p) {
  std::error_code rm;
  fs::remove_all(p.partial, rm);
}

// Every rank file is in place: manifest, rename, `latest`.
void finish(const SavePaths& p, const CheckpointMeta& meta, const std::vector<RankReport>& reports) {
  const json::Value manifest = build_manifest(meta, reports);
  write_text_synced((p.partial / kManifestName).string(), json::dump(manifest, 2) + "\n");
  maybe_inject_failure("manifest");
  fsync_path(p.partial.string(), true);
  publish(p.root, p.partial, p.final_dir);
}

// The whole save of a single process; returns the final directory.
std::string save_single(const std::string& root, int keep_last, Snapshot& snap) {
  validate_snapshot(snap);
  if (snap.meta.world_size != 1)
    throw std::invalid_argument("checkpoint save: world_size " + std::to_string(snap.meta.world_size) +
                                " needs a writer constructed with a CheckpointGroup of that size");
  const SavePaths p = save_paths(root, snap.meta.step);
  prepare_partial(p);
  try {
    RankReport local = write_rank_file(p.partial, snap);
    maybe_inject_failure("rank_file");
    finish(p, snap.meta, {std::move(local)});
  } catch (...) {
    remove_partial(p);
    throw;
  }
  prune(p.root, keep_last, p.name);
  return p.final_dir.string();
}

// ---------------------------------------------------------------------------
// Several ranks. Reports travel through the store as JSON.

json::Value slice_to_json(const ShardTensor& t) {
  json::Value s = json::Value::object();
  s["name"] = t.name;
  s["dtype"] = dtype_name(t.dtype);
  s["global_shape"] = int_array(t.global_shape);
  s["offset"] = int_array(t.offset);
  s["shape"] = int_array(t.shape);
  return s;
}

std::vector<int64_t> int_vector(const json::Value& a) {
  std::vector<int64_t> v;
  for (const auto& x : a.as_array()) v.push_back(x.as_int64());
  return v;
}

ShardTensor slice_from_json(const json::Value& s) {
  ShardTensor t;
  t.name = s.at("name").as_string();
  const std::string& dt = s.at("dtype").as_string();
  const auto dtype = dtype_from_name(dt);
  if (!dtype) throw json::TypeError("tensor \"" + t.name + "\" has unknown dtype \"" + dt + "\"");
  t.dtype = *dtype;
  t.global_shape = int_vector(s.at("global_shape"));
  t.offset = int_vector(s.at("offset"));
  t.shape = int_vector(s.at("shape"));
  return t;
}

std::string encode_report(const RankReport& r) {
  json::Value v = json::Value::object();
  v["rank"] = r.rank;
  v["file"] = r.file;
  v["bytes"] = r.written.bytes;
  v["crc32c"] = r.written.crc32c;
  json::Value slices = json::Value::array();
  for (const ShardTensor& t : r.slices) slices.push_back(slice_to_json(t));
  v["slices"] = std::move(slices);
  return json::dump(v);
}

std::string encode_failure(int rank, const std::string& error) {
  json::Value v = json::Value::object();
  v["rank"] = rank;
  v["error"] = error;
  return json::dump(v);
}

// What rank 0 learns from one rank: its report, or why there is none.
struct RankResult {
  std::optional<RankReport> report;
  std::string error;
};

RankResult decode_report(const std::string& text, int rank) {
  RankResult out;
  try {
    const json::Value v = json::parse(text);
    const int64_t claimed = v.at("rank").as_int64();
    if (claimed != rank) throw json::TypeError("it claims to come from rank " + std::to_string(claimed));
    if (const json::Value* e = v.find("error")) {
      out.error = e->as_string().empty() ? "(no message)" : e->as_string();
      return out;
    }
    RankReport r;
    r.rank = rank;
    r.file = v.at("file").as_string();
    // The name becomes a path inside the checkpoint: only the expected one will do.
    if (r.file != rank_file_name(rank)) throw json::TypeError("unexpected file name \"" + r.file + "\"");
    r.written.bytes = v.at("bytes").as_uint64();
    const uint64_t crc = v.at("crc32c").as_uint64();
    if (crc > UINT32_MAX) throw json::TypeError("crc32c " + std::to_string(crc) + " is out of range");
    r.written.crc32c = uint32_t(crc);
    for (const auto& s : v.at("slices").as_array()) r.slices.push_back(slice_from_json(s));
    out.report = std::move(r);
  } catch (const std::exception& e) {
    out.error = std::string("its report is unreadable: ") + e.what();
  }
  return out;
}

using Clock = std::chrono::steady_clock;

// A StoreClient serialises its calls, so one long blocking get would stall
// every other user of the same client (barriers, heartbeats) for as long as a
// slow rank takes; waits are cut into short slices instead.
constexpr double kStoreWaitSliceS = 0.2;

Clock::time_point deadline_after(double seconds) {
  if (!(seconds < 1e9)) return Clock::time_point::max();  // +infinity: wait forever
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// The key's value, or nullopt once the deadline has passed without it.
std::optional<std::string> get_before(Store& store, const std::string& key, Clock::time_point deadline) {
  for (;;) {
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    try {
      return store.get(key, std::clamp(left, 0.0, kStoreWaitSliceS));  // 0: one last look
    } catch (const StoreTimeout&) {
      if (left <= 0) return std::nullopt;
    }
  }
}

std::string seconds_str(double s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

// "rank 3", "ranks 1, 3"
std::string ranks_str(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// One multi-rank save: where it meets in the store, and who is asking.
struct Rendezvous {
  Store& store;
  int rank = 0;
  int world = 1;
  double timeout_s = 0;
  std::string prefix;  // "ckpt/<root>/step_00001000/0/"

  std::string ready() const { return prefix + "ready"; }
  std::string report(int r) const { return prefix + "report/" + std::to_string(r); }
  std::string outcome() const { return prefix + "outcome"; }
};

// Tells the other ranks about a failure. A store error here must not replace
// the failure being reported, so it only warns (the others then time out).
void set_quietly(Store& store, const std::string& key, const std::string& value) {
  try {
    store.set(key, value);
  } catch (const std::exception& e) {
    warn("could not report a failed save under store key '" + key + "': " + e.what());
  }
}

// Keys nobody reads any more; a leftover only costs a few bytes in the store.
void forget_keys(Store& store, const std::vector<std::string>& keys) {
  for (const std::string& k : keys) try {
      store.del(k);
    } catch (const std::exception& e) {
      warn("could not delete store key '" + k + "': " + e.what());
    }
}

// The writer was built for one rank; a snapshot of another would put its
// file under the wrong name or its report under the wrong key.
void check_group_snapshot(const Snapshot& snap, const Rendezvous& rv) {
  if (snap.rank != rv.rank || snap.meta.world_size != rv.world)
    throw std::invalid_argument("checkpoint save: snapshot of rank " + std::to_string(snap.rank) + " of world size " +
                                std::to_string(snap.meta.world_size) + " handed to the writer of rank " +
                                std::to_string(rv.rank) + " of " + std::to_string(rv.world));
}

// Failures of other ranks, already worded "rank N ...", as opposed to rank 0's own.
struct RankFailures : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A root that is node-local on each host would otherwise yield a manifest
// naming files rank 0 cannot see.
std::string check_visible(const SavePaths& p, const RankReport& r) {
  const fs::path f = p.partial / r.file;
  std::error_code ec;
  const uint64_t size = fs::file_size(f, ec);
  const std::string who = "rank " + std::to_string(r.rank);
  if (ec)
    return who + " wrote " + f.string() + " but rank 0 cannot see it (" + ec.message() +
           "); the checkpoint directory must be on a filesystem shared by all ranks";
  if (size != r.written.bytes)
    return who + " wrote " + std::to_string(r.written.bytes) + " bytes to " + f.string() + ", rank 0 sees " +
           std::to_string(size);
  return "";
}

struct Gathered {
  std::vector<RankReport> reports;  // in rank order
  std::string failures;             // "" when every rank wrote its file
  bool all_arrived = false;
};

// Rank 0's own result plus every other rank's report; the failures name each
// rank that failed or never reported.
Gathered gather_rank_reports(const Rendezvous& rv, const SavePaths& p, int64_t step, RankResult own) {
  Gathered g;
  std::vector<int> missing;
  auto fail = [&](const std::string& why) { g.failures += (g.failures.empty() ? "" : "; ") + why; };
  auto take = [&](int r, RankResult res) {
    if (!res.report) {
      fail("rank " + std::to_string(r) + " failed: " + res.error);
    } else if (const std::string bad = r == 0 ? "" : check_visible(p, *res.report); !bad.empty()) {
      fail(bad);
    } else {
      g.reports.push_back(std::move(*res.report));
    }
  };
  take(0, std::move(own));
  const Clock::time_point deadline = deadline_after(rv.timeout_s);
  for (int r = 1; r < rv.world; ++r) {
    std::optional<std::string> text = get_before(rv.store, rv.report(r), deadline);
    if (!text) {
      missing.push_back(r);
      continue;
    }
    forget_keys(rv.store, {rv.report(r)});  // rank 0 is its only reader
    take(r, decode_report(*text, r));
  }
  g.all_arrived = missing.empty();
  if (!missing.empty())
    fail("rank 0 waited " + seconds_str(rv.timeout_s) + " s for the reports of " + ranks_str(missing) + " (of " +
         std::to_string(rv.world) + ") on " + p.partial.string() +
         "; they never came (did every rank call save() for step " + std::to_string(step) + "?)");
  return g;
}

// Rank 0 of a group: prepares the directory, writes its own file, collects the
// others' reports and publishes only when all of them succeeded. Every
// failure after "ready" is announced under "outcome" for the other ranks.
// `previous_prefix` holds the keys of this writer's previous save.
std::string save_as_rank0(const Rendezvous& rv, const SavePaths& p, int keep_last, Snapshot& snap,
                          std::string& previous_prefix) {
  const std::string failed = "checkpoint save of " + p.final_dir.string() + " failed: ";
  try {
    check_group_snapshot(snap, rv);
    validate_snapshot(snap);
    prepare_partial(p);
  } catch (const std::exception& e) {
    const std::string msg = failed + "rank 0 failed: " + e.what();
    set_quietly(rv.store, rv.ready(), "failed: " + msg);  // the others stop waiting and report nothing
    throw std::runtime_error(msg);
  }
  rv.store.set(rv.ready(), "ok");

  RankResult own;
  try {
    own.report = write_rank_file(p.partial, snap);
    maybe_inject_failure("rank_file");
  } catch (const std::exception& e) {
    own.report.reset();
    own.error = e.what();
  }
  try {
    Gathered g = gather_rank_reports(rv, p, snap.meta.step, std::move(own));
    if (g.all_arrived) {
      // Every rank reported, so every rank has finished this writer's previous save.
      if (!previous_prefix.empty()) forget_keys(rv.store, {previous_prefix + "ready", previous_prefix + "outcome"});
      previous_prefix = rv.prefix;
    }
    if (!g.failures.empty()) throw RankFailures(g.failures);
    finish(p, snap.meta, g.reports);
  } catch (const std::exception& e) {
    remove_partial(p);
    const bool others = dynamic_cast<const RankFailures*>(&e) != nullptr;
    const std::string msg = failed + (others ? "" : "rank 0 failed: ") + e.what();
    set_quietly(rv.store, rv.outcome(), "failed: " + msg);
    throw std::runtime_error(msg);
  }
  rv.store.set(rv.outcome(), "done");
  prune(p.root, keep_last, p.name);
  return p.final_dir.string();
}

// Rank 0's announcement of a failure, to be rethrown as it is worded.
struct RankZeroFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Waits until rank 0 created step_N.partial.
void wait_for_directory(const Rendezvous& rv, const SavePaths& p, int64_t step) {
  const std::optional<std::string> v = get_before(rv.store, rv.ready(), deadline_after(rv.timeout_s));
  if (!v)
    throw std::runtime_error("waited " + seconds_str(rv.timeout_s) + " s for rank 0 to create " + p.partial.string() +
                             " (store key '" + rv.ready() + "'); rank 0 never announced it (did it call save() for step " +
                             std::to_string(step) + "?)");
  if (*v != "ok") throw RankZeroFailed(v->rfind("failed: ", 0) == 0 ? v->substr(8) : *v);
}

// Rank 0's verdict; returns only when the checkpoint was published.
void wait_for_outcome(const Rendezvous& rv, const SavePaths& p) {
  // Rank 0 may itself wait timeout_s for the slowest rank before deciding.
  const std::optional<std::string> v = get_before(rv.store, rv.outcome(), deadline_after(2 * rv.timeout_s));
  if (!v)
    throw std::runtime_error("checkpoint save of " + p.final_dir.string() + ": rank " + std::to_string(rv.rank) +
                             " wrote its file but heard no verdict from rank 0 within " +
                             seconds_str(2 * rv.timeout_s) + " s (store key '" + rv.outcome() +
                             "'); the checkpoint may or may not have been published");
  if (*v == "done") return;
  throw std::runtime_error(v->rfind("failed: ", 0) == 0 ? v->substr(8) : *v);
}

// Any rank but 0: writes its file into the directory rank 0 prepared, reports
// it (or its error), and succeeds only if rank 0 then published the checkpoint.
std::string save_as_other_rank(const Rendezvous& rv, const SavePaths& p, Snapshot& snap) {
  RankReport report;
  try {
    check_group_snapshot(snap, rv);
    validate_snapshot(snap);
    wait_for_directory(rv, p, snap.meta.step);
    report = write_rank_file(p.partial, snap);
    maybe_inject_failure("rank_file");
  } catch (const RankZeroFailed& e) {
    throw std::runtime_error(e.what());  // rank 0 gave up already and reads no reports
  } catch (const std::exception& e) {
    // Rank 0 fails the save on this report; waiting for it to say so adds nothing.
    set_quietly(rv.store, rv.report(rv.rank), encode_failure(rv.rank, e.what()));
    throw std::runtime_error("checkpoint save of " + p.final_dir.string() + " failed: rank " + std::to_string(rv.rank) +
                             " failed: " + e.what());
  }
  rv.store.set(rv.report(rv.rank), encode_report(report));
  wait_for_outcome(rv, p);
  return p.final_dir.string();
}

}  // namespace

void checkpoint_fail_next_save_at(const std::string& stage) {
  std::lock_guard<std::mutex> lock(g_fault_mu);
  g_fault_stage = stage;
}

struct CheckpointWriter::Impl {
  std::string root;
  int keep_last = 0;
  bool async = false;
  CheckpointGroup group;
  // Saves started per step (caller thread only). Part of the store keys, so a
  // re-save of a step meets on fresh keys; counted per step rather than
  // overall so that a rank which skipped a save (save() rethrew an earlier
  // error) still agrees with the others on every later step.
  std::map<int64_t, int> saves_of_step;
  std::string previous_prefix;  // rank 0's key cleanup; writer thread only
  std::thread worker;
  std::atomic<bool> running{false};
  std::exception_ptr error;  // set by the worker before `running` drops; read after join
  mutable std::mutex mu;
  std::string last_completed;

  void join_and_rethrow() {
    if (worker.joinable()) worker.join();
    if (error) {
      std::exception_ptr e = error;
      error = nullptr;
      std::rethrow_exception(e);
    }
  }

  void set_completed(const std::string& dir) {
    std::lock_guard<std::mutex> lock(mu);
    last_completed = dir;
  }

  // Store key prefix of the next save of `step`. The root is part of it:
  // writers of different roots (a run's checkpoints and the smoke test's
  // round trip) may save the same step in one job.
  std::string next_prefix(int64_t step) {
    return "ckpt/" + root + "/" + checkpoint_dir_name(step) + "/" + std::to_string(saves_of_step[step]++) + "/";
  }

  // The whole save; returns the final directory. Runs on the writer thread
  // when asynchronous.
  std::string write(Snapshot& snap, const std::string& prefix) {
    if (group.world_size == 1) return save_single(root, keep_last, snap);
    const Rendezvous rv{*group.store, group.rank, group.world_size, group.timeout_s, prefix};
    const SavePaths p = save_paths(root, snap.meta.step);
    return group.rank == 0 ? save_as_rank0(rv, p, keep_last, snap, previous_prefix) : save_as_other_rank(rv, p, snap);
  }
};

CheckpointWriter::CheckpointWriter(std::string root, int keep_last, bool async) : impl_(std::make_unique<Impl>()) {
  impl_->root = std::move(root);
  impl_->keep_last = keep_last;
  impl_->async = async;
}

CheckpointWriter::CheckpointWriter(std::string root, int keep_last, bool async, CheckpointGroup group)
    : CheckpointWriter(std::move(root), keep_last, async) {
  const std::string where = "checkpoint group (rank " + std::to_string(group.rank) + " of " +
                            std::to_string(group.world_size) + "): ";
  if (group.world_size < 1) throw std::invalid_argument(where + "world size must be at least 1");
  if (group.rank < 0 || group.rank >= group.world_size) throw std::invalid_argument(where + "rank outside the world");
  if (group.world_size > 1 && !group.store) throw std::invalid_argument(where + "several ranks need a store");
  if (!(group.timeout_s > 0)) throw std::invalid_argument(where + "timeout_s must be positive");
  impl_->group = group;
}

CheckpointWriter::~CheckpointWriter() {
  try {
    impl_->join_and_rethrow();
  } catch (const std::exception& e) {
    // Nobody is left to rethrow to; at least say that the last save is missing.
    warn(std::string("background save failed: ") + e.what());
  }
}

void CheckpointWriter::save(Snapshot snap) {
  impl_->join_and_rethrow();
  const std::string prefix = impl_->group.world_size > 1 ? impl_->next_prefix(snap.meta.step) : "";
  if (!impl_->async) {
    impl_->set_completed(impl_->write(snap, prefix));
    return;
  }
  impl_->running = true;
  try {
    impl_->worker = std::thread([impl = impl_.get(), s = std::move(snap), prefix]() mutable {
      try {
        impl->set_completed(impl->write(s, prefix));
      } catch (...) {
        impl->error = std::current_exception();
      }
      s.tensors.clear();  // free the host copy before reporting idle
      impl->running = false;
    });
  } catch (...) {
    impl_->running = false;
    throw;
  }
}

void CheckpointWriter::wait() { impl_->join_and_rethrow(); }

bool CheckpointWriter::busy() const { return impl_->running.load(); }

std::string CheckpointWriter::last_completed() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->last_completed;
}

}  // namespace trainer
