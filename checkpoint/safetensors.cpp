#include "checkpoint/safetensors.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace trainer {

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::string header = "{";
  size_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    if (t.device != Device::CPU) throw std::logic_error("write_safetensors: " + name + " is not on the host");
    header += (i ? "," : "");
    header += "\"" + name + "\":{\"dtype\":\"" + dtype_name(t.dtype) + "\",\"shape\":[";
    for (int d = 0; d < t.ndim; ++d) header += (d ? "," : "") + std::to_string(t.shape[d]);
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + t.nbytes()) + "]}";
    offset += t.nbytes();
  }
  header += "}";
  // Pad with spaces so the data starts 8-byte aligned (the format allows it).
  while ((header.size() + 8) % 8 != 0) header += ' ';

  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw std::runtime_error(tmp + ": cannot write: " + std::strerror(errno));
  uint64_t n = header.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = (unsigned char)(n >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, f) == 8 && std::fwrite(header.data(), 1, n, f) == n;
  for (const auto& [name, t] : tensors)
    ok = ok && std::fwrite(t.data, 1, t.nbytes(), f) == t.nbytes();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error(path + ": write failed: " + std::strerror(errno));
  }
}

}  // namespace trainer
