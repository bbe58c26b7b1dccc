// Reading and writing Hugging Face model directories: config.json plus
// model.safetensors, or shards model-0000K-of-0000N.safetensors with
// model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map":
// {tensor: file}}) past a size limit, as save_pretrained writes them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "interop/hf_format.h"
#include "core/tensor.h"

namespace trainer {

// Writes into DIR.partial and renames it to DIR when complete, so a reader
// never sees half a model; refuses a DIR that exists (nothing is
// overwritten). dtype: F32 or BF16 (rounded to nearest even). Tensors go to
// shards of at most max_shard_bytes each (a bigger tensor gets its own).
void write_hf_dir(const std::string& dir, const json::Value& config, const TensorMap& tensors, DType dtype,
                  uint64_t max_shard_bytes);

// config.json alone. Throws std::runtime_error naming the file: not a
// directory, no config.json, not valid JSON.
json::Value read_hf_config(const std::string& dir);

// Every tensor, converted to fp32 (F32, BF16 or F16 files); config.json is
// read_hf_config's. Throws std::runtime_error naming the file: no
// safetensors (a pytorch_model.bin is named with the way to convert it), a
// shard the index names that is missing, a damaged file.
TensorMap read_hf_tensors(const std::string& dir);

// A file of the output directory, whole; throws naming it when it cannot be written.
void write_text(const std::filesystem::path& p, const std::string& text);

}  // namespace trainer
