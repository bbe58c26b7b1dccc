// Saving a checkpoint. The order of operations is what makes a crash at any
// point harmless: files are complete and fsynced before the directory is
// renamed from step_N.partial to step_N, the rename is fsynced before `latest`
// names it, and old checkpoints are deleted only after `latest` moved on.
// Old checkpoints are renamed to step_N.deleting before their files go, so a
// kill mid-deletion leaves a name no reader takes for a checkpoint.
// With several ranks, rank 0 alone creates, publishes and deletes
// directories; the others only add their file to step_N.partial and report
// it through the store (checkpoint_group.cpp).
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
#include "checkpoint/checkpoint_save.h"
#include "checkpoint/checksum.h"
#include "checkpoint/fault_injection.h"
#include "checkpoint/manifest_checksum.h"
#include "checkpoint/strict_json.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/slice_json.h"
#include "comm/store.h"
#include "core/trace.h"

namespace trainer {

namespace fs = std::filesystem;

namespace ckpt_detail {

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

// Catches caller mistakes before anything touches the disk, so a bad snapshot
// can never produce a checkpoint that fails to load later.
void validate_snapshot(const Snapshot& snap) {
  if (snap.meta.world_size < 1)
    throw std::invalid_argument("checkpoint save: world_size " + std::to_string(snap.meta.world_size) + " < 1");
  if (snap.rank < 0 || snap.rank >= snap.meta.world_size)
    throw std::invalid_argument("checkpoint save: rank " + std::to_string(snap.rank) + " outside world size " +
                                std::to_string(snap.meta.world_size));
  if (snap.meta.step < 0) throw std::invalid_argument("checkpoint save: negative step " + std::to_string(snap.meta.step));
  std::unordered_set<std::string> names;
  for (const ShardTensor& t : snap.tensors) {
    const std::string where = "checkpoint save: tensor \"" + t.name + "\": ";
    if (t.name.empty()) throw std::invalid_argument("checkpoint save: a tensor has an empty name");
    if (!names.insert(t.name).second) throw std::invalid_argument(where + "name appears twice in one rank's snapshot");
    if (std::string bad = slice_error(t.slice); !bad.empty()) throw std::invalid_argument(where + bad);
    const uint64_t need = uint64_t(t.slice.numel()) * dtype_size(t.dtype);
    if (t.data.size() != need)
      throw std::invalid_argument(where + "holds " + std::to_string(t.data.size()) + " bytes, " +
                                  describe_slice(t.slice) + " of " + shape_text(t.slice.global_shape) + " (" +
                                  std::to_string(t.slice.numel()) + " elements of " + dtype_name(t.dtype) +
                                  ") needs " + std::to_string(need));
  }
}

RankReport write_rank_file(const fs::path& partial, const Snapshot& snap) {
  RankReport r;
  r.rank = snap.rank;
  r.file = rank_file_name(snap.rank);
  std::vector<SafetensorsView> views;
  views.reserve(snap.tensors.size());
  for (const ShardTensor& t : snap.tensors) {
    views.push_back({t.name, t.dtype, t.slice.stored_shape(), t.data.data()});
    r.pieces.push_back(ShardTensor{t.name, t.dtype, t.slice, {}});
  }
  r.written = write_safetensors_synced((partial / r.file).string(), views);
  return r;
}

// Every tensor once, with its pieces in rank order; refuses ranks that
// disagree on a tensor's dtype or global shape, and pieces that leave an
// element out or hold one twice (a later layout could not be assembled).
json::Value build_manifest(const CheckpointMeta& meta, const std::vector<RankReport>& reports) {
  json::Value files = json::Value::object();
  json::Value tensors = json::Value::array();
  struct Seen {
    size_t at;       // position in `tensors`
    int first_rank;  // the rank that described it first, and how
    DType dtype;
    std::vector<int64_t> global_shape;
    std::vector<std::pair<std::string, SliceSpec>> pieces;
  };
  std::map<std::string, Seen> seen;
  for (const RankReport& r : reports) {
    json::Value f = json::Value::object();
    f["bytes"] = r.written.bytes;
    f["crc32c"] = crc32c_hex(r.written.crc32c);
    files[r.file] = std::move(f);
    for (const ShardTensor& t : r.pieces) {
      auto [it, fresh] = seen.emplace(t.name, Seen{tensors.size(), r.rank, t.dtype, t.slice.global_shape, {}});
      if (fresh) {
        json::Value e = json::Value::object();
        e["name"] = t.name;
        e["dtype"] = dtype_name(t.dtype);
        e["global_shape"] = json::int_array(t.slice.global_shape);
        e["pieces"] = json::Value::array();
        tensors.push_back(std::move(e));
      }
      const Seen& first = it->second;
      if (first.dtype != t.dtype || first.global_shape != t.slice.global_shape)
        throw PiecesMismatch("checkpoint save: tensor \"" + t.name + "\": rank " + std::to_string(first.first_rank) +
                                 " saved it as " + dtype_name(first.dtype) + " " + shape_text(first.global_shape) +
                                 ", rank " + std::to_string(r.rank) + " as " + dtype_name(t.dtype) + " " +
                                 shape_text(t.slice.global_shape));
      json::Value& e = tensors[first.at];
      json::Value p = json::Value::object();
      p["rank"] = r.rank;
      p["file"] = r.file;
      put_slice(p, t.slice);
      e["pieces"].push_back(std::move(p));
      it->second.pieces.emplace_back("rank " + std::to_string(r.rank), t.slice);
    }
  }
  for (const auto& [name, s] : seen) {
    const std::string bad = cover_error(s.global_shape, s.pieces);
    if (!bad.empty()) throw PiecesMismatch("checkpoint save: tensor \"" + name + "\": " + bad);
  }

  json::Value m = json::Value::object();
  m["format"] = kFormatName;
  m["format_version"] = kFormatVersion;
  m["step"] = meta.step;
  m["tokens"] = meta.tokens;
  m["seed"] = meta.seed;
  m["optimizer_step"] = meta.optimizer_step;
  m["data_offset"] = meta.data_offset;
  m["world_size"] = meta.world_size;
  if (meta.nodes > 0) m["nodes"] = meta.nodes;
  m["layout"] = meta.layout;
  if (meta.identity.known()) {
    json::Value id = json::Value::object();
    id["id"] = meta.identity.id;
    id["model"] = meta.identity.model;
    id["data"] = meta.identity.data;
    json::Value lineage = json::Value::array();
    for (const std::string& l : meta.identity.lineage) lineage.push_back(l);
    id["lineage"] = std::move(lineage);
    m["run_identity"] = std::move(id);
  }
  if (!meta.verdict.empty()) m["verdict"] = meta.verdict;
  m["created"] = utc_now_iso8601();
  m["files"] = std::move(files);
  m["tensors"] = std::move(tensors);
  m["config_yaml"] = meta.config_yaml;
  return m;
}

void warn(const std::string& msg) { std::cerr << "checkpoint: " << msg << "\n"; }

// Deletes one old checkpoint: renamed out of the way first (and the rename
// made durable), so that a kill or a power cut while its files are removed
// leaves step_N.deleting, which no reader considers and the next prune
// finishes, never a step_N with some files gone. One that cannot even be
// renamed is kept, with a warning.
void retire(const fs::path& root, const fs::path& dir) {
  fs::path doomed = dir;
  doomed += kDeletingSuffix;
  std::error_code ec;
  fs::remove_all(doomed, ec);  // a leftover of the same step from an earlier kill
  if (std::rename(dir.c_str(), doomed.c_str()) != 0) {
    warn("could not rename old checkpoint " + dir.string() + " to " + doomed.string() + " for deletion: " +
         std::strerror(errno) + "; it is kept");
    return;
  }
  try {
    fsync_path(root.string(), true);
  } catch (const std::exception& e) {
    warn(std::string(e.what()) + " (after renaming " + dir.string() + " for deletion)");
  }
  maybe_inject_failure("prune", doomed.string());
  fs::remove_all(doomed, ec);
  if (ec) warn("could not remove old checkpoint " + doomed.string() + ": " + ec.message());
}

// Deletes leftovers of interrupted saves and deletions, and the complete
// checkpoints beyond keep_last. The one just written is always kept, even
// when older-looking steps exist from an earlier run, so a resume from an
// older checkpoint never deletes its own progress. Failures only warn: the
// save itself succeeded.
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
      if (suffix == kPartialSuffix || suffix == kReplacedSuffix || suffix == kDeletingSuffix) {
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
  try {
    for (size_t i = size_t(keep_last - 1); i < complete.size(); ++i) retire(root, complete[i].second);
  } catch (const std::exception& e) {
    // The test hook stands for a kill here: the rest of the pruning is not done.
    warn(std::string("pruning stopped: ") + e.what());
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
    maybe_inject_failure("publish", final_dir.string());
    rename_or_throw(partial, final_dir);
  } catch (...) {
    if (!aside.empty()) std::rename(aside.c_str(), final_dir.c_str());
    throw;
  }
  fsync_path(root.string(), true);

  const fs::path latest = root / kLatestName;
  maybe_inject_failure("latest", latest.string());
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
  maybe_inject_failure("prepare", p.partial.string());
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
  const fs::path manifest_path = p.partial / kManifestName;
  write_text_synced(manifest_path.string(), sealed_manifest_text(manifest));
  maybe_inject_failure("manifest", manifest_path.string());
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
    maybe_inject_failure("rank_file", (p.partial / local.file).string());
    finish(p, snap.meta, {std::move(local)});
  } catch (...) {
    remove_partial(p);
    throw;
  }
  prune(p.root, keep_last, p.name);
  return p.final_dir.string();
}

}  // namespace ckpt_detail

using namespace ckpt_detail;

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
    const Rendezvous rv{*group.store, group.rank, group.world_size, group.timeout_s, prefix, group.gone};
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
      trace::name_thread("checkpoint writer");
      try {
        const trace::Scope span("checkpoint", "write step", s.meta.step);
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

std::vector<std::string> set_aside_newer(const std::string& root, int64_t step) {
  std::vector<std::string> moved;
  for (const auto& [s, dir] : step_directories(root)) {
    if (s <= step) continue;
    std::string aside = dir + ckpt_detail::kSupersededSuffix;
    std::error_code ec;
    for (int k = 2; fs::exists(fs::symlink_status(aside, ec)); ++k)  // an earlier abandoned timeline's
      aside = dir + ckpt_detail::kSupersededSuffix + "-" + std::to_string(k);
    fs::rename(dir, aside, ec);
    if (ec) throw std::runtime_error("cannot set " + dir + " aside as " + aside + ": " + ec.message());
    moved.push_back(aside);
  }
  if (!moved.empty()) ckpt_detail::fsync_path(root, true);
  return moved;
}

}  // namespace trainer
