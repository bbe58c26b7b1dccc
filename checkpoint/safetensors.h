// The safetensors container: 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}}, then the raw tensor bytes.
// Readable by the Python reference without any extra package.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace trainer {

// Writes host tensors to `path` via a temporary file and rename, so a reader
// never sees a half-written file. Throws std::runtime_error naming the file.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors);

// A tensor to write, for callers whose data is not a `Tensor` (any number of
// dimensions, bytes owned elsewhere). `data` holds numel(shape) elements.
struct SafetensorsView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

struct WrittenFile {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;  // of the whole file, computed from the bytes written
};

// The header's optional "__metadata__" string map (Hugging Face's loader
// wants {"format": "pt"}).
using SafetensorsMetadata = std::vector<std::pair<std::string, std::string>>;

// Writes straight to `path` (no temporary + rename: a checkpoint's .partial
// directory is already the unit that becomes visible atomically) and fsyncs
// the file before returning. Throws std::runtime_error naming the file.
WrittenFile write_safetensors_synced(const std::string& path, const std::vector<SafetensorsView>& tensors,
                                     const SafetensorsMetadata& metadata = {});

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<char> data;
};

// Reads and validates a whole file: header length against the file size, the
// header JSON, every dtype, shape and data_offsets; tensors must tile the data
// area exactly (contiguous, no overlap, no gap, no trailing bytes), each
// holding numel * dtype size bytes. Tensors come back in file order;
// "__metadata__" is skipped. Throws std::runtime_error starting with the path.
std::vector<SafetensorsTensor> read_safetensors(const std::string& path);

// "F32" -> DType::F32 etc. (the spellings dtype_name produces); nullopt otherwise.
std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace trainer
