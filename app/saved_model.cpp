#include "app/saved_model.h"

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "model/sharding.h"

namespace trainer {

namespace fs = std::filesystem;

namespace {

// A step directory, or a checkpoint root whose `latest` names one.
std::string step_directory(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw std::runtime_error("--checkpoint " + dir + ": no such directory");
  if (fs::exists(fs::path(dir) / "manifest.json", ec)) return dir;
  std::ifstream latest(fs::path(dir) / "latest");
  std::string name;
  if (latest && std::getline(latest, name) && !name.empty()) return (fs::path(dir) / name).string();
  throw std::runtime_error("--checkpoint " + dir + ": not a checkpoint (no manifest.json, no `latest` file)");
}

// Every parameter whole, in parameter_list order of the one-process plan.
std::vector<std::vector<float>> full_weights(const LoadedCheckpoint& ck, const ModelDims& dims, double init_std) {
  const SliceAssembler assemble(ck);
  std::vector<std::vector<float>> w;
  for (const ParamInfo& p : single_plan(dims, init_std).params) {
    const SliceSpec want = SliceSpec::whole(p.global_shape);
    w.emplace_back(size_t(want.numel()));
    assemble.fill("model/" + p.spec.name, DType::F32, want, w.back().data());
  }
  return w;
}

}  // namespace

SavedModel load_saved_model(const std::string& checkpoint) {
  SavedModel m;
  m.dir = step_directory(checkpoint);
  m.ck = load_checkpoint(m.dir);  // verifies every file: a corrupt one throws naming it
  try {
    // Validated against the layout it was saved from, not this process.
    m.cfg = load_config_text(m.ck.meta.config_yaml, m.dir + "/manifest.json (config_yaml)", {}, m.ck.meta.world_size);
  } catch (const ConfigError& e) {
    throw std::runtime_error(std::string("the checkpoint's saved configuration does not load: ") + e.what());
  }
  m.dims = make_dims(m.cfg, 1, m.cfg.train.seq_len, DType::F32);
  m.weights = full_weights(m.ck, m.dims, m.cfg.model.init_std);
  return m;
}

}  // namespace trainer
