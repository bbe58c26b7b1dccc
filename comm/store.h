// The rendezvous store (docs/ARCHITECTURE.md "Distributed runs"): a small TCP key-value store that
// rank 0 serves at MASTER_ADDR:MASTER_PORT. Ranks use it to exchange NCCL
// unique ids and Gloo addresses, to meet at barriers before a communicator
// exists, and to publish heartbeats that the watchdog reads.
//
//   rank 0:    StoreServer server(master_addr, master_port, job_token_from_env());
//   every rank: StoreClient store(master_addr, master_port, job_token_from_env(), 300);
//              store.barrier("init", rank, world, 300);
//              PrefixStore tp(store, "tp0");   // a communicator group's own key space
//              tp.set("nccl_id", id);  ...  tp.get("nccl_id", 300);
//
// Clients may start before the server: they retry with exponential backoff
// until their connect timeout. Every wait has a timeout, and the timeout error
// names what is missing (the keys, or the ranks that never reached a barrier).
//
// The first message of every connection presents a job token, so that a rank
// of another job that happens to use the same port is turned away with a
// clear message instead of silently joining (or corrupting) this job's
// rendezvous. The token travels in clear text and is derived from launcher
// ids: it guards against accidents, not against an attacker on the network.
// Against those, a server given a secret (TRAINER_STORE_SECRET,
// comm/store_secret.h) admits only clients that prove they hold the same one,
// and such clients accept only a server that proves it too.
//
// Limits (a rank with a bug, or a stray client, must not take rank 0 down):
// keys are 1..4096 bytes, values at most 64 MiB, the total stored bytes are
// capped (StoreServerOptions), and a connection that sends anything malformed,
// truncated, oversized or unknown is closed without affecting the others.
//
// Wire format: comm/store_protocol.h.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer {

inline constexpr size_t kStoreMaxKeyBytes = 4096;
inline constexpr size_t kStoreMaxValueBytes = size_t{64} << 20;

// Any store failure: cannot connect, rejected token, server error, lost
// connection. The message is meant to be shown to the user as it is.
class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The store and this process disagree about the secret (TRAINER_STORE_SECRET
// missing on one side, or different): a setup mistake, not a transient
// failure, so it is never retried and main() exits with code 2.
class StoreAuthError : public StoreError {
 public:
  using StoreError::StoreError;
};

// A wait (get, wait, barrier) that ran out of time; the message names the
// missing keys or ranks.
class StoreTimeout : public StoreError {
 public:
  using StoreError::StoreError;
};

// The job token presented to the store. The first of these that is set wins:
//   TRAINER_JOB_TOKEN                      explicit override
//   TORCHELASTIC_RUN_ID                    torchrun
//   SLURM_JOB_ID (+ SLURM_STEP_ID)         srun
//   OMPI_MCA_orte_ess_jobid, PMIX_NAMESPACE mpirun (OpenMPI 4 / 5)
// and otherwise a fixed default (see the comment in store_client.cpp).
std::string job_token_from_env();

// One key as seen by multi_get. `age_s` is measured by the server's clock
// since the key was last written, so clocks of different hosts never mix.
struct StoreEntry {
  bool present = false;
  std::string value;
  double age_s = 0;
};

// The last heartbeat of one rank (Store::read_heartbeats).
struct Heartbeat {
  int rank = 0;
  bool present = false;  // false: this rank never sent one
  int64_t step = 0;
  double age_s = 0;      // seconds since the server received it
};

// The operations every store offers; StoreClient talks to the server,
// PrefixStore narrows another store to a key space. Timeouts are in seconds:
// <= 0 checks once without waiting, +infinity waits forever.
class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits until the key exists. Throws StoreTimeout:
  //   "store: key 'nccl_id/dp0' not set within 30 s"
  virtual std::string get(const std::string& key, double timeout_s) = 0;
  // Atomic counter (stored as decimal text, so get() reads it); a missing key
  // counts as 0. Returns the value after adding.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // True when every key exists.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits until every key exists; the timeout error lists the missing ones.
  virtual void wait(const std::vector<std::string>& keys, double timeout_s) = 0;
  // Returns whether the key existed.
  virtual bool del(const std::string& key) = 0;
  // Reads many keys in one round trip without waiting.
  virtual std::vector<StoreEntry> multi_get(const std::vector<std::string>& keys) = 0;

  // Returns once all `world` ranks have called barrier(name) for the same
  // time; a name can be reused (each call is the next generation). Arrivals
  // are recorded per rank under barrier/<name>/<rank> (a counter of the
  // generations that rank reached), so a timeout can say who is missing:
  //   "store barrier 'init' timed out after 30 s: ranks 2, 3 of 4 never arrived"
  void barrier(const std::string& name, int rank, int world, double timeout_s);

  // Watchdog support: each rank publishes its step under heartbeat/<rank>;
  // read_heartbeats returns one entry per rank 0..world-1.
  void set_heartbeat(int rank, int64_t step);
  std::vector<Heartbeat> read_heartbeats(int world);
};

// A connection to the store server. Thread-safe, but calls on one client are
// serialised: a thread blocked in get/wait/barrier holds the connection, so a
// component that must not wait behind others (the watchdog) opens its own.
class StoreClient final : public Store {
 public:
  // Connects, retrying with exponential backoff (and jitter, so thousands of
  // ranks do not hammer a starting server in lock step) until
  // connect_timeout_s has passed. `request_timeout_s` bounds how long a
  // non-waiting request may take before the server is declared unresponsive.
  // `secret` (store_secret_from_env() in the trainer; "" for none) must be the
  // server's. Throws StoreError: cannot connect, or the server rejected the
  // token; StoreAuthError: the secrets do not match (or one side has none).
  StoreClient(std::string host, int port, std::string token, double connect_timeout_s,
              double request_timeout_s = 300, std::string secret = "");
  ~StoreClient() override;
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, double timeout_s) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, double timeout_s) override;
  bool del(const std::string& key) override;
  std::vector<StoreEntry> multi_get(const std::vector<std::string>& keys) override;

  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  // Sends one request frame and returns the reply body (status byte first).
  // Throws StoreError on I/O failure; the connection is then unusable.
  std::string round_trip(const std::string& frame, const char* op, double reply_timeout_s);
  std::string endpoint() const;

  std::string host_;
  int port_;
  double request_timeout_s_;
  int fd_ = -1;
  std::string broken_;  // why the connection was dropped, once it was
  std::mutex mu_;
};

// "<prefix>/<key>": the key space of one communicator group.
std::string prefixed(const std::string& prefix, const std::string& key);

// Another store seen through a key prefix, so that groups (tp0, dp3, pp1, ...)
// can use the same key names without colliding. Does not own `inner`.
class PrefixStore final : public Store {
 public:
  PrefixStore(Store& inner, std::string prefix) : inner_(inner), prefix_(std::move(prefix)) {}

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, double timeout_s) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, double timeout_s) override;
  bool del(const std::string& key) override;
  std::vector<StoreEntry> multi_get(const std::vector<std::string>& keys) override;

  const std::string& prefix() const { return prefix_; }

 private:
  std::vector<std::string> all(const std::vector<std::string>& keys) const;
  Store& inner_;
  std::string prefix_;
};

struct StoreServerOptions {
  // Sum of key + value + per-entry overhead over all stored keys; a set or
  // add beyond it fails with an error (the connection stays usable).
  size_t max_total_bytes = size_t{1} << 30;
  // Connections beyond this are accepted and closed at once.
  size_t max_connections = 65536;
  // A connection that has not presented a token by then is closed, so that
  // port scanners and stuck peers do not keep file descriptors forever.
  double handshake_timeout_s = 60;
  // One line per event (rejected token, malformed message); default stderr.
  // Each kind of message is logged a few times, then suppressed.
  std::function<void(const std::string&)> log;
  // Non-empty: every client must prove it holds this secret
  // (comm/store_secret.h); the trainer passes TRAINER_STORE_SECRET.
  std::string secret;
};

// Counters for tests and diagnostics; read from any thread.
struct StoreServerStats {
  int64_t keys = 0;
  int64_t stored_bytes = 0;      // as counted against max_total_bytes
  int64_t connections = 0;       // open now
  int64_t accepted = 0;          // connections accepted so far
  int64_t rejected_tokens = 0;
  int64_t refused_secrets = 0;   // connections without the secret, or with another
  int64_t protocol_errors = 0;   // connections closed for malformed input
  int64_t handshake_timeouts = 0;
  int64_t requests = 0;          // well-formed requests served
  int64_t pending_waits = 0;
};

// The server: a background thread with an epoll loop over non-blocking
// sockets, so a slow or silent client never holds up the others.
class StoreServer {
 public:
  // Listens on host:port (IPv4; "localhost" and names resolve; "" or
  // "0.0.0.0" listens on every interface). Port 0 picks a free port (tests).
  // Throws StoreError when the address cannot be bound, naming it.
  StoreServer(std::string host, int port, std::string token, StoreServerOptions options = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const;
  StoreServerStats stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainer
