// The safetensors container: 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}}, then the raw tensor bytes.
// Readable by the Python reference without any extra package.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kernels/tensor.h"

namespace trainer {

// Writes host tensors to `path` via a temporary file and rename, so a reader
// never sees a half-written file. Throws std::runtime_error naming the file.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors);

}  // namespace trainer
