#include "comm/store_protocol.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace trainer::store_wire {

Writer& Writer::u8(uint8_t v) {
  buf_.push_back(static_cast<char>(v));
  return *this;
}

Writer& Writer::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return *this;
}

Writer& Writer::i64(int64_t v) {
  const uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  return *this;
}

Writer& Writer::str(std::string_view s) {
  u32(static_cast<uint32_t>(s.size()));
  buf_.append(s);
  return *this;
}

Writer& Writer::keys(const std::vector<std::string>& ks) {
  u32(static_cast<uint32_t>(ks.size()));
  for (const auto& k : ks) str(k);
  return *this;
}

std::string Writer::frame() && {
  const uint32_t n = static_cast<uint32_t>(buf_.size() - 4);
  for (int i = 0; i < 4; ++i) buf_[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return std::move(buf_);
}

uint32_t load_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

bool Reader::u8(uint8_t* v) {
  if (rest_.empty()) return false;
  *v = static_cast<uint8_t>(rest_[0]);
  rest_.remove_prefix(1);
  return true;
}

bool Reader::u32(uint32_t* v) {
  if (rest_.size() < 4) return false;
  *v = load_u32(rest_.data());
  rest_.remove_prefix(4);
  return true;
}

bool Reader::i64(int64_t* v) {
  if (rest_.size() < 8) return false;
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(static_cast<unsigned char>(rest_[i])) << (8 * i);
  *v = static_cast<int64_t>(u);
  rest_.remove_prefix(8);
  return true;
}

bool Reader::str(std::string* out, size_t max) {
  uint32_t n = 0;
  if (!u32(&n) || n > max || n > rest_.size()) return false;
  out->assign(rest_.data(), n);
  rest_.remove_prefix(n);
  return true;
}

bool Reader::key(std::string* out) { return str(out, kMaxKeyBytes) && !out->empty(); }

bool Reader::keys(std::vector<std::string>* out, size_t max_count) {
  uint32_t n = 0;
  if (!u32(&n) || n > max_count) return false;
  // Each key takes at least 5 bytes on the wire: a count larger than the
  // body could hold is rejected before reserving anything for it.
  if (n > rest_.size() / 5) return false;
  out->clear();
  out->reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    std::string k;
    if (!key(&k)) return false;
    out->push_back(std::move(k));
  }
  return true;
}

int64_t timeout_to_ms(double timeout_s) {
  if (std::isnan(timeout_s) || timeout_s <= 0) return 0;
  // Beyond ~30 years is "forever"; also keeps the conversion in range.
  if (!std::isfinite(timeout_s) || timeout_s > 1e9) return -1;
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(timeout_s * 1000.0)));
}

std::string format_seconds(double s) {
  char buf[64];
  if (!std::isfinite(s)) return "infinite";
  if (s == std::floor(s) && std::fabs(s) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", s);
    return buf;
  }
  std::snprintf(buf, sizeof(buf), "%.3f", s);
  std::string r = buf;
  while (!r.empty() && r.back() == '0') r.pop_back();
  if (!r.empty() && r.back() == '.') r.pop_back();
  return r;
}

std::string quote_key(std::string_view key) {
  constexpr size_t kShown = 200;
  std::string r = "'";
  for (size_t i = 0; i < key.size() && i < kShown; ++i) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      r.push_back(static_cast<char>(c));
    } else {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\x%02x", c);
      r += esc;
    }
  }
  if (key.size() > kShown) r += "...(" + std::to_string(key.size()) + " bytes)";
  r += "'";
  return r;
}

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer, which may not be buf.
  const char* msg = strerror_r(err, buf, sizeof(buf));
  return msg ? std::string(msg) : std::string("errno ") + std::to_string(err);
}

bool resolve_ipv4(const std::string& host, int port, sockaddr_in* out, std::string* error) {
  if (port < 0 || port > 65535) {
    *error = "port " + std::to_string(port) + " is out of range";
    return false;
  }
  std::memset(out, 0, sizeof(*out));
  out->sin_family = AF_INET;
  out->sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "0.0.0.0") {
    out->sin_addr.s_addr = htonl(INADDR_ANY);
    return true;
  }
  if (inet_pton(AF_INET, host.c_str(), &out->sin_addr) == 1) return true;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    *error = "cannot resolve host '" + host + "' to an IPv4 address: " + gai_strerror(rc);
    if (res) freeaddrinfo(res);
    return false;
  }
  out->sin_addr = reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return true;
}

}  // namespace trainer::store_wire
