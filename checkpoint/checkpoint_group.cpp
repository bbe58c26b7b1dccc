// Saving a checkpoint together with other ranks (the protocol in
// checkpoint.h): every rank writes its own file into step_N.partial, reports
// it through the store as JSON, and rank 0 publishes only when every report
// is a success. The single-process save and the steps both share are in
// checkpoint_writer.cpp.
#include <chrono>
#include <filesystem>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_save.h"
#include "checkpoint/fault_injection.h"
#include "checkpoint/slice_json.h"
#include "checkpoint/strict_json.h"
#include "comm/store.h"

namespace trainer::ckpt_detail {

namespace fs = std::filesystem;

namespace {

json::Value piece_to_json(const ShardTensor& t) {
  json::Value s = json::Value::object();
  s["name"] = t.name;
  s["dtype"] = dtype_name(t.dtype);
  s["global_shape"] = json::int_array(t.slice.global_shape);
  put_slice(s, t.slice);
  return s;
}

ShardTensor piece_from_json(const json::Value& s) {
  ShardTensor t;
  t.name = json::as_string(json::at(s, "name"));
  const std::string& dt = json::as_string(json::at(s, "dtype"));
  const auto dtype = dtype_from_name(dt);
  if (!dtype) throw json::TypeError("tensor \"" + t.name + "\" has unknown dtype \"" + dt + "\"");
  t.dtype = *dtype;
  try {
    t.slice = get_slice(s, json::as_int64_list(json::at(s, "global_shape")));
  } catch (const json::TypeError& e) {
    throw json::TypeError("tensor \"" + t.name + "\": " + e.what());
  }
  return t;
}

std::string encode_report(const RankReport& r) {
  json::Value v = json::Value::object();
  v["rank"] = r.rank;
  v["file"] = r.file;
  v["bytes"] = r.written.bytes;
  v["crc32c"] = r.written.crc32c;
  json::Value pieces = json::Value::array();
  for (const ShardTensor& t : r.pieces) pieces.push_back(piece_to_json(t));
  v["pieces"] = std::move(pieces);
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
    const int64_t claimed = json::as_int64(json::at(v, "rank"));
    if (claimed != rank) throw json::TypeError("it claims to come from rank " + std::to_string(claimed));
    if (const json::Value* e = json::find(v, "error")) {
      out.error = json::as_string(*e).empty() ? "(no message)" : json::as_string(*e);
      return out;
    }
    RankReport r;
    r.rank = rank;
    r.file = json::as_string(json::at(v, "file"));
    // The name becomes a path inside the checkpoint: only the expected one will do.
    if (r.file != rank_file_name(rank)) throw json::TypeError("unexpected file name \"" + r.file + "\"");
    r.written.bytes = json::as_uint64(json::at(v, "bytes"));
    const uint64_t crc = json::as_uint64(json::at(v, "crc32c"));
    if (crc > UINT32_MAX) throw json::TypeError("crc32c " + std::to_string(crc) + " is out of range");
    r.written.crc32c = uint32_t(crc);
    for (const auto& s : json::as_array(json::at(v, "pieces"))) r.pieces.push_back(piece_from_json(s));
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

// A wait that ended before its key came: the deadline passed, or the rank
// that was to set it is gone (`gone` says how).
struct WaitResult {
  std::optional<std::string> value;
  std::string gone;
};

// How often a wait asks whether the ranks it waits on are alive: about the
// watchdog's heartbeat interval, so a dead rank is noticed within the
// heartbeat staleness (a few seconds) plus this.
constexpr double kLivenessEveryS = 1.0;

// The key's value, or why not: the deadline passed, or `waiting_on` (the
// ranks that set it) are gone according to rv.gone.
WaitResult get_before(const Rendezvous& rv, const std::string& key, Clock::time_point deadline,
                      const std::vector<int>& waiting_on) {
  Clock::time_point next_check = deadline_after(kLivenessEveryS);
  for (;;) {
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    try {
      return {rv.store.get(key, std::clamp(left, 0.0, kStoreWaitSliceS)), ""};  // 0: one last look
    } catch (const StoreTimeout&) {
      if (left <= 0) return {};
    }
    if (rv.gone && Clock::now() >= next_check) {
      next_check = deadline_after(kLivenessEveryS);
      std::string why = rv.gone(waiting_on);
      if (!why.empty()) {
        // It may have set the key just before it went.
        try {
          return {rv.store.get(key, 0.0), ""};
        } catch (const StoreTimeout&) {
        }
        return {std::nullopt, std::move(why)};
      }
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
    WaitResult w = get_before(rv, rv.report(r), deadline, {r});
    if (!w.gone.empty()) {
      // Its report will never come, and the checkpoint cannot be complete:
      // the other ranks' reports are not worth waiting for.
      fail("rank " + std::to_string(r) + " is gone (" + w.gone + ") before it reported its file in " +
           p.partial.string());
      g.all_arrived = false;
      return g;
    }
    if (!w.value) {
      missing.push_back(r);
      continue;
    }
    forget_keys(rv.store, {rv.report(r)});  // rank 0 is its only reader
    take(r, decode_report(*w.value, r));
  }
  g.all_arrived = missing.empty();
  if (!missing.empty())
    fail("rank 0 waited " + seconds_str(rv.timeout_s) + " s for the reports of " + ranks_str(missing) + " (of " +
         std::to_string(rv.world) + ") on " + p.partial.string() +
         "; they never came (did every rank call save() for step " + std::to_string(step) + "?)");
  return g;
}

}  // namespace

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
    maybe_inject_failure("rank_file", (p.partial / own.report->file).string());
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
    // Failures of other ranks or of the layout as a whole are not rank 0's.
    const bool not_rank0 = dynamic_cast<const RankFailures*>(&e) || dynamic_cast<const PiecesMismatch*>(&e);
    const std::string msg = failed + (not_rank0 ? "" : "rank 0 failed: ") + e.what();
    set_quietly(rv.store, rv.outcome(), "failed: " + msg);
    throw std::runtime_error(msg);
  }
  rv.store.set(rv.outcome(), "done");
  prune(p.root, keep_last, p.name);
  return p.final_dir.string();
}

namespace {

// Rank 0's announcement of a failure, to be rethrown as it is worded.
struct RankZeroFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Waits until rank 0 created step_N.partial.
void wait_for_directory(const Rendezvous& rv, const SavePaths& p, int64_t step) {
  const WaitResult w = get_before(rv, rv.ready(), deadline_after(rv.timeout_s), {0});
  if (!w.gone.empty())
    throw std::runtime_error("checkpoint save of " + p.final_dir.string() + ": rank 0 is gone (" + w.gone +
                             ") before it created " + p.partial.string());
  const std::optional<std::string>& v = w.value;
  if (!v)
    throw std::runtime_error("waited " + seconds_str(rv.timeout_s) + " s for rank 0 to create " + p.partial.string() +
                             " (store key '" + rv.ready() + "'); rank 0 never announced it (did it call save() for step " +
                             std::to_string(step) + "?)");
  if (*v != "ok") throw RankZeroFailed(v->rfind("failed: ", 0) == 0 ? v->substr(8) : *v);
}

// Rank 0's verdict; returns only when the checkpoint was published.
void wait_for_outcome(const Rendezvous& rv, const SavePaths& p) {
  // Rank 0 may itself wait timeout_s for the slowest rank before deciding.
  const WaitResult w = get_before(rv, rv.outcome(), deadline_after(2 * rv.timeout_s), {0});
  if (!w.gone.empty())
    throw std::runtime_error("checkpoint save of " + p.final_dir.string() + ": rank 0 is gone (" + w.gone +
                             ") before it announced the verdict; the checkpoint may or may not have been published");
  const std::optional<std::string>& v = w.value;
  if (!v)
    throw std::runtime_error("checkpoint save of " + p.final_dir.string() + ": rank " + std::to_string(rv.rank) +
                             " wrote its file but heard no verdict from rank 0 within " +
                             seconds_str(2 * rv.timeout_s) + " s (store key '" + rv.outcome() +
                             "'); the checkpoint may or may not have been published");
  if (*v == "done") return;
  throw std::runtime_error(v->rfind("failed: ", 0) == 0 ? v->substr(8) : *v);
}

}  // namespace

// Any rank but 0: writes its file into the directory rank 0 prepared, reports
// it (or its error), and succeeds only if rank 0 then published the checkpoint.
std::string save_as_other_rank(const Rendezvous& rv, const SavePaths& p, Snapshot& snap) {
  RankReport report;
  try {
    check_group_snapshot(snap, rv);
    validate_snapshot(snap);
    wait_for_directory(rv, p, snap.meta.step);
    report = write_rank_file(p.partial, snap);
    maybe_inject_failure("rank_file", (p.partial / report.file).string());
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

}  // namespace trainer::ckpt_detail
