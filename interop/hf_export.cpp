#include "interop/hf_export.h"

#include <cctype>
#include <optional>

#include "checkpoint/checkpoint.h"
#include "interop/hf_files.h"
#include "interop/hf_format.h"
#include "config/config.h"
#include "model/dims.h"
#include "model/params.h"
#include "data/tokenizer.h"
#include "interop/hf_tokenizer_export.h"
#include "interop/run_tokenizer.h"

namespace trainer {

uint64_t parse_size(const std::string& text, const std::string& flag) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw ConfigError(flag + "=" + text + ": not a size (e.g. 5GB, 200MB, 64KiB)");
  }
  std::string unit = text.substr(used);
  for (char& ch : unit) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  const std::pair<const char*, double> units[] = {{"", 1},          {"B", 1},          {"KB", 1e3},
                                                  {"MB", 1e6},      {"GB", 1e9},       {"TB", 1e12},
                                                  {"KIB", 1024.0},  {"MIB", 1048576.0}, {"GIB", 1073741824.0}};
  for (const auto& [u, scale] : units)
    if (unit == u && v > 0) return uint64_t(v * scale);
  throw ConfigError(flag + "=" + text + ": not a positive size (units B, KB, MB, GB, TB, KiB, MiB, GiB)");
}

std::string export_to_hf(const ExportOptions& opt) {
  if (opt.out.empty()) throw ConfigError("trainer export needs --out DIR");
  const std::string dir = checkpoint_directory(opt.checkpoint, "--checkpoint");
  const LoadedCheckpoint ck = load_checkpoint(dir);
  const Config c = load_config_text(ck.meta.config_yaml, dir + "/manifest.json", {}, ck.meta.world_size);
  const std::string arch = hf_architecture(c);
  const ModelDims d = make_dims(c, 1, 1);
  const SliceAssembler pieces(ck);
  TensorMap ours;
  for (const ParamInfo& p : parameter_list(d, c.model.init_std)) {
    HostTensor t;
    t.shape = p.spec.shape;
    t.data.resize(size_t(p.spec.numel()));
    pieces.fill("model/" + p.spec.name, DType::F32, SliceSpec::whole(p.spec.shape), t.data.data());
    ours[p.spec.name] = std::move(t);
  }
  const TensorMap theirs = to_hf(c, ours);
  std::optional<TokenizerExport> tokenizer;
  if (const auto files = saved_tokenizer_files(c, dir)) tokenizer = plan_tokenizer_export(*files);
  write_hf_dir(opt.out, hf_config(c, opt.dtype == DType::BF16 ? "bfloat16" : "float32"), theirs, opt.dtype,
               opt.max_shard_bytes);
  std::string report = "exported " + dir + " (step " + std::to_string(ck.meta.step) + ", layout " + ck.meta.layout +
                       ") -> " + opt.out + ": " + arch + ", " + std::to_string(theirs.size()) + " tensors, " +
                       dtype_name(opt.dtype) + "\n";
  if (tokenizer) {
    write_tokenizer_export(*tokenizer, opt.out);
    report += tokenizer->report;
  } else {
    report += "  tokenizer: none recorded with the run (no tokenizer files written)\n";
  }
  if (c.model.moe.num_experts > 0 && c.model.moe.capacity_factor > 0)
    report += "  note: trained with model.moe.capacity_factor=" + std::to_string(c.model.moe.capacity_factor) +
              " (tokens over an expert's capacity skipped it); Mixtral routes every token, so its outputs differ "
              "where tokens were dropped\n";
  return report;
}

}  // namespace trainer
