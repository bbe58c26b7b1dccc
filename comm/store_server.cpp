// The store server: one thread, one epoll loop, non-blocking sockets with a
// read and a write buffer per connection. Waits (GET, WAIT) park the
// connection on the keys it needs; a SET or ADD of such a key answers it, a
// deadline set answers it with TIMEOUT. Nothing a peer sends can throw out
// of the loop or grow memory beyond one capped frame per connection.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "comm/store.h"
#include "comm/store_protocol.h"
#include "comm/store_secret.h"

namespace trainer {

using namespace store_wire;

namespace {

using Clock = std::chrono::steady_clock;

// Charged per key on top of its bytes, so that millions of empty values
// also hit max_total_bytes.
constexpr size_t kEntryOverhead = 64;
// While this much reply data is unsent, the connection's requests wait:
// a client that never reads cannot make the server queue replies forever.
constexpr size_t kMaxPendingOut = size_t{8} << 20;
constexpr size_t kReadChunk = 64 * 1024;
// Buffers larger than this are released once drained.
constexpr size_t kKeepBufferBytes = size_t{1} << 20;
// Longer GET/WAIT timeouts count as forever (timeout_to_ms never sends more).
constexpr int64_t kMaxDeadlineMs = int64_t{1000} * 1000 * 1000 * 1000;
constexpr uint64_t kListenId = 0;
constexpr uint64_t kWakeId = 1;

struct Entry {
  std::string value;
  Clock::time_point modified;
};

struct Conn {
  uint64_t id = 0;
  int fd = -1;
  std::string peer;
  bool authed = false;
  // Secret handshake in progress: CHALLENGE sent, AUTH expected.
  bool challenged = false;
  std::string client_nonce, server_nonce;
  Clock::time_point opened;
  std::string in;
  std::string out;
  size_t out_off = 0;
  uint32_t mask = 0;
  bool close_after_flush = false;
  bool peer_eof = false;
  // The parked request, if any.
  bool waiting = false;
  Op wait_op = Op::Wait;
  std::vector<std::string> wait_keys;
  bool has_deadline = false;
  Clock::time_point deadline;
};

void set_keepalive(int fd) {
  // A rank whose host vanished without a FIN would otherwise hold its
  // connection (and any parked wait) until the OS gives up hours later.
  int one = 1, idle = 30, intvl = 10, cnt = 6;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string peer_name(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof(ip));
  return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}

bool parse_counter(const std::string& s, int64_t* v) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, *v);
  return ec == std::errc() && p == end;
}

}  // namespace

struct StoreServer::Impl {
  std::string host;
  int port = 0;
  std::string token;
  std::string secret;  // opt.secret; "" : none
  StoreServerOptions opt;

  int listen_fd = -1;
  int wake_fd = -1;
  int ep = -1;
  std::thread thread;
  std::atomic<bool> stop{false};

  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns;
  uint64_t next_id = 2;
  std::unordered_map<std::string, Entry> data;
  size_t stored_bytes = 0;
  std::unordered_map<std::string, std::unordered_set<uint64_t>> waiters;
  std::set<std::pair<Clock::time_point, uint64_t>> deadlines;
  std::vector<uint64_t> ready;  // connections that may have buffered requests to run
  bool listen_paused = false;
  Clock::time_point listen_resume;
  Clock::time_point last_sweep;
  struct LogWindow {
    Clock::time_point start;
    int count = 0;
    int64_t suppressed = 0;
  };
  std::map<std::string, LogWindow> log_windows;

  struct {
    std::atomic<int64_t> keys{0}, stored_bytes{0}, connections{0}, accepted{0}, rejected{0}, refused{0},
        protocol_errors{0}, handshake_timeouts{0}, requests{0}, pending_waits{0};
  } st;

  void log(const std::string& kind, const std::string& line) {
    // A misconfigured neighbour job may retry for hours: a few lines per
    // minute tell the story, thousands would bury the training log.
    constexpr int kPerWindow = 5;
    constexpr auto kWindow = std::chrono::seconds(60);
    LogWindow& w = log_windows[kind];
    const auto now = Clock::now();
    std::string prefix;
    if (w.count == 0 || now - w.start > kWindow) {
      if (w.suppressed > 0)
        prefix = "store: (" + std::to_string(w.suppressed) + " more '" + kind + "' messages were suppressed) ";
      w = LogWindow{now, 0, 0};
    }
    if (++w.count > kPerWindow) {
      ++w.suppressed;
      return;
    }
    std::string msg = prefix + line;
    if (w.count == kPerWindow) msg += " (further '" + kind + "' messages suppressed for a minute)";
    if (opt.log) {
      opt.log(msg);
    } else {
      std::cerr << msg << std::endl;
    }
  }

  void publish_sizes() {
    st.keys = static_cast<int64_t>(data.size());
    st.stored_bytes = static_cast<int64_t>(stored_bytes);
    st.connections = static_cast<int64_t>(conns.size());
    st.pending_waits = static_cast<int64_t>(deadlines.size());
  }

  // --- connections ------------------------------------------------------

  void update_mask(Conn& c) {
    const bool out_pending = c.out_off < c.out.size();
    const bool paused = c.waiting || c.close_after_flush || c.peer_eof ||
                        c.out.size() - c.out_off > kMaxPendingOut;
    uint32_t m = EPOLLRDHUP;
    if (!paused) m |= EPOLLIN;
    if (out_pending) m |= EPOLLOUT;
    if (m == c.mask) return;
    epoll_event ev{};
    ev.events = m;
    ev.data.u64 = c.id;
    epoll_ctl(ep, EPOLL_CTL_MOD, c.fd, &ev);
    c.mask = m;
  }

  void unpark(Conn& c) {
    if (!c.waiting) return;
    for (const auto& k : c.wait_keys) {
      auto it = waiters.find(k);
      if (it == waiters.end()) continue;
      it->second.erase(c.id);
      if (it->second.empty()) waiters.erase(it);
    }
    if (c.has_deadline) deadlines.erase({c.deadline, c.id});
    c.waiting = false;
    c.has_deadline = false;
    c.wait_keys.clear();
  }

  void close_conn(uint64_t id) {
    auto it = conns.find(id);
    if (it == conns.end()) return;
    Conn& c = *it->second;
    unpark(c);
    epoll_ctl(ep, EPOLL_CTL_DEL, c.fd, nullptr);
    ::close(c.fd);
    conns.erase(it);
  }

  void protocol_error(Conn& c, const std::string& why) {
    ++st.protocol_errors;
    log("protocol", "store: closed the connection from " + c.peer + ": " + why);
    close_conn(c.id);
  }

  // Returns false when the connection was closed.
  bool flush(Conn& c) {
    while (c.out_off < c.out.size()) {
      const ssize_t n = ::send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off,
                               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.out_off += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        break;
      } else {
        close_conn(c.id);
        return false;
      }
    }
    if (c.out_off == c.out.size()) {
      // One 64 MiB reply must not pin 64 MiB per connection for good.
      if (c.out.capacity() > kKeepBufferBytes) {
        std::string().swap(c.out);
      } else {
        c.out.clear();
      }
      c.out_off = 0;
      if (c.close_after_flush || c.peer_eof) {
        close_conn(c.id);
        return false;
      }
    }
    update_mask(c);
    return true;
  }

  void reply(Conn& c, std::string frame) {
    if (c.out_off == c.out.size()) {
      c.out = std::move(frame);
      c.out_off = 0;
    } else {
      c.out += frame;
    }
  }

  void reply_status(Conn& c, Status s) { reply(c, std::move(Writer().u8(uint8_t(s))).frame()); }

  void reply_error(Conn& c, const std::string& msg) {
    reply(c, std::move(Writer().u8(uint8_t(Status::Error)).str(msg)).frame());
  }

  void accept_all() {
    for (int i = 0; i < 64; ++i) {
      sockaddr_in addr{};
      socklen_t len = sizeof(addr);
      const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Level-triggered: leaving the listener armed would spin. Pause it
          // briefly; existing connections closing will free descriptors.
          log("accept", "store: cannot accept connections: " + errno_text(errno) +
                            " (raise the open-file limit, ulimit -n)");
          epoll_ctl(ep, EPOLL_CTL_DEL, listen_fd, nullptr);
          listen_paused = true;
          listen_resume = Clock::now() + std::chrono::milliseconds(100);
        }
        return;
      }
      if (conns.size() >= opt.max_connections) {
        log("limit", "store: refused a connection from " + peer_name(addr) + ": " +
                         std::to_string(conns.size()) + " connections open already");
        ::close(fd);
        continue;
      }
      set_keepalive(fd);
      auto c = std::make_unique<Conn>();
      c->id = next_id++;
      c->fd = fd;
      c->peer = peer_name(addr);
      c->opened = Clock::now();
      c->mask = EPOLLIN | EPOLLRDHUP;
      epoll_event ev{};
      ev.events = c->mask;
      ev.data.u64 = c->id;
      if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
        ::close(fd);
        continue;
      }
      ++st.accepted;
      conns.emplace(c->id, std::move(c));
    }
  }

  void on_readable(Conn& c) {
    const uint64_t id = c.id;
    const size_t limit = 4 + (c.authed ? kMaxFrameBytes : kMaxHelloFrameBytes);
    // Bounded per event so one fast sender cannot starve the rest; the
    // level-triggered epoll brings us back for the remainder.
    for (int round = 0; round < 16 && c.in.size() < limit; ++round) {
      const size_t old = c.in.size();
      const size_t want = std::min(kReadChunk, limit - old);
      c.in.resize(old + want);
      const ssize_t n = ::recv(c.fd, c.in.data() + old, want, 0);
      if (n > 0) {
        c.in.resize(old + static_cast<size_t>(n));
        continue;
      }
      c.in.resize(old);
      if (n == 0) {
        c.peer_eof = true;
        break;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      close_conn(id);
      return;
    }
    run_requests(c);
  }

  // Runs the complete requests in c.in until one parks, fails, or none is
  // left. May close c.
  void run_requests(Conn& c) {
    const uint64_t id = c.id;
    size_t off = 0;
    while (!c.waiting && !c.close_after_flush && c.out.size() - c.out_off <= kMaxPendingOut) {
      if (c.in.size() - off < 4) break;
      const uint32_t len = load_u32(c.in.data() + off);
      const size_t cap = c.authed ? kMaxFrameBytes : kMaxHelloFrameBytes;
      if (len == 0 || len > cap) {
        protocol_error(c, "frame length " + std::to_string(len) + " outside 1.." +
                              std::to_string(cap) + (c.authed ? "" : " (before the job token)"));
        return;
      }
      if (c.in.size() - off - 4 < len) break;
      const std::string_view body(c.in.data() + off + 4, len);
      off += 4 + static_cast<size_t>(len);
      std::string why;
      bool ok = false;
      try {
        ok = handle(c, body, &why);
      } catch (const std::exception& e) {
        why = std::string("internal error: ") + e.what();
      }
      if (!ok) {
        protocol_error(c, why);
        return;
      }
      if (conns.find(id) == conns.end()) return;
    }
    if (off > 0) {
      c.in.erase(0, off);
      if (c.in.capacity() > kKeepBufferBytes && c.in.size() < kKeepBufferBytes / 2) c.in.shrink_to_fit();
    }
    if (c.peer_eof && c.waiting) {
      // A half-closed peer gets the replies to what it sent before closing,
      // but parked waits are for live clients only.
      close_conn(id);
      return;
    }
    flush(c);
  }

  // --- requests -----------------------------------------------------------

  // A connection turned away for its secret: logged (a few times a
  // minute), told why, closed once the reply is out.
  void refuse(Conn& c, const std::string& logged, const std::string& told) {
    ++st.refused;
    log("secret", "store: refused a connection from " + c.peer + ": it " + logged);
    reply(c, std::move(Writer().u8(uint8_t(Status::Refused)).str(told)).frame());
    c.close_after_flush = true;
  }

  // The AUTH that must follow a CHALLENGE.
  bool handle_auth(Conn& c, Op op, Reader& r, std::string* why) {
    std::string proof;
    if (op != Op::Auth || !r.str(&proof, kStoreProofBytes) || !r.done()) {
      *why = "the answer to the secret challenge is not an AUTH";
      return false;
    }
    c.challenged = false;
    if (!constant_time_equal(proof, store_proof(secret, "client", token, c.client_nonce, c.server_nonce))) {
      refuse(c, "holds a different secret (" + std::string(kStoreSecretEnv) + " differs from rank 0's)",
             "wrong secret: this process's " + std::string(kStoreSecretEnv) +
                 " differs from rank 0's (every rank needs the same value)");
      return true;
    }
    c.authed = true;
    reply(c, std::move(Writer().u8(uint8_t(Status::Ok))
                           .str(store_proof(secret, "server", token, c.client_nonce, c.server_nonce)))
                 .frame());
    return true;
  }

  // Returns false for a malformed request (the caller closes).
  bool handle(Conn& c, std::string_view body, std::string* why) {
    Reader r(body);
    uint8_t op_byte = 0;
    r.u8(&op_byte);
    const Op op = static_cast<Op>(op_byte);
    if (!c.authed && c.challenged) return handle_auth(c, op, r, why);
    if (!c.authed) return handle_hello(c, op, r, why);
    switch (op) {
      case Op::Set:
      case Op::Get:
      case Op::Wait:
      case Op::Add:
      case Op::Check:
      case Op::Del:
      case Op::MultiGet:
        if (handle_request(c, op, r, body.size())) return true;
        *why = "malformed request (op " + std::to_string(op_byte) + ", " + std::to_string(body.size()) +
               " bytes)";
        return false;
      case Op::Hello:
        *why = "a second handshake on one connection";
        return false;
      default:
        *why = "unknown request " + std::to_string(op_byte);
        return false;
    }
  }

  // The first message of a connection: the handshake (magic, version, job
  // token, and the client's nonce when it holds a secret).
  bool handle_hello(Conn& c, Op op, Reader& r, std::string* why) {
    uint32_t magic = 0, version = 0;
    std::string tok, nonce;
    if (op != Op::Hello || !r.u32(&magic) || !r.u32(&version) || magic != kMagic) {
      *why = "the first message is not a store handshake";
      return false;
    }
    if (version != kVersion) {
      reply_error(c, "protocol version " + std::to_string(version) + " is not " +
                         std::to_string(kVersion) +
                         ": every rank must run the same trainer build");
      c.close_after_flush = true;
      return true;
    }
    if (!r.str(&tok, kMaxTokenBytes) || !r.str(&nonce, kStoreNonceBytes) || !r.done() ||
        (!nonce.empty() && nonce.size() != kStoreNonceBytes)) {
      *why = "malformed handshake";
      return false;
    }
    if (tok != token) {
      ++st.rejected;
      log("token", "store: rejected a connection from " + c.peer +
                       ": wrong job token (is another job using port " + std::to_string(port) +
                       "?)");
      reply_status(c, Status::Rejected);
      c.close_after_flush = true;
      return true;
    }
    if (secret.empty()) {
      // Nothing to check here; a client that holds a secret refuses this
      // OK itself (it cannot tell this server from a stray one).
      c.authed = true;
      reply_status(c, Status::Ok);
      return true;
    }
    if (nonce.empty()) {
      refuse(c, "presented no secret (" + std::string(kStoreSecretEnv) + " is not set there)",
             "this store requires the job's secret and this process presented none: " +
                 std::string(kStoreSecretEnv) + " is not set here (every rank needs rank 0's value)");
      return true;
    }
    c.challenged = true;
    c.client_nonce = std::move(nonce);
    c.server_nonce = random_nonce();
    reply(c, std::move(Writer().u8(uint8_t(Status::Challenge)).str(c.server_nonce)).frame());
    return true;
  }

  // A request of an authenticated connection; false when it is malformed.
  bool handle_request(Conn& c, Op op, Reader& r, size_t body_bytes) {
    std::string key, value;
    std::vector<std::string> keys;
    int64_t num = 0;
    switch (op) {
      case Op::Set:
        if (!r.key(&key) || !r.str(&value, kMaxValueBytes) || !r.done()) return false;
        ++st.requests;
        if (store(key, std::move(value))) {
          reply_status(c, Status::Ok);
        } else {
          reply_full(c, key);
        }
        return true;
      case Op::Get:
      case Op::Wait:
        if (op == Op::Get) {
          if (!r.key(&key)) return false;
          keys.push_back(key);
        } else if (!r.keys(&keys, body_bytes)) {
          return false;
        }
        if (!r.i64(&num) || !r.done()) return false;
        ++st.requests;
        park(c, op, std::move(keys), num);
        return true;
      case Op::Add:
        if (!r.key(&key) || !r.i64(&num) || !r.done()) return false;
        ++st.requests;
        add(c, key, num);
        return true;
      case Op::Check: {
        if (!r.keys(&keys, body_bytes) || !r.done()) return false;
        ++st.requests;
        bool all = true;
        for (const auto& k : keys) all = all && data.count(k) > 0;
        reply(c, std::move(Writer().u8(uint8_t(Status::Ok)).u8(all ? 1 : 0)).frame());
        return true;
      }
      case Op::Del: {
        if (!r.key(&key) || !r.done()) return false;
        ++st.requests;
        auto it = data.find(key);
        const bool existed = it != data.end();
        if (existed) {
          stored_bytes -= kEntryOverhead + key.size() + it->second.value.size();
          data.erase(it);
        }
        reply(c, std::move(Writer().u8(uint8_t(Status::Ok)).u8(existed ? 1 : 0)).frame());
        return true;
      }
      case Op::MultiGet:
        if (!r.keys(&keys, body_bytes) || !r.done()) return false;
        ++st.requests;
        multi_get(c, keys);
        return true;
      default:
        return false;
    }
  }

  // ADD: a counter key, created at 0.
  void add(Conn& c, const std::string& key, int64_t num) {
    int64_t cur = 0;
    auto it = data.find(key);
    if (it != data.end() && !parse_counter(it->second.value, &cur)) {
      reply_error(c, "add on key " + quote_key(key) + ", which holds a value that is not a counter");
      return;
    }
    int64_t next = 0;
    if (__builtin_add_overflow(cur, num, &next)) {
      reply_error(c, "add on key " + quote_key(key) + " overflows int64");
      return;
    }
    if (!store(key, std::to_string(next))) {
      reply_full(c, key);
      return;
    }
    reply(c, std::move(Writer().u8(uint8_t(Status::Ok)).i64(next)).frame());
  }

  void multi_get(Conn& c, const std::vector<std::string>& keys) {
    // Check the reply size first: many keys naming big values must not
    // make a reply larger than any client would accept.
    size_t total = 16;
    for (const auto& k : keys) {
      auto it = data.find(k);
      total += 1 + (it == data.end() ? 0 : 12 + it->second.value.size());
    }
    if (total > kMaxFrameBytes) {
      reply_error(c, "multi_get of " + std::to_string(keys.size()) +
                         " keys would return " + std::to_string(total) +
                         " bytes, over the frame limit");
      return;
    }
    const auto now = Clock::now();
    Writer w;
    w.u8(uint8_t(Status::Ok)).u32(static_cast<uint32_t>(keys.size()));
    for (const auto& k : keys) {
      auto it = data.find(k);
      if (it == data.end()) {
        w.u8(0);
        continue;
      }
      const auto age = std::chrono::duration_cast<std::chrono::milliseconds>(now - it->second.modified);
      w.u8(1).str(it->second.value).i64(age.count());
    }
    reply(c, std::move(w).frame());
    return;
  }

  void reply_full(Conn& c, const std::string& key) {
    reply_error(c, "the store is full (" + std::to_string(stored_bytes) + " of " +
                       std::to_string(opt.max_total_bytes) + " bytes used); cannot store key " +
                       quote_key(key));
  }

  // Returns false (and stores nothing) when the value would not fit.
  bool store(const std::string& key, std::string value) {
    auto it = data.find(key);
    const size_t old = it == data.end() ? 0 : kEntryOverhead + key.size() + it->second.value.size();
    const size_t add = kEntryOverhead + key.size() + value.size();
    if (stored_bytes - old + add > opt.max_total_bytes) return false;
    // Insert before counting, so that an allocation failure leaves the
    // accounting true.
    if (it == data.end()) {
      data.emplace(key, Entry{std::move(value), Clock::now()});
    } else {
      it->second.value = std::move(value);
      it->second.modified = Clock::now();
    }
    stored_bytes = stored_bytes - old + add;
    wake_waiters(key);
    return true;
  }

  std::vector<std::string> missing_of(const std::vector<std::string>& keys) const {
    std::vector<std::string> m;
    for (const auto& k : keys)
      if (!data.count(k)) m.push_back(k);
    return m;
  }

  void answer_wait(Conn& c, Op op, const std::vector<std::string>& keys) {
    if (op == Op::Get) {
      reply(c, std::move(Writer().u8(uint8_t(Status::Ok)).str(data.at(keys[0]).value)).frame());
    } else {
      reply_status(c, Status::Ok);
    }
  }

  void answer_timeout(Conn& c, const std::vector<std::string>& missing) {
    std::vector<std::string> listed(missing.begin(),
                                    missing.begin() + std::min(missing.size(), kMaxTimeoutKeysListed));
    reply(c, std::move(Writer()
                           .u8(uint8_t(Status::Timeout))
                           .u32(static_cast<uint32_t>(missing.size()))
                           .keys(listed))
                 .frame());
  }

  void park(Conn& c, Op op, std::vector<std::string> keys, int64_t timeout_ms) {
    std::vector<std::string> missing = missing_of(keys);
    if (missing.empty()) {
      answer_wait(c, op, keys);
      return;
    }
    if (timeout_ms == 0) {
      answer_timeout(c, missing);
      return;
    }
    c.waiting = true;
    c.wait_op = op;
    c.wait_keys = std::move(keys);
    for (const auto& k : missing) waiters[k].insert(c.id);
    // A peer's timeout beyond ~30 years waits forever, as the client's own
    // "forever" (timeout_to_ms); added to the clock it would overflow.
    if (timeout_ms > 0 && timeout_ms <= kMaxDeadlineMs) {
      c.has_deadline = true;
      c.deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
      deadlines.insert({c.deadline, c.id});
    }
  }

  void wake_waiters(const std::string& key) {
    auto it = waiters.find(key);
    if (it == waiters.end()) return;
    const std::vector<uint64_t> ids(it->second.begin(), it->second.end());
    for (uint64_t id : ids) {
      auto ci = conns.find(id);
      if (ci == conns.end() || !ci->second->waiting) continue;
      Conn& w = *ci->second;
      if (!missing_of(w.wait_keys).empty()) continue;
      const Op op = w.wait_op;
      const std::vector<std::string> keys = w.wait_keys;
      unpark(w);
      answer_wait(w, op, keys);
      ready.push_back(id);
    }
  }

  void expire_deadlines() {
    const auto now = Clock::now();
    while (!deadlines.empty() && deadlines.begin()->first <= now) {
      const uint64_t id = deadlines.begin()->second;
      deadlines.erase(deadlines.begin());
      auto ci = conns.find(id);
      if (ci == conns.end()) continue;
      Conn& c = *ci->second;
      c.has_deadline = false;
      const std::vector<std::string> missing = missing_of(c.wait_keys);
      unpark(c);
      answer_timeout(c, missing);
      ready.push_back(id);
    }
  }

  void sweep_handshakes() {
    const auto now = Clock::now();
    if (now - last_sweep < std::chrono::milliseconds(100)) return;
    last_sweep = now;
    if (!(opt.handshake_timeout_s < 1e7)) return;  // effectively never (and keeps the cast finite)
    const auto limit = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(opt.handshake_timeout_s));
    std::vector<uint64_t> stale;
    for (const auto& [id, c] : conns)
      if (!c->authed && now - c->opened > limit) stale.push_back(id);
    for (uint64_t id : stale) {
      ++st.handshake_timeouts;
      log("handshake", "store: closed the connection from " + conns[id]->peer +
                           ": no job token within " + format_seconds(opt.handshake_timeout_s) + " s");
      close_conn(id);
    }
  }

  void run_ready() {
    // Answered waits may have requests queued behind them; running them may
    // answer more waits, hence the loop (each round consumes input, so it ends).
    while (!ready.empty()) {
      std::vector<uint64_t> batch;
      batch.swap(ready);
      for (uint64_t id : batch) {
        auto ci = conns.find(id);
        if (ci == conns.end()) continue;
        run_requests(*ci->second);
      }
    }
  }

  int next_timeout_ms() const {
    int ms = 100;  // handshake sweep and listener resume granularity
    if (!deadlines.empty()) {
      const auto d = std::chrono::duration_cast<std::chrono::milliseconds>(deadlines.begin()->first -
                                                                           Clock::now());
      ms = static_cast<int>(std::clamp<int64_t>(d.count() + 1, 0, ms));
    }
    return ms;
  }

  void loop() {
    std::vector<epoll_event> events(256);
    while (!stop.load()) {
      const int n = epoll_wait(ep, events.data(), static_cast<int>(events.size()), next_timeout_ms());
      if (n < 0 && errno != EINTR) {
        log("epoll", "store: epoll_wait failed: " + errno_text(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      for (int i = 0; i < n; ++i) {
        const uint64_t id = events[i].data.u64;
        const uint32_t ev = events[i].events;
        if (id == kWakeId) continue;
        if (id == kListenId) {
          accept_all();
          continue;
        }
        auto ci = conns.find(id);
        if (ci == conns.end()) continue;
        Conn& c = *ci->second;
        if (ev & (EPOLLERR | EPOLLHUP)) {
          close_conn(id);
          continue;
        }
        if (ev & EPOLLIN) {
          on_readable(c);
        } else if (ev & EPOLLRDHUP) {
          // Paused (parked or backed up) and the peer went away.
          close_conn(id);
          continue;
        }
        ci = conns.find(id);
        if (ci != conns.end() && (ev & EPOLLOUT)) {
          if (flush(*ci->second)) ready.push_back(id);
        }
      }
      expire_deadlines();
      run_ready();
      sweep_handshakes();
      if (listen_paused && Clock::now() >= listen_resume) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = kListenId;
        epoll_ctl(ep, EPOLL_CTL_ADD, listen_fd, &ev);
        listen_paused = false;
      }
      publish_sizes();
    }
  }
};

StoreServer::StoreServer(std::string host, int port, std::string token, StoreServerOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.host = std::move(host);
  s.token = std::move(token);
  s.opt = std::move(options);
  s.secret = s.opt.secret;
  if (s.token.size() > kMaxTokenBytes)
    throw StoreError("store: job token of " + std::to_string(s.token.size()) + " bytes exceeds " +
                     std::to_string(kMaxTokenBytes));
  const std::string where = (s.host.empty() ? std::string("0.0.0.0") : s.host) + ":" + std::to_string(port);
  sockaddr_in addr{};
  std::string err;
  if (!resolve_ipv4(s.host, port, &addr, &err)) throw StoreError("store: cannot listen on " + where + ": " + err);

  s.listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s.listen_fd < 0) throw StoreError("store: socket() failed: " + errno_text(errno));
  // A restarted job must be able to reuse the port while the previous run's
  // connections sit in TIME_WAIT.
  int one = 1;
  setsockopt(s.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  // Under torchrun's restarts the previous attempt's rank 0 may still be
  // winding down (a SIGTERM is a preemption request: it tries to finish its
  // step first) while the new one starts: give it a few seconds.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int bound = ::bind(s.listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  while (bound != 0 && errno == EADDRINUSE && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    bound = ::bind(s.listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }
  if (bound != 0 || ::listen(s.listen_fd, SOMAXCONN) != 0) {
    const int e = errno;
    ::close(s.listen_fd);
    std::string hint;
    if (e == EADDRINUSE) hint = " (another job or a previous run still holds the port: pick another MASTER_PORT)";
    if (e == EADDRNOTAVAIL) hint = " (MASTER_ADDR is not an address of this host; rank 0 must run where it points)";
    throw StoreError("store: cannot listen on " + where + ": " + errno_text(e) + hint);
  }
  socklen_t len = sizeof(addr);
  getsockname(s.listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  s.port = ntohs(addr.sin_port);

  s.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  s.ep = epoll_create1(EPOLL_CLOEXEC);
  if (s.wake_fd < 0 || s.ep < 0) {
    const int e = errno;
    if (s.wake_fd >= 0) ::close(s.wake_fd);
    if (s.ep >= 0) ::close(s.ep);
    ::close(s.listen_fd);
    throw StoreError("store: cannot create the event loop: " + errno_text(e));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenId;
  epoll_ctl(s.ep, EPOLL_CTL_ADD, s.listen_fd, &ev);
  ev.data.u64 = kWakeId;
  epoll_ctl(s.ep, EPOLL_CTL_ADD, s.wake_fd, &ev);
  s.last_sweep = Clock::now();
  s.thread = std::thread([&s] { s.loop(); });
}

StoreServer::~StoreServer() {
  Impl& s = *impl_;
  s.stop = true;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(s.wake_fd, &one, sizeof(one));
  if (s.thread.joinable()) s.thread.join();
  for (auto& [id, c] : s.conns) ::close(c->fd);
  s.conns.clear();
  ::close(s.listen_fd);
  ::close(s.wake_fd);
  ::close(s.ep);
}

int StoreServer::port() const { return impl_->port; }

StoreServerStats StoreServer::stats() const {
  const auto& st = impl_->st;
  StoreServerStats r;
  r.keys = st.keys;
  r.stored_bytes = st.stored_bytes;
  r.connections = st.connections;
  r.accepted = st.accepted;
  r.rejected_tokens = st.rejected;
  r.refused_secrets = st.refused;
  r.protocol_errors = st.protocol_errors;
  r.handshake_timeouts = st.handshake_timeouts;
  r.requests = st.requests;
  r.pending_waits = st.pending_waits;
  return r;
}

}  // namespace trainer
