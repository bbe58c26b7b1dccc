// The JSON files of a Hugging Face model directory (model.init_from):
// config.json as read_hf_config parses it and review_hf_config judges it key
// by key against a model configuration, adopt_init_from_settings' look at
// it, and model.safetensors.index.json as read_hf_tensors follows it. Each
// reader takes the directory, so the input is written there under both
// names (a corpus file is one or the other; a mix is fine too).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "config/config.h"
#include "interop/hf_config_check.h"
#include "interop/hf_files.h"
#include "interop/hf_import.h"
#include "fuzz_files.h"

namespace {

const std::string& work_dir() { return fuzz::work_dir("hf_config"); }
using fuzz::write_file;

// Which keys are understood, compared or refused depends on the
// architecture the run's model maps to: one configuration of each, loaded
// the way a run loads its YAML.
std::vector<trainer::Config> model_configs() {
  const std::string data = "data: {train: [train.bin]}\nmodel: {init_from: " + work_dir() + ", ";
  std::vector<trainer::Config> out;
  for (const char* model : {
           "arch: llama, n_kv_heads: 2}",                                               // LlamaForCausalLM
           "arch: gpt2}",                                                               // GPT2LMHeadModel
           "arch: llama, moe: {num_experts: 4, top_k: 2}}",                             // MixtralForCausalLM
           "arch: llama, sliding_window: 16}",                                          // MistralForCausalLM
           "arch: llama, attn_bias: qkv, rope_scaling: {type: linear, factor: 2.0}}",  // Qwen2ForCausalLM
       })
    out.push_back(trainer::load_config_text(data + model, "fuzz.yaml", {}, 1));
  return out;
}

// A shard for the corpus's index files to name, so that following one
// reaches the tensors.
bool write_shard() {
  const std::vector<float> w(6, 0.5f);
  trainer::write_safetensors_synced(work_dir() + "/model-00001-of-00001.safetensors",
                                    {{"model.norm.weight", trainer::DType::F32, {6}, w.data()}});
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<trainer::Config> configs = model_configs();
  static const bool shard = write_shard();
  (void)shard;
  const std::string& dir = work_dir();
  write_file(dir + "/config.json", data, size);
  write_file(dir + "/model.safetensors.index.json", data, size);

  trainer::Config c = configs[size % configs.size()];
  try {
    trainer::adopt_init_from_settings(c);  // main() calls it before anything else reads the directory
    const trainer::json::Value hf = trainer::read_hf_config(dir);
    trainer::review_hf_config(c, hf);
  } catch (const std::exception&) {
    // Not JSON (runtime_error naming config.json), or a ConfigError.
  }
  try {
    trainer::read_hf_tensors(dir);
  } catch (const std::exception&) {
  }
  return 0;
}
