#include "interop/hf_files.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "checkpoint/safetensors.h"
#include "core/half_float.h"

namespace fs = std::filesystem;

namespace trainer {

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
  out.flush();
  if (!out) throw std::runtime_error(p.string() + ": cannot write");
}

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error(p.string() + ": cannot open");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string shard_name(size_t k, size_t n) {
  char b[64];
  std::snprintf(b, sizeof b, "model-%05zu-of-%05zu.safetensors", k + 1, n);
  return b;
}

}  // namespace

void write_hf_dir(const std::string& dir, const json::Value& config, const TensorMap& tensors, DType dtype,
                  uint64_t max_shard_bytes) {
  if (dtype != DType::F32 && dtype != DType::BF16)
    throw std::invalid_argument("write_hf_dir: dtype must be F32 or BF16");
  const fs::path out(dir), partial(dir + ".partial");
  if (fs::exists(out)) throw std::runtime_error(dir + ": exists; export writes a new directory (remove it or choose another)");
  fs::remove_all(partial);
  fs::create_directories(partial);
  const size_t esize = dtype_size(dtype);
  // Shards in name order, each closed before it would pass the limit.
  std::vector<std::vector<const TensorMap::value_type*>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const auto& kv : tensors) {
    const uint64_t bytes = uint64_t(kv.second.numel()) * esize;
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&kv);
    in_shard += bytes;
    total += bytes;
  }
  json::Value weight_map = json::Value::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string name = shards.size() == 1 ? "model.safetensors" : shard_name(k, shards.size());
    std::vector<std::vector<uint16_t>> halves;  // bf16 copies, alive until written
    std::vector<SafetensorsView> views;
    for (const auto* kv : shards[k]) {
      SafetensorsView v;
      v.name = kv->first;
      v.dtype = dtype;
      v.shape = kv->second.shape;
      if (dtype == DType::BF16) {
        halves.emplace_back(kv->second.data.size());
        for (size_t i = 0; i < kv->second.data.size(); ++i) halves.back()[i] = bf16_from_f32(kv->second.data[i]);
        v.data = halves.back().data();
      } else {
        v.data = kv->second.data.data();
      }
      views.push_back(std::move(v));
      weight_map[kv->first] = name;
    }
    // transformers refuses files without {"format": "pt"}.
    write_safetensors_synced((partial / name).string(), views, {{"format", "pt"}});
  }
  if (shards.size() > 1) {
    json::Value index;
    index["metadata"]["total_size"] = total;
    index["weight_map"] = weight_map;
    write_text(partial / "model.safetensors.index.json", json::dump(index, 2) + "\n");
  }
  write_text(partial / "config.json", json::dump(config, 2) + "\n");
  fs::rename(partial, out);
}

json::Value read_hf_config(const std::string& dir) {
  const fs::path d(dir);
  if (!fs::is_directory(d)) throw std::runtime_error(dir + ": not a directory (a Hugging Face model directory holds config.json and model.safetensors)");
  const fs::path cfg = d / "config.json";
  if (!fs::exists(cfg)) throw std::runtime_error(cfg.string() + ": missing (not a Hugging Face model directory?)");
  try {
    return json::parse(read_text(cfg));
  } catch (const json::ParseError& e) {
    throw std::runtime_error(cfg.string() + ": not valid JSON: " + e.what());
  }
}

TensorMap read_hf_tensors(const std::string& dir) {
  const fs::path d(dir);
  std::vector<fs::path> files;
  const fs::path index = d / "model.safetensors.index.json";
  if (fs::exists(index)) {
    json::Value ix;
    try {
      ix = json::parse(read_text(index));
    } catch (const json::ParseError& e) {
      throw std::runtime_error(index.string() + ": not valid JSON: " + e.what());
    }
    const json::Value* map = json::find(ix, "weight_map");
    if (!map || !map->is_object()) throw std::runtime_error(index.string() + ": no \"weight_map\" object");
    std::vector<std::string> names;
    for (const auto& [tensor, file] : map->items()) {
      if (!file.is_string()) throw std::runtime_error(index.string() + ": weight_map[" + tensor + "] is not a file name");
      const std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos) throw std::runtime_error(index.string() + ": shard name " + f + " has a '/'");
      if (std::find(names.begin(), names.end(), f) == names.end()) names.push_back(f);
    }
    for (const std::string& f : names) {
      if (!fs::exists(d / f)) throw std::runtime_error((d / f).string() + ": missing (named by " + index.string() + ")");
      files.push_back(d / f);
    }
  } else if (fs::exists(d / "model.safetensors")) {
    files.push_back(d / "model.safetensors");
  } else if (fs::exists(d / "pytorch_model.bin") || fs::exists(d / "pytorch_model.bin.index.json")) {
    throw std::runtime_error(dir + ": holds pytorch_model.bin (pickle), which is not read here: convert it with "
                             "model.save_pretrained(out, safe_serialization=True)");
  } else {
    throw std::runtime_error(dir + ": no model.safetensors or model.safetensors.index.json");
  }
  TensorMap out;
  for (const fs::path& f : files) {
    for (SafetensorsTensor& t : read_safetensors(f.string())) {
      if (out.count(t.name)) throw std::runtime_error(f.string() + ": tensor " + t.name + " appears in two files");
      HostTensor h;
      h.shape = t.shape;
      const size_t n = size_t(h.numel());
      h.data.resize(n);
      const auto* u16 = reinterpret_cast<const uint16_t*>(t.data.data());
      if (t.dtype == DType::F32) {
        // An empty tensor ([0, 3]) has no buffers: memcpy must not see their null pointers.
        if (n > 0) std::memcpy(h.data.data(), t.data.data(), n * 4);
      } else if (t.dtype == DType::BF16) {
        for (size_t i = 0; i < n; ++i) h.data[i] = f32_from_bf16(u16[i]);
      } else if (t.dtype == DType::F16) {
        for (size_t i = 0; i < n; ++i) h.data[i] = f32_from_f16(u16[i]);
      } else {
        throw std::runtime_error(f.string() + ": tensor " + t.name + " is " + dtype_name(t.dtype) +
                                 "; weights must be F32, BF16 or F16");
      }
      out[t.name] = std::move(h);
    }
  }
  return out;
}

}  // namespace trainer
