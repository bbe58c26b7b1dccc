#include "comm/store_secret.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "comm/sha256.h"
#include "comm/store.h"

namespace trainer {

namespace {

void put_part(std::string& out, std::string_view part) {
  const uint32_t n = uint32_t(part.size());
  for (int i = 0; i < 4; ++i) out.push_back(char((n >> (8 * i)) & 0xff));
  out.append(part);
}

}  // namespace

std::string store_secret_from_env() {
  const char* v = std::getenv(kStoreSecretEnv);
  return v ? std::string(v) : std::string();
}

std::string random_nonce() {
  std::string out(kStoreNonceBytes, '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::getrandom(out.data() + got, out.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw StoreError(std::string("store: cannot read random bytes for the secret handshake: ") + std::strerror(errno));
    got += size_t(n);
  }
  return out;
}

std::string store_proof(std::string_view secret, std::string_view role, std::string_view token,
                        std::string_view client_nonce, std::string_view server_nonce) {
  std::string msg = "trainer store secret v1";
  put_part(msg, role);
  put_part(msg, token);
  put_part(msg, client_nonce);
  put_part(msg, server_nonce);
  const Sha256Digest d = hmac_sha256(secret, msg);
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace trainer
