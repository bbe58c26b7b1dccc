// Wire format of the rendezvous store (comm/store.h), shared by server,
// client and the tests that feed the server garbage. Little-endian:
//
//   frame    = u32 body_length, body     (1 <= body_length <= kMaxFrameBytes)
//   string   = u32 length, bytes
//   keys     = u32 count, count x string
//   request  = u8 op, fields:
//     HELLO     u32 magic, u32 version, string token, string client_nonce
//               (must be first, only first; the nonce is empty when the
//               client has no secret, else kStoreNonceBytes)
//     AUTH      string proof   (only right after a CHALLENGE; comm/store_secret.h)
//     SET       string key, string value
//     GET       string key, i64 timeout_ms
//     ADD       string key, i64 delta
//     CHECK     keys
//     WAIT      keys, i64 timeout_ms
//     DEL       string key
//     MULTI_GET keys
//   reply    = u8 status, fields:
//     OK        GET: string value; ADD: i64; CHECK, DEL: u8; MULTI_GET: u32 n,
//               n x (u8 present [, string value, i64 age_ms]); others nothing
//     ERROR     string message             (the request failed; connection stays)
//     TIMEOUT   u32 missing, keys          (missing count, first few of them)
//     REJECTED  nothing                    (wrong token; the server closes)
//     REFUSED   string message             (no or wrong secret; the server closes)
//     CHALLENGE string server_nonce        (HELLO to a server with a secret)
//
// A server without a secret answers HELLO with OK. One with a secret answers
// a HELLO that has a nonce with CHALLENGE, then the AUTH with OK + string
// server_proof or REFUSED; a HELLO without a nonce with REFUSED. A client
// with a secret refuses an OK to its HELLO (the server does not check) and
// a server proof that does not match.
//
// timeout_ms < 0 waits forever, 0 checks once. One reply per request, in
// order. Keys must be 1..kMaxKeyBytes long; anything that does not parse
// exactly (short, trailing bytes, over a limit, unknown op) closes the
// connection. Before HELLO succeeds, frames are capped at kMaxHelloFrameBytes
// so that an unauthenticated peer cannot make the server allocate much.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comm/store.h"

namespace trainer::store_wire {

inline constexpr uint32_t kMagic = 0x54535452;  // "RTST" on the wire
inline constexpr uint32_t kVersion = 2;  // 2: the client nonce in HELLO, AUTH
inline constexpr size_t kMaxKeyBytes = kStoreMaxKeyBytes;
inline constexpr size_t kMaxValueBytes = kStoreMaxValueBytes;
inline constexpr size_t kMaxTokenBytes = 4096;
inline constexpr size_t kMaxFrameBytes = kMaxValueBytes + 64 * 1024;
inline constexpr size_t kMaxHelloFrameBytes = kMaxTokenBytes + 128;  // HELLO and AUTH
inline constexpr size_t kMaxTimeoutKeysListed = 32;

enum class Op : uint8_t { Hello = 1, Set, Get, Add, Check, Wait, Del, MultiGet, Auth };
enum class Status : uint8_t { Ok = 0, Error = 1, Timeout = 2, Rejected = 3, Refused = 4, Challenge = 5 };

// Builds one frame; the length prefix is filled in by frame().
class Writer {
 public:
  Writer() : buf_(4, '\0') {}
  Writer& u8(uint8_t v);
  Writer& u32(uint32_t v);
  Writer& i64(int64_t v);
  Writer& str(std::string_view s);
  Writer& keys(const std::vector<std::string>& ks);
  std::string frame() &&;

 private:
  std::string buf_;
};

// Bounds-checked reading of one body; every getter returns false instead of
// reading past the end or accepting a string longer than `max`.
class Reader {
 public:
  explicit Reader(std::string_view body) : rest_(body) {}
  bool u8(uint8_t* v);
  bool u32(uint32_t* v);
  bool i64(int64_t* v);
  bool str(std::string* out, size_t max);
  // A key list of at most `max_count` keys, each 1..kMaxKeyBytes.
  bool keys(std::vector<std::string>* out, size_t max_count);
  bool key(std::string* out);  // 1..kMaxKeyBytes
  bool done() const { return rest_.empty(); }

 private:
  std::string_view rest_;
};

uint32_t load_u32(const char* p);

// Seconds as the client passes them -> timeout_ms on the wire.
int64_t timeout_to_ms(double timeout_s);

// "30", "0.5", "2.25": seconds as the error messages print them.
std::string format_seconds(double s);

// A key for an error message: quoted, non-printable bytes escaped, shortened.
std::string quote_key(std::string_view key);

// Resolves an IPv4 address ("" and "0.0.0.0" -> any). Returns false with a
// reason in *error.
bool resolve_ipv4(const std::string& host, int port, sockaddr_in* out, std::string* error);

std::string errno_text(int err);

}  // namespace trainer::store_wire
