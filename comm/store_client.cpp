// The store client (a blocking request/reply connection with deadlines), the
// operations built on top of any Store (barrier, heartbeats), PrefixStore,
// and the job token.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>
#include <thread>

#include "comm/store.h"
#include "comm/store_protocol.h"
#include "comm/store_secret.h"

namespace trainer {

using namespace store_wire;

namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(double seconds) {
  if (!std::isfinite(seconds) || seconds > 1e9) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(std::max(0.0, seconds)));
}

// Waits for `events` on fd until the deadline: 1 ready, 0 timed out, -1 error.
int wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    int ms = -1;
    if (deadline != Clock::time_point::max()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return 0;
      ms = static_cast<int>(std::min<int64_t>(left + 1, 1 << 30));
    }
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return -1;
    if (rc == 0) continue;  // re-check the deadline (poll may wake early)
    return 1;
  }
}

// I/O outcome, so callers can word the error for what they were doing.
enum class Io { Ok, Timeout, Closed, Error };

Io send_all(int fd, const std::string& data, Clock::time_point deadline, int* err) {
  size_t off = 0;
  while (off < data.size()) {
    // MSG_NOSIGNAL: a server that went away must give an error, not SIGPIPE.
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const int w = wait_fd(fd, POLLOUT, deadline);
      if (w == 0) return Io::Timeout;
      if (w < 0) return *err = errno, Io::Error;
      continue;
    }
    *err = errno;
    return (errno == EPIPE || errno == ECONNRESET) ? Io::Closed : Io::Error;
  }
  return Io::Ok;
}

Io recv_exact(int fd, char* buf, size_t len, Clock::time_point deadline, int* err) {
  size_t off = 0;
  while (off < len) {
    const ssize_t n = ::recv(fd, buf + off, len - off, MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return Io::Closed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const int w = wait_fd(fd, POLLIN, deadline);
      if (w == 0) return Io::Timeout;
      if (w < 0) return *err = errno, Io::Error;
      continue;
    }
    *err = errno;
    return errno == ECONNRESET ? Io::Closed : Io::Error;
  }
  return Io::Ok;
}

// One reply frame; a length outside the protocol's limits is reported as
// Io::Error with err = EPROTO, so a stray service on the port cannot make
// the client allocate gigabytes.
Io recv_frame(int fd, std::string* body, Clock::time_point deadline, int* err) {
  char hdr[4];
  Io io = recv_exact(fd, hdr, 4, deadline, err);
  if (io != Io::Ok) return io;
  const uint32_t len = load_u32(hdr);
  if (len == 0 || len > kMaxFrameBytes) {
    *err = EPROTO;
    return Io::Error;
  }
  body->resize(len);
  return recv_exact(fd, body->data(), len, deadline, err);
}

void check_key(const std::string& key) {
  if (key.empty() || key.size() > kMaxKeyBytes)
    throw StoreError("store: key " + quote_key(key) + " is " + std::to_string(key.size()) +
                     " bytes; keys must be 1.." + std::to_string(kMaxKeyBytes) + " bytes");
}

void check_frame_size(const std::string& frame, const char* op) {
  if (frame.size() - 4 > kMaxFrameBytes)
    throw StoreError(std::string("store: ") + op + " request of " + std::to_string(frame.size()) +
                     " bytes exceeds the " + std::to_string(kMaxFrameBytes) + "-byte message limit");
}

bool parse_int(const std::string& s, int64_t* v) {
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, *v);
  return !s.empty() && ec == std::errc() && p == end;
}

// "ranks 2, 3" / "rank 7" / "ranks 0-99, 120": runs of three or more
// collapse, and very long lists are cut, so a 4096-rank job's message
// stays one readable line.
std::string format_ranks(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  constexpr size_t kMaxSegments = 16;
  size_t segments = 0;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (segments == kMaxSegments) {
      out += ", ... (" + std::to_string(ranks.size()) + " ranks in all)";
      break;
    }
    if (segments > 0) out += ", ";
    ++segments;
    if (j - i >= 2) {
      out += std::to_string(ranks[i]) + "-" + std::to_string(ranks[j]);
      i = j + 1;
    } else {
      out += std::to_string(ranks[i]);
      ++i;
    }
  }
  return out;
}

std::string keys_not_set(uint32_t total, const std::vector<std::string>& listed, double timeout_s) {
  const std::string within = " not set within " + format_seconds(timeout_s) + " s";
  if (listed.empty()) return "store: " + std::to_string(total) + " keys" + within;
  if (total == 1 && listed.size() == 1) return "store: key " + quote_key(listed[0]) + within;
  std::string names;
  for (size_t i = 0; i < listed.size(); ++i) names += (i ? ", " : "") + quote_key(listed[i]);
  if (total > listed.size())
    return "store: " + std::to_string(total) + " keys" + within + ", among them " + names;
  return "store: keys " + names + within;
}

}  // namespace

// --- job token ---------------------------------------------------------

std::string job_token_from_env() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
  };
  if (auto v = env("TRAINER_JOB_TOKEN"); !v.empty()) return v;
  // Launcher-specific ids come before Slurm's: torchrun or mpirun started
  // inside a Slurm allocation sees SLURM_* too, and on the batch host those
  // can differ from what its remote ranks see (the step id), whereas the
  // launcher's own id is the same for every rank it starts.
  if (auto v = env("TORCHELASTIC_RUN_ID"); !v.empty()) return "torchelastic:" + v;
  if (auto v = env("OMPI_MCA_orte_ess_jobid"); !v.empty()) return "ompi:" + v;
  if (auto v = env("PMIX_NAMESPACE"); !v.empty()) return "pmix:" + v;
  if (auto v = env("SLURM_JOB_ID"); !v.empty()) {
    // Steps of one allocation may run side by side, each with its own store.
    const std::string step = env("SLURM_STEP_ID");
    return "slurm:" + v + (step.empty() ? "" : "." + step);
  }
  // No launcher id: every such job presents the same token, so two of them
  // that pick the same MASTER_ADDR:MASTER_PORT would join each other's
  // rendezvous instead of being turned away. Single-host runs started by
  // hand are the usual case here; set TRAINER_JOB_TOKEN (any string shared
  // by the job's ranks) when several may share a host.
  return "trainer-default-job-token";
}

// --- StoreClient ---------------------------------------------------------

std::string StoreClient::endpoint() const { return host_ + ":" + std::to_string(port_); }

namespace {

// The answer to a handshake that ends the attempt for good (a refusal, a
// secret that does not match, something that is not a store): thrown. I/O
// trouble is returned, for the caller to retry.
Io handshake(int fd, const std::string& endpoint, const std::string& token, const std::string& secret,
             Clock::time_point deadline, int* ioerr) {
  const std::string nonce = secret.empty() ? std::string() : random_nonce();
  const std::string hello =
      std::move(Writer().u8(uint8_t(Op::Hello)).u32(kMagic).u32(kVersion).str(token).str(nonce)).frame();
  const std::string not_a_store = "store at " + endpoint +
                                  " answered with something that is not a store reply: is another service "
                                  "using the port?";
  std::string body;
  Io io = send_all(fd, hello, deadline, ioerr);
  if (io == Io::Ok) io = recv_frame(fd, &body, deadline, ioerr);
  if (io != Io::Ok) {
    if (io == Io::Error && *ioerr == EPROTO) throw StoreError(not_a_store);
    return io;
  }
  const uint8_t status = static_cast<uint8_t>(body[0]);
  Reader r(std::string_view(body).substr(1));
  std::string msg;
  if (status == uint8_t(Status::Ok) && body.size() == 1) {
    if (secret.empty()) return Io::Ok;
    throw StoreAuthError("store at " + endpoint + " let this process in without checking its secret: rank 0 "
                         "runs without " + std::string(kStoreSecretEnv) + " but this process has it set (give every "
                         "rank the same " + std::string(kStoreSecretEnv) + ", or none)");
  }
  if (status == uint8_t(Status::Rejected))
    throw StoreError("store at " + endpoint + " rejected this process's job token: is another job using the port?");
  if (status == uint8_t(Status::Refused) && r.str(&msg, 4096))
    throw StoreAuthError("store at " + endpoint + " refused this process: " + msg);
  if (status == uint8_t(Status::Error) && r.str(&msg, 4096)) throw StoreError("store at " + endpoint + ": " + msg);
  std::string server_nonce;
  if (status != uint8_t(Status::Challenge) || secret.empty() || !r.str(&server_nonce, kStoreNonceBytes) ||
      server_nonce.size() != kStoreNonceBytes || !r.done())
    throw StoreError(not_a_store);

  const std::string auth =
      std::move(Writer().u8(uint8_t(Op::Auth)).str(store_proof(secret, "client", token, nonce, server_nonce))).frame();
  io = send_all(fd, auth, deadline, ioerr);
  if (io == Io::Ok) io = recv_frame(fd, &body, deadline, ioerr);
  if (io != Io::Ok) {
    if (io == Io::Error && *ioerr == EPROTO) throw StoreError(not_a_store);
    return io;
  }
  Reader a(std::string_view(body).substr(1));
  if (uint8_t(body[0]) == uint8_t(Status::Refused) && a.str(&msg, 4096))
    throw StoreAuthError("store at " + endpoint + " refused this process: " + msg);
  std::string proof;
  if (uint8_t(body[0]) != uint8_t(Status::Ok) || !a.str(&proof, kStoreProofBytes) || !a.done())
    throw StoreError(not_a_store);
  if (!constant_time_equal(proof, store_proof(secret, "server", token, nonce, server_nonce)))
    throw StoreAuthError("store at " + endpoint + " did not prove that it holds " + std::string(kStoreSecretEnv) +
                         ": whatever answers on that port is not this job's rank 0");
  return Io::Ok;
}

}  // namespace

StoreClient::StoreClient(std::string host, int port, std::string token, double connect_timeout_s,
                         double request_timeout_s, std::string secret)
    : host_(std::move(host)), port_(port), request_timeout_s_(request_timeout_s) {
  if (token.size() > kMaxTokenBytes)
    throw StoreError("store: job token of " + std::to_string(token.size()) + " bytes exceeds " +
                     std::to_string(kMaxTokenBytes));
  const auto deadline = deadline_after(connect_timeout_s);
  std::mt19937 rng(std::random_device{}());
  double backoff_s = 0.02;
  std::string last_error = "no attempt made";
  for (;;) {
    sockaddr_in addr{};
    std::string err;
    int fd = -1;
    if (!resolve_ipv4(host_, port_, &addr, &err)) {
      last_error = err;
    } else if ((fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0) {
      throw StoreError("store: socket() failed: " + errno_text(errno));
    } else {
      // Non-blocking connect so an unreachable host cannot hold us past the
      // deadline (a blocking connect waits for the kernel's SYN retries).
      int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
      int e = rc == 0 ? 0 : errno;
      if (rc != 0 && e == EINPROGRESS) {
        const int w = wait_fd(fd, POLLOUT, deadline);
        if (w == 1) {
          socklen_t len = sizeof(e);
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len);
        } else {
          e = w == 0 ? ETIMEDOUT : errno;
        }
      }
      if (e != 0) {
        last_error = errno_text(e);
      } else {
        int one = 1, idle = 30, intvl = 10, cnt = 6;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        // Lets a wait without timeout notice a vanished rank 0 host.
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
        // The handshake gets at least a few seconds even when the connect
        // deadline is nearly spent: the server is there, let it answer.
        const auto hs_deadline = std::max(deadline, deadline_after(5));
        int ioerr = 0;
        Io io = Io::Error;
        try {
          io = handshake(fd, endpoint(), token, secret, hs_deadline, &ioerr);
        } catch (...) {
          ::close(fd);
          throw;
        }
        if (io == Io::Ok) {
          fd_ = fd;
          return;
        }
        // Closed or reset before answering: a server at its connection limit
        // or shutting down. Worth another try.
        last_error = io == Io::Timeout ? "no answer to the handshake"
                     : io == Io::Closed ? "connection closed during the handshake"
                                        : errno_text(ioerr);
      }
      ::close(fd);
    }
    const auto now = Clock::now();
    if (now >= deadline)
      throw StoreError("store: could not connect to " + endpoint() + " within " +
                       format_seconds(connect_timeout_s) + " s (last error: " + last_error +
                       "): is rank 0 running, and are MASTER_ADDR and MASTER_PORT the same on every rank?");
    // Jitter spreads thousands of ranks that all started at the same moment.
    const double sleep_s = backoff_s * std::uniform_real_distribution<double>(0.5, 1.0)(rng);
    const auto wake = std::min(deadline, deadline_after(sleep_s));
    std::this_thread::sleep_until(wake);
    backoff_s = std::min(backoff_s * 2, 1.0);
  }
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string StoreClient::round_trip(const std::string& frame, const char* op, double reply_timeout_s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0)
    throw StoreError("store at " + endpoint() + ": connection unusable after an earlier error (" + broken_ +
                     ")");
  const auto deadline = deadline_after(reply_timeout_s);
  int err = 0;
  std::string body;
  Io io = send_all(fd_, frame, deadline, &err);
  if (io == Io::Ok) io = recv_frame(fd_, &body, deadline, &err);
  if (io == Io::Ok) return body;
  // The stream is at an unknown position now: no later request may use it.
  ::close(fd_);
  fd_ = -1;
  switch (io) {
    case Io::Timeout:
      broken_ = std::string("no answer to a ") + op + " request within " + format_seconds(reply_timeout_s) + " s";
      break;
    case Io::Closed:
      broken_ = std::string("closed the connection during ") + op + " (did rank 0 exit?)";
      break;
    default:
      broken_ = err == EPROTO ? std::string("sent a malformed reply to ") + op
                              : std::string(op) + " failed: " + errno_text(err);
  }
  throw StoreError("store at " + endpoint() + ": " + broken_);
}

namespace {

// Splits off the status; throws for ERROR and anything unexpected. Returns
// the reader positioned after the status, and the status (Ok or Timeout).
Status reply_status(const std::string& body, Reader* r, const std::string& endpoint, bool timeout_ok) {
  *r = Reader(std::string_view(body).substr(1));
  const auto s = static_cast<Status>(static_cast<uint8_t>(body[0]));
  if (s == Status::Ok || (s == Status::Timeout && timeout_ok)) return s;
  std::string msg;
  if (s == Status::Error && r->str(&msg, kMaxFrameBytes)) throw StoreError("store: " + msg);
  throw StoreError("store at " + endpoint + " sent an unexpected reply");
}

[[noreturn]] void malformed(const std::string& endpoint, const char* op) {
  throw StoreError("store at " + endpoint + " sent a malformed reply to " + op);
}

}  // namespace

void StoreClient::set(const std::string& key, const std::string& value) {
  check_key(key);
  if (value.size() > kMaxValueBytes)
    throw StoreError("store: value for key " + quote_key(key) + " is " + std::to_string(value.size()) +
                     " bytes, over the " + std::to_string(kMaxValueBytes) + "-byte limit");
  const std::string body =
      round_trip(std::move(Writer().u8(uint8_t(Op::Set)).str(key).str(value)).frame(), "set",
                 request_timeout_s_);
  Reader r("");
  reply_status(body, &r, endpoint(), false);
  if (!r.done()) malformed(endpoint(), "set");
}

std::string StoreClient::get(const std::string& key, double timeout_s) {
  check_key(key);
  const std::string body = round_trip(
      std::move(Writer().u8(uint8_t(Op::Get)).str(key).i64(timeout_to_ms(timeout_s))).frame(), "get",
      timeout_s + request_timeout_s_);
  Reader r("");
  std::string value;
  if (reply_status(body, &r, endpoint(), true) == Status::Timeout)
    throw StoreTimeout("store: key " + quote_key(key) + " not set within " + format_seconds(timeout_s) + " s");
  if (!r.str(&value, kMaxValueBytes) || !r.done()) malformed(endpoint(), "get");
  return value;
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  check_key(key);
  const std::string body =
      round_trip(std::move(Writer().u8(uint8_t(Op::Add)).str(key).i64(delta)).frame(), "add", request_timeout_s_);
  Reader r("");
  reply_status(body, &r, endpoint(), false);
  int64_t v = 0;
  if (!r.i64(&v) || !r.done()) malformed(endpoint(), "add");
  return v;
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  for (const auto& k : keys) check_key(k);
  std::string frame = std::move(Writer().u8(uint8_t(Op::Check)).keys(keys)).frame();
  check_frame_size(frame, "check");
  const std::string body = round_trip(frame, "check", request_timeout_s_);
  Reader r("");
  reply_status(body, &r, endpoint(), false);
  uint8_t all = 0;
  if (!r.u8(&all) || !r.done()) malformed(endpoint(), "check");
  return all != 0;
}

void StoreClient::wait(const std::vector<std::string>& keys, double timeout_s) {
  for (const auto& k : keys) check_key(k);
  std::string frame = std::move(Writer().u8(uint8_t(Op::Wait)).keys(keys).i64(timeout_to_ms(timeout_s))).frame();
  check_frame_size(frame, "wait");
  const std::string body = round_trip(frame, "wait", timeout_s + request_timeout_s_);
  Reader r("");
  if (reply_status(body, &r, endpoint(), true) == Status::Timeout) {
    uint32_t total = 0;
    std::vector<std::string> listed;
    if (!r.u32(&total) || !r.keys(&listed, kMaxTimeoutKeysListed) || !r.done()) malformed(endpoint(), "wait");
    throw StoreTimeout(keys_not_set(total, listed, timeout_s));
  }
  if (!r.done()) malformed(endpoint(), "wait");
}

bool StoreClient::del(const std::string& key) {
  check_key(key);
  const std::string body =
      round_trip(std::move(Writer().u8(uint8_t(Op::Del)).str(key)).frame(), "delete", request_timeout_s_);
  Reader r("");
  reply_status(body, &r, endpoint(), false);
  uint8_t existed = 0;
  if (!r.u8(&existed) || !r.done()) malformed(endpoint(), "delete");
  return existed != 0;
}

std::vector<StoreEntry> StoreClient::multi_get(const std::vector<std::string>& keys) {
  for (const auto& k : keys) check_key(k);
  std::string frame = std::move(Writer().u8(uint8_t(Op::MultiGet)).keys(keys)).frame();
  check_frame_size(frame, "multi_get");
  const std::string body = round_trip(frame, "multi_get", request_timeout_s_);
  Reader r("");
  reply_status(body, &r, endpoint(), false);
  uint32_t n = 0;
  if (!r.u32(&n) || n != keys.size()) malformed(endpoint(), "multi_get");
  std::vector<StoreEntry> out(n);
  for (auto& e : out) {
    uint8_t present = 0;
    if (!r.u8(&present)) malformed(endpoint(), "multi_get");
    if (!present) continue;
    int64_t age_ms = 0;
    if (!r.str(&e.value, kMaxValueBytes) || !r.i64(&age_ms)) malformed(endpoint(), "multi_get");
    e.present = true;
    e.age_s = static_cast<double>(age_ms) / 1000.0;
  }
  if (!r.done()) malformed(endpoint(), "multi_get");
  return out;
}

// --- operations on any store ----------------------------------------------

void Store::barrier(const std::string& name, int rank, int world, double timeout_s) {
  if (world < 1 || rank < 0 || rank >= world)
    throw StoreError("store barrier '" + name + "': rank " + std::to_string(rank) + " is not in a world of " +
                     std::to_string(world));
  const std::string base = "barrier/" + name + "/";
  // The per-rank counter records the arrival and numbers the generation, so
  // one name serves any number of barriers in sequence.
  const int64_t gen = add(base + std::to_string(rank), 1);
  const std::string done = base + "done." + std::to_string(gen);
  if (add(base + "count." + std::to_string(gen), 1) == world) {
    set(done, "1");
    // Everyone reached this generation, so everyone has left the previous
    // one: its keys can go, which keeps a per-step barrier from growing
    // the store.
    if (gen > 1) {
      del(base + "count." + std::to_string(gen - 1));
      del(base + "done." + std::to_string(gen - 1));
    }
  }
  try {
    wait({done}, timeout_s);
  } catch (const StoreTimeout&) {
    std::vector<std::string> keys;
    for (int r = 0; r < world; ++r) keys.push_back(base + std::to_string(r));
    const std::vector<StoreEntry> arrived = multi_get(keys);
    std::vector<int> missing;
    for (int r = 0; r < world; ++r) {
      int64_t g = 0;
      if (!arrived[r].present || !parse_int(arrived[r].value, &g) || g < gen) missing.push_back(r);
    }
    const std::string head = "store barrier '" + name + "' timed out after " + format_seconds(timeout_s) + " s: ";
    if (missing.empty())
      throw StoreTimeout(head + "all " + std::to_string(world) +
                         " ranks arrived but the last one did not release the barrier (did it exit?)");
    throw StoreTimeout(head + format_ranks(missing) + " of " + std::to_string(world) + " never arrived");
  }
}

void Store::set_heartbeat(int rank, int64_t step) { set("heartbeat/" + std::to_string(rank), std::to_string(step)); }

std::vector<Heartbeat> Store::read_heartbeats(int world) {
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back("heartbeat/" + std::to_string(r));
  const std::vector<StoreEntry> entries = multi_get(keys);
  std::vector<Heartbeat> out(static_cast<size_t>(std::max(world, 0)));
  for (int r = 0; r < world; ++r) {
    out[r].rank = r;
    out[r].present = entries[r].present && parse_int(entries[r].value, &out[r].step);
    out[r].age_s = entries[r].age_s;
  }
  return out;
}

// --- PrefixStore -----------------------------------------------------------

std::string prefixed(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "/" + key;
}

std::vector<std::string> PrefixStore::all(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(prefixed(prefix_, k));
  return out;
}

void PrefixStore::set(const std::string& key, const std::string& value) { inner_.set(prefixed(prefix_, key), value); }
std::string PrefixStore::get(const std::string& key, double timeout_s) {
  return inner_.get(prefixed(prefix_, key), timeout_s);
}
int64_t PrefixStore::add(const std::string& key, int64_t delta) { return inner_.add(prefixed(prefix_, key), delta); }
bool PrefixStore::check(const std::vector<std::string>& keys) { return inner_.check(all(keys)); }
void PrefixStore::wait(const std::vector<std::string>& keys, double timeout_s) { inner_.wait(all(keys), timeout_s); }
bool PrefixStore::del(const std::string& key) { return inner_.del(prefixed(prefix_, key)); }
std::vector<StoreEntry> PrefixStore::multi_get(const std::vector<std::string>& keys) {
  return inner_.multi_get(all(keys));
}

}  // namespace trainer
