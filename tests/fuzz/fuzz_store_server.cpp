// The rendezvous store server's decoding of what a client sends: the bytes of
// one TCP connection, framed and handled exactly as the server's event loop
// does once they have arrived (Impl::run_requests: frame lengths, the HELLO
// and AUTH handshake, every request's fields, parking waits). This is the
// part of the trainer that faces the network before any authentication.
//
// The server keeps that code in its Impl, private to store_server.cpp, and
// reaches it only from an epoll loop on a real socket; including the file
// lets the harness drive one fresh Impl per input without a thread or a
// listening port, so every input is replayed deterministically. Replies go
// to one end of a socket pair, as they would to the client.
#include "comm/store_server.cpp"  // NOLINT: on purpose, see above

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace {

using trainer::StoreServer;
using trainer::Conn;

// A connection with its client end; authed: as if its HELLO was accepted.
Conn& open_conn(StoreServer::Impl& s, std::vector<int>& client_fds, bool authed) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0) std::abort();
  client_fds.push_back(fds[1]);
  auto c = std::make_unique<Conn>();
  c->id = s.next_id++;
  c->fd = fds[0];
  c->peer = "fuzz:" + std::to_string(c->id);
  c->opened = trainer::Clock::now();
  c->authed = authed;
  Conn& ref = *c;
  s.conns.emplace(ref.id, std::move(c));
  return ref;
}

void run(const std::string& input, const std::string& secret) {
  StoreServer::Impl s;
  s.token = "fuzz-job";
  s.secret = secret;
  s.opt.secret = secret;
  s.opt.log = [](const std::string&) {};
  // Small enough that "the store is full" is reachable from one input.
  s.opt.max_total_bytes = size_t{1} << 20;
  std::vector<int> client_fds;

  // The first connection gets the whole input and must handshake. When one
  // parks on a wait, the rest of the input goes to a new connection (past
  // the handshake), whose SET or ADD may answer the parked one: a few
  // connections let the fuzzer reach waking as well as parsing.
  Conn* c = &open_conn(s, client_fds, false);
  c->in = input;
  for (int conns = 1;; ++conns) {
    const uint64_t id = c->id;
    s.run_requests(*c);
    s.run_ready();
    auto it = s.conns.find(id);
    if (it == s.conns.end() || !it->second->waiting || it->second->in.empty() || conns == 8) break;
    std::string rest = std::move(it->second->in);
    it->second->in.clear();
    c = &open_conn(s, client_fds, true);
    c->in = std::move(rest);
  }
  // The client hangs up: parked waits are dropped and their keys unwatched.
  std::vector<uint64_t> ids;
  for (const auto& [id, conn] : s.conns) ids.push_back(id);
  for (uint64_t id : ids) s.close_conn(id);
  if (!s.waiters.empty() || !s.deadlines.empty()) std::abort();  // a closed connection left a wait behind
  for (int fd : client_fds) ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  run(input, "");             // a server without a secret: HELLO with the job token opens it
  run(input, "fuzz-secret");  // with one: HELLO, CHALLENGE, AUTH (the proof cannot match; the refusal path)
  return 0;
}
