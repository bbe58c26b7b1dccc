#include "train/run_identity.h"

#include <algorithm>

#include "config/config_schema.h"
#include "core/fnv1a.h"

namespace trainer {

namespace {

// The keys that choose the function the weights compute, not their start.
bool model_key(std::string_view path) {
  return path.rfind("model.", 0) == 0 && path != "model.init_from" && path != "model.init_std";
}

std::string model_fingerprint(const Config& cfg) {
  uint64_t h = kFnv1aStart;
  for (const KeySpec& k : config_schema())
    if (model_key(k.path)) h = fnv1a(std::string(k.path) + "=" + value_yaml(k, cfg) + "\n", h);
  return hex64(h);
}

std::string data_fingerprint(const Config& cfg, const BatchSampler& train) {
  uint64_t h = fnv1a("dtype=" + cfg.data.dtype + "\n");
  for (const BatchSampler::Entry& e : train.entries()) {
    h = fnv1a("entry weight=" + std::to_string(e.weight) + "\n", h);
    for (const auto& f : e.files)
      for (const FileStamp& s : f->stamps())
        h = fnv1a("file " + std::to_string(s.size) + " " + hex64(s.sample) + "\n", h);
  }
  return hex64(h);
}

}  // namespace

RunIdentity run_identity(const Config& cfg, const BatchSampler& train) {
  RunIdentity id;
  id.model = model_fingerprint(cfg);
  id.data = data_fingerprint(cfg, train);
  id.id = hex64(fnv1a("seed " + std::to_string(cfg.run.seed) + " model " + id.model + " data " + id.data));
  return id;
}

std::string foreign_difference(const RunIdentity& ours, uint64_t our_seed, const CheckpointMeta& saved) {
  const RunIdentity& theirs = saved.identity;
  if (!theirs.known() || theirs.id == ours.id) return "";
  if (std::find(ours.lineage.begin(), ours.lineage.end(), theirs.id) != ours.lineage.end()) return "";
  std::vector<std::string> parts;
  if (saved.seed != our_seed)
    parts.push_back("seed " + std::to_string(saved.seed) + " (this run: " + std::to_string(our_seed) + ")");
  if (theirs.model != ours.model) parts.push_back("the model (model.* keys)");
  if (theirs.data != ours.data) parts.push_back("the training data (data.train files, their sizes or contents)");
  if (parts.empty()) parts.push_back("run id " + theirs.id + " (this run: " + ours.id + ")");
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? "; " : "") + parts[i];
  return s;
}

void adopt_lineage(RunIdentity& ours, const RunIdentity& saved) {
  if (!saved.known() || saved.id == ours.id) return;
  auto add = [&](const std::string& id) {
    if (id == ours.id || std::find(ours.lineage.begin(), ours.lineage.end(), id) != ours.lineage.end()) return;
    ours.lineage.push_back(id);
  };
  for (const std::string& l : saved.lineage) add(l);
  add(saved.id);
  if (ours.lineage.size() > kMaxLineage)
    ours.lineage.erase(ours.lineage.begin(), ours.lineage.end() - std::ptrdiff_t(kMaxLineage));
}

void check_checkpoint_root(const Config& cfg, const std::string& root, RunIdentity& ours,
                           std::vector<std::string>* notes) {
  std::vector<std::pair<std::string, CheckpointMeta>> all, foreign;
  for (const auto& [step, dir] : step_directories(root)) {
    try {
      all.emplace_back(dir, read_checkpoint_meta(dir));
    } catch (const std::exception&) {
      // damaged: resume reports it if it comes to it
    }
  }
  // Our own checkpoints carry the lineage of the runs we continued.
  for (const auto& [dir, meta] : all)
    if (meta.identity.id == ours.id)
      for (const std::string& l : meta.identity.lineage) adopt_lineage(ours, RunIdentity{l, "", "", {}});
  for (auto& [dir, meta] : all)
    if (!foreign_difference(ours, cfg.run.seed, meta).empty()) foreign.emplace_back(dir, std::move(meta));
  if (foreign.empty()) return;
  if (cfg.checkpoint.load_foreign) {
    for (const auto& [dir, meta] : foreign) {
      if (notes)
        notes->push_back("checkpoint: " + dir + " was written by another run (" +
                         foreign_difference(ours, cfg.run.seed, meta) +
                         "); taken as this run's (checkpoint.load_foreign: true)");
    }
    for (const auto& [dir, meta] : foreign) adopt_lineage(ours, meta.identity);
    return;
  }
  std::string list;
  for (size_t i = 0; i < foreign.size() && i < 3; ++i)
    list += "\n  " + foreign[i].first + ": " + foreign[i].second.identity.id + " differs in " +
            foreign_difference(ours, cfg.run.seed, foreign[i].second);
  if (foreign.size() > 3) list += "\n  and " + std::to_string(foreign.size() - 3) + " more";
  throw ConfigError("checkpoint.dir " + root + " holds " + std::to_string(foreign.size()) +
                    " checkpoint(s) of another run (this run is " + ours.id + "):" + list +
                    "\nresuming them would continue that run's state, and this run's saves would rotate them away. "
                    "Give this run its own checkpoint.dir (it may still start from one of them: checkpoint.resume: "
                    "PATH), or, to continue that run here on purpose, set checkpoint.load_foreign: true");
}

}  // namespace trainer
