// CRC32C (Castagnoli polynomial, as in iSCSI, ext4 and Snappy framing): the
// checksum stored for every checkpoint file in its manifest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace trainer {

// Continues a CRC: crc32c(b, nb, crc32c(a, na)) equals the CRC of a followed by
// b, so a file can be checksummed while it is written. Start with 0.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// CRC of a whole file, read in blocks; `bytes` (if given) receives its size.
// Throws std::runtime_error naming the file when it cannot be read.
uint32_t crc32c_file(const std::string& path, uint64_t* bytes = nullptr);

// Eight lowercase hex digits, most significant first: "e3069283".
std::string crc32c_hex(uint32_t crc);

}  // namespace trainer
