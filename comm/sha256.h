// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the store's secret
// handshake (comm/store_secret.h): enough to prove knowledge of a shared
// secret without sending it. Not a general crypto library: no streaming
// interface, no constant-time guarantees beyond what the handshake needs.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace trainer {

using Sha256Digest = std::array<uint8_t, 32>;

Sha256Digest sha256(std::string_view data);
Sha256Digest hmac_sha256(std::string_view key, std::string_view message);

// Lowercase hex, for tests and logs.
std::string to_hex(const Sha256Digest& d);

}  // namespace trainer
