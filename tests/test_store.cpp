// The rendezvous store (comm/store.h): operations across threads and forked
// processes, waits and their timeout messages, the job token, limits, and a
// bounded fuzz of the wire protocol after which the server must still serve
// and must not have grown. Loopback only.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>

#include "tests/error_of.h"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "e2e_util.h"
#include "comm/store.h"
#include "comm/store_protocol.h"

using namespace trainer;
namespace wire = trainer::store_wire;

namespace {

using e2e::free_port;

using Clock = std::chrono::steady_clock;
const std::string kToken = "test-token";
const std::string kHost = "127.0.0.1";

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

using trainer::test::error_of;

// "k7": built by appending (GCC 12 warns falsely about "k" + std::to_string(i)).
std::string numbered(const char* prefix, int i) {
  std::string s = prefix;
  s += std::to_string(i);
  return s;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Collects the server's log lines instead of printing them.
struct LogSink {
  std::mutex mu;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> fn() {
    return [this](const std::string& l) {
      std::lock_guard<std::mutex> g(mu);
      lines.push_back(l);
    };
  }
  size_t count(const std::string& part) {
    std::lock_guard<std::mutex> g(mu);
    size_t n = 0;
    for (const auto& l : lines) n += contains(l, part);
    return n;
  }
};

StoreServerOptions quiet(LogSink& sink) {
  StoreServerOptions o;
  o.log = sink.fn();
  return o;
}

// A raw TCP connection for feeding the server bytes a real client never sends.
struct Raw {
  int fd = -1;
  explicit Raw(int port) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ~Raw() { close(); }
  void send(const std::string& bytes) {
    size_t off = 0;
    while (fd >= 0 && off < bytes.size()) {
      const ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        off += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        pollfd p{fd, POLLOUT, 0};
        if (::poll(&p, 1, 200) <= 0) return;  // the server stopped reading: fine, give up
        continue;
      }
      return;  // closed by the server
    }
  }
  // Reads whatever arrives within `ms`; returns true when the server closed.
  bool drain(int ms, std::string* got = nullptr) {
    const auto end = Clock::now() + std::chrono::milliseconds(ms);
    char buf[65536];
    while (fd >= 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(left, 0))) <= 0) return false;
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) return true;
      if (got) got->append(buf, static_cast<size_t>(n));
    }
    return true;
  }
  void close(bool reset = false) {
    if (fd < 0) return;
    if (reset) {
      linger l{1, 0};  // RST instead of FIN: the abrupt way peers die
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    }
    ::close(fd);
    fd = -1;
  }
};

// A HELLO without a secret (empty client nonce).
std::string hello(const std::string& token) {
  return std::move(
             wire::Writer().u8(uint8_t(wire::Op::Hello)).u32(wire::kMagic).u32(wire::kVersion).str(token).str(""))
      .frame();
}

size_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  size_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// Polls until cond() holds or the time is up.
bool eventually(const std::function<bool()>& cond, double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

}  // namespace

TEST_CASE("store: set, get, add, check, delete and multi_get", "[store]") {
  LogSink sink;
  StoreServer server(kHost, 0, kToken, quiet(sink));
  REQUIRE(server.port() > 0);
  StoreClient c("localhost", server.port(), kToken, 10);  // names resolve

  c.set("a", "hello");
  CHECK(c.get("a", 1) == "hello");
  c.set("a", std::string("bin\0ary", 7));
  CHECK(c.get("a", 1) == std::string("bin\0ary", 7));
  const std::string binary_key("\x00\xff/k'ey", 7);
  c.set(binary_key, "any bytes are a key");
  CHECK(c.get(binary_key, 1) == "any bytes are a key");
  CHECK(c.del(binary_key));
  c.set("empty", "");
  CHECK(c.get("empty", 1).empty());

  CHECK(c.add("n", 5) == 5);
  CHECK(c.add("n", -2) == 3);
  CHECK(c.add("n", 0) == 3);
  CHECK(c.get("n", 1) == "3");  // counters are decimal text

  CHECK(c.check({"a", "n"}));
  CHECK_FALSE(c.check({"a", "missing"}));
  CHECK(c.check({}));

  CHECK(c.del("a"));
  CHECK_FALSE(c.del("a"));
  CHECK_FALSE(c.check({"a"}));

  const auto entries = c.multi_get({"n", "a", "empty"});
  REQUIRE(entries.size() == 3);
  CHECK(entries[0].present);
  CHECK(entries[0].value == "3");
  CHECK(entries[0].age_s >= 0);
  CHECK(entries[0].age_s < 5);
  CHECK_FALSE(entries[1].present);
  CHECK(entries[2].present);

  // A failed request leaves the connection usable.
  CHECK(contains(error_of([&] { c.add("empty", 1); }), "not a counter"));
  CHECK(contains(error_of([&] { c.add("n", INT64_MAX); }), "overflows"));
  CHECK(c.add("n", 1) == 4);

  const auto st = server.stats();
  CHECK(st.keys == 2);
  CHECK(st.connections == 1);
  CHECK(st.protocol_errors == 0);
}

TEST_CASE("store: counters and keys across client threads", "[store]") {
  LogSink sink;
  StoreServer server(kHost, 0, kToken, quiet(sink));
  constexpr int kThreads = 8, kAdds = 200;
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        StoreClient c(kHost, server.port(), kToken, 10);
        for (int i = 0; i < kAdds; ++i) {
          seen[t].push_back(c.add("counter", 1));
          c.set(numbered("t", t) + "/" + std::to_string(i % 10), std::to_string(i));
        }
        // Every thread reads what the others wrote.
        for (int o = 0; o < kThreads; ++o)
          if (c.get(numbered("t", o) + "/9", 10).empty()) errors[t] = "empty value";
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& e : errors) CHECK(e.empty());
  std::set<int64_t> all;
  for (const auto& v : seen) all.insert(v.begin(), v.end());
  CHECK(all.size() == size_t{kThreads * kAdds});  // every add returned a distinct value
  CHECK(*all.begin() == 1);
  CHECK(*all.rbegin() == kThreads * kAdds);

  // One client shared by threads: calls are serialised, none is lost.
  StoreClient shared(kHost, server.port(), kToken, 10);
  std::vector<std::thread> users;
  for (int t = 0; t < 4; ++t)
    users.emplace_back([&] {
      for (int i = 0; i < 100; ++i) shared.add("shared", 1);
    });
  for (auto& th : users) th.join();
  CHECK(shared.add("shared", 0) == 400);
}

TEST_CASE("store: get and wait block until the keys are set, or time out naming them", "[store]") {
  LogSink sink;
  StoreServer server(kHost, 0, kToken, quiet(sink));
  StoreClient waiter(kHost, server.port(), kToken, 10);
  StoreClient setter(kHost, server.port(), kToken, 10);

  const auto t0 = Clock::now();
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    setter.set("nccl_id/dp0", "id-bytes");
  });
  CHECK(waiter.get("nccl_id/dp0", 10) == "id-bytes");
  CHECK(seconds_since(t0) >= 0.1);
  later.join();

  std::thread later2([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    setter.set("w1", "x");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    setter.add("w2", 1);
  });
  waiter.wait({"w1", "w2"}, 10);
  later2.join();

  auto t1 = Clock::now();
  CHECK(error_of([&] { waiter.get("nccl_id/dp1", 0.2); }) == "store: key 'nccl_id/dp1' not set within 0.2 s");
  CHECK(seconds_since(t1) >= 0.19);
  CHECK(error_of([&] { waiter.wait({"w1", "a", "w2", "b"}, 0.1); }) ==
        "store: keys 'a', 'b' not set within 0.1 s");
  // A timeout is a StoreTimeout, and the connection stays usable.
  CHECK_THROWS_AS(waiter.get("never", 0), StoreTimeout);
  CHECK(waiter.get("w1", 0) == "x");
  // Many missing keys: the count and the first few.
  std::vector<std::string> many;
  for (int i = 0; i < 100; ++i) many.push_back(numbered("m", i));
  const std::string msg = error_of([&] { waiter.wait(many, 0.05); });
  CHECK(contains(msg, "store: 100 keys not set within 0.05 s, among them 'm0', 'm1'"));
  CHECK(eventually([&] { return server.stats().pending_waits == 0; }, 2));
}

TEST_CASE("store: clients retry until a late server starts, and a connect timeout says why", "[store]") {
  LogSink sink;
  const int port = free_port();
  std::string err;
  std::string value;
  std::thread client([&] {
    try {
      StoreClient c(kHost, port, kToken, 20);
      value = c.get("ready", 10);
    } catch (const std::exception& e) {
      err = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  {
    StoreServer server(kHost, port, kToken, quiet(sink));
    StoreClient c(kHost, port, kToken, 10);
    c.set("ready", "yes");
    client.join();
  }
  CHECK(err.empty());
  CHECK(value == "yes");

  const auto t0 = Clock::now();
  const std::string msg = error_of([&] { StoreClient c(kHost, port, kToken, 0.3); });
  CHECK(contains(msg, "could not connect to 127.0.0.1:" + std::to_string(port) + " within 0.3 s"));
  CHECK(contains(msg, "MASTER_ADDR"));
  CHECK(seconds_since(t0) < 3);

  // The port is taken: the error names the address.
  StoreServer a(kHost, 0, kToken, quiet(sink));
  const std::string bind_err = error_of([&] { StoreServer b(kHost, a.port(), kToken, quiet(sink)); });
  CHECK(contains(bind_err, "cannot listen on 127.0.0.1:" + std::to_string(a.port())));
}

TEST_CASE("store: barrier across threads, reused, and its timeout names the missing ranks", "[store]") {
  LogSink sink;
  StoreServer server(kHost, 0, kToken, quiet(sink));
  constexpr int kWorld = 6, kRounds = 30;
  std::atomic<int> arrived{0};
  std::atomic<int> early{0};
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      try {
        StoreClient c(kHost, server.port(), kToken, 10);
        for (int i = 0; i < kRounds; ++i) {
          if (r == i % kWorld) std::this_thread::sleep_for(std::chrono::milliseconds(2));
          ++arrived;
          c.barrier("loop", r, kWorld, 30);
          // Nobody leaves round i before everyone has entered it.
          if (arrived.load() < kWorld * (i + 1)) ++early;
        }
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& e : errors) CHECK(e.empty());
  CHECK(early.load() == 0);
  // Old generations are cleaned up: per-rank counters plus the last round's keys.
  CHECK(eventually([&] { return server.stats().keys <= kWorld + 4; }, 2));

  auto partial = [&](const std::string& name, int world, std::vector<int> present, double timeout) {
    std::vector<std::string> msgs(present.size());
    std::vector<std::thread> ts;
    for (size_t i = 0; i < present.size(); ++i)
      ts.emplace_back([&, i] {
        StoreClient c(kHost, server.port(), kToken, 10);
        msgs[i] = error_of([&] { c.barrier(name, present[i], world, timeout); });
      });
    for (auto& t : ts) t.join();
    for (size_t i = 1; i < msgs.size(); ++i) CHECK(msgs[i] == msgs[0]);
    return msgs[0];
  };
  CHECK(partial("init", 4, {0, 1}, 0.3) == "store barrier 'init' timed out after 0.3 s: ranks 2, 3 of 4 never arrived");
  CHECK(partial("one", 3, {0, 2}, 0.2) == "store barrier 'one' timed out after 0.2 s: rank 1 of 3 never arrived");
  CHECK(partial("wide", 10, {0, 5}, 0.2) ==
        "store barrier 'wide' timed out after 0.2 s: ranks 1-4, 6-9 of 10 never arrived");

  StoreClient c(kHost, server.port(), kToken, 10);
  CHECK(contains(error_of([&] { c.barrier("x", 4, 4, 1); }), "rank 4 is not in a world of 4"));
}

TEST_CASE("store: barrier and counters across forked processes, server started last", "[store]") {
  constexpr int kWorld = 4, kRounds = 20;
  const int port = free_port();
  auto rank_body = [&](int rank) {
    StoreClient c(kHost, port, kToken, 30);
    for (int i = 0; i < kRounds; ++i) {
      c.add("arrive", 1);
      c.barrier("procs", rank, kWorld, 30);
      const int64_t n = std::stoll(c.get("arrive", 1));
      if (n < kWorld * (i + 1))
        throw std::runtime_error("rank " + std::to_string(rank) + " left round " + std::to_string(i) +
                                 " early (" + std::to_string(n) + " arrivals)");
    }
    c.set("pid/" + std::to_string(rank), std::to_string(::getpid()));
    c.barrier("end", rank, kWorld, 30);
  };
  std::vector<pid_t> children;
  for (int rank = 1; rank < kWorld; ++rank) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // The child must not return into Catch2: _exit with the verdict.
      int code = 0;
      try {
        rank_body(rank);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child rank %d: %s\n", rank, e.what());
        code = 1;
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  LogSink sink;
  std::string parent_error;
  {
    StoreServer server(kHost, port, kToken, quiet(sink));
    parent_error = error_of([&] { rank_body(0); });
    StoreClient c(kHost, port, kToken, 10);
    for (int r = 1; r < kWorld; ++r) CHECK(c.get("pid/" + std::to_string(r), 5) == std::to_string(children[r - 1]));
    // Children exit after the "end" barrier; keep the server up until they have.
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    for (pid_t pid : children) {
      int status = -1;
      while (::waitpid(pid, &status, WNOHANG) == 0) {
        if (Clock::now() > deadline) {
          ::kill(pid, SIGKILL);
          ::waitpid(pid, &status, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      CHECK(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == 0);
    }
  }
  CHECK(parent_error == "<no error>");
}

TEST_CASE("store: a wrong job token is rejected, logged once, and others are still served", "[store]") {
  LogSink sink;
  StoreServer server(kHost, 0, kToken, quiet(sink));
  StoreClient good(kHost, server.port(), kToken, 10);
  good.set("k", "v");
  const std::string msg = error_of([&] { StoreClient bad(kHost, server.port(), "another-job", 10); });
  CHECK(msg == "store at 127.0.0.1:" + std::to_string(server.port()) +
                   " rejected this process's job token: is another job using the port?");
  CHECK(sink.count("wrong job token") == 1);
  CHECK(sink.count("") == 1);
  CHECK(server.stats().rejected_tokens == 1);
  CHECK(good.get("k", 1) == "v");
  StoreClient again(kHost, server.port(), kToken, 10);
  CHECK(again.get("k", 1) == "v");
  CHECK(eventually([&] { return server.stats().connections == 2; }, 2));
}

TEST_CASE("store: size limits and a full store give errors, not a dead server", "[store]") {
  LogSink sink;
  StoreServerOptions o = quiet(sink);
  o.max_total_bytes = 1 << 20;
  StoreServer server(kHost, 0, kToken, o);
  StoreClient c(kHost, server.port(), kToken, 10);
  CHECK(contains(error_of([&] { c.set(std::string(4097, 'k'), "v"); }), "keys must be 1..4096 bytes"));
  CHECK(contains(error_of([&] { c.set("", "v"); }), "keys must be 1..4096 bytes"));
  c.set(std::string(4096, 'k'), "max-size key");
  CHECK(contains(error_of([&] { c.set("big", std::string(kStoreMaxValueBytes + 1, 'x')); }), "-byte limit"));

  const std::string chunk(400 * 1024, 'x');
  c.set("a", chunk);
  c.set("a", chunk);  // overwriting is not counted twice
  c.set("b", chunk);
  CHECK(contains(error_of([&] { c.set("c", chunk); }), "the store is full"));
  CHECK_FALSE(c.check({"c"}));
  CHECK(c.del("b"));
  c.set("c", chunk);
  CHECK(server.stats().stored_bytes <= int64_t{1} << 20);
  CHECK(c.get("c", 1).size() == chunk.size());
  CHECK(server.stats().protocol_errors == 0);

  // The full value size travels (server with the default, larger cap).
  StoreServer big(kHost, 0, kToken, quiet(sink));
  StoreClient cb(kHost, big.port(), kToken, 10);
  const std::string value(kStoreMaxValueBytes, 'v');
  cb.set("max", value);
  CHECK(cb.get("max", 10) == value);
}

TEST_CASE("store: stalled and silent connections do not block others", "[store]") {
  LogSink sink;
  StoreServerOptions o = quiet(sink);
  o.handshake_timeout_s = 0.5;
  StoreServer server(kHost, 0, kToken, o);

  Raw silent(server.port());  // connects, never speaks
  Raw half(server.port());    // authenticates, then half a message
  half.send(hello(kToken));
  const std::string set_frame =
      std::move(wire::Writer().u8(uint8_t(wire::Op::Set)).str("stalled").str(std::string(1000, 'z'))).frame();
  half.send(set_frame.substr(0, 20));
  Raw big_half(server.port());  // declares a large frame, sends a little of it
  big_half.send(hello(kToken));
  big_half.send(std::string("\x00\x00\x10\x00", 4) + "xxxxxxxx");  // declares 1 MiB
  REQUIRE(silent.fd >= 0);
  REQUIRE(half.fd >= 0);

  const auto t0 = Clock::now();
  StoreClient c(kHost, server.port(), kToken, 10);
  StoreClient c2(kHost, server.port(), kToken, 10);
  // Checked after join: Catch2 assertions are not thread-safe.
  std::string waited, wait_error;
  std::thread waiter([&] { wait_error = error_of([&] { waited = c2.get("k99", 10); }); });
  for (int i = 0; i < 100; ++i) {
    c.set(numbered("k", i), std::to_string(i));
    CHECK(c.get(numbered("k", i), 1) == std::to_string(i));
  }
  waiter.join();
  CHECK(wait_error == "<no error>");
  CHECK(waited == "99");
  CHECK(seconds_since(t0) < 5);
  CHECK_FALSE(c.check({"stalled"}));

  // The silent one is closed after the handshake timeout; the authenticated
  // stalled ones stay (a rank may legitimately pause between messages).
  CHECK(silent.drain(3000));
  CHECK(server.stats().handshake_timeouts == 1);
  CHECK_FALSE(half.drain(100));
  // The stalled message completes late and is served in order.
  half.send(set_frame.substr(20));
  std::string reply;
  half.drain(200, &reply);
  CHECK(reply.size() == 5);  // length 1, status OK
  CHECK(c.get("stalled", 1) == std::string(1000, 'z'));
}

TEST_CASE("store: a client waiting when the server goes away gets a clear error", "[store]") {
  LogSink sink;
  auto server = std::make_unique<StoreServer>(kHost, 0, kToken, quiet(sink));
  StoreClient c(kHost, server->port(), kToken, 10);
  std::string err;
  std::thread t([&] { err = error_of([&] { c.get("never", 30); }); });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const auto t0 = Clock::now();
  server.reset();
  t.join();
  CHECK(seconds_since(t0) < 5);
  CHECK(contains(err, "closed the connection during get (did rank 0 exit?)"));
  CHECK(contains(error_of([&] { c.set("a", "b"); }), "connection unusable after an earlier error"));
}

TEST_CASE("store: a client that reaches some other service says so", "[store]") {
  // A fake service that answers like a web server.
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(::listen(lfd, 4) == 0);
  socklen_t len = sizeof(a);
  getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  std::thread fake([&] {
    const int fd = ::accept(lfd, nullptr, nullptr);
    const std::string http = "HTTP/1.1 400 Bad Request\r\n\r\n";
    [[maybe_unused]] ssize_t n = ::send(fd, http.data(), http.size(), MSG_NOSIGNAL);
    char buf[256];
    while (::recv(fd, buf, sizeof(buf), 0) > 0) {
    }
    ::close(fd);
  });
  const std::string msg = error_of([&] { StoreClient c(kHost, ntohs(a.sin_port), kToken, 5); });
  fake.join();
  ::close(lfd);
  CHECK(contains(msg, "not a store reply: is another service using the port?"));
}

TEST_CASE("store: prefix stores, heartbeats, and the job token from the environment", "[store]") {
  LogSink sink;
  StoreServer server(kHost, 0, kToken, quiet(sink));
  StoreClient c(kHost, server.port(), kToken, 10);
  PrefixStore tp0(c, "tp0"), tp1(c, "tp1");
  tp0.set("nccl_id", "zero");
  tp1.set("nccl_id", "one");
  CHECK(tp0.get("nccl_id", 1) == "zero");
  CHECK(tp1.get("nccl_id", 1) == "one");
  CHECK(c.get(prefixed("tp0", "nccl_id"), 1) == "zero");
  CHECK(c.get("tp0/nccl_id", 1) == "zero");
  CHECK(tp0.add("n", 2) == 2);
  CHECK(tp1.add("n", 5) == 5);
  CHECK(tp0.check({"nccl_id", "n"}));
  CHECK(tp0.multi_get({"n"})[0].value == "2");
  CHECK(error_of([&] { tp1.get("x", 0.05); }) == "store: key 'tp1/x' not set within 0.05 s");
  // A group barrier lives in the group's key space.
  std::thread other([&] {
    StoreClient c2(kHost, server.port(), kToken, 10);
    PrefixStore g(c2, "tp0");
    g.barrier("init", 1, 2, 10);
  });
  tp0.barrier("init", 0, 2, 10);
  other.join();
  CHECK(c.check({"tp0/barrier/init/0", "tp0/barrier/init/1"}));

  c.set_heartbeat(0, 100);
  c.set_heartbeat(2, 98);
  const auto hb = c.read_heartbeats(3);
  REQUIRE(hb.size() == 3);
  CHECK(hb[0].present);
  CHECK(hb[0].step == 100);
  CHECK(hb[0].age_s < 5);
  CHECK_FALSE(hb[1].present);
  CHECK(hb[1].rank == 1);
  CHECK(hb[2].step == 98);

  // Environment: save, vary, restore.
  const char* names[] = {"TRAINER_JOB_TOKEN", "TORCHELASTIC_RUN_ID", "OMPI_MCA_orte_ess_jobid",
                         "PMIX_NAMESPACE",    "SLURM_JOB_ID",        "SLURM_STEP_ID"};
  std::map<std::string, std::string> saved;
  for (const char* n : names) {
    if (const char* v = std::getenv(n)) saved[n] = v;
    ::unsetenv(n);
  }
  CHECK(job_token_from_env() == "trainer-default-job-token");
  ::setenv("SLURM_JOB_ID", "123", 1);
  CHECK(job_token_from_env() == "slurm:123");
  ::setenv("SLURM_STEP_ID", "4", 1);
  CHECK(job_token_from_env() == "slurm:123.4");
  ::setenv("PMIX_NAMESPACE", "ns", 1);
  CHECK(job_token_from_env() == "pmix:ns");
  ::setenv("OMPI_MCA_orte_ess_jobid", "777", 1);
  CHECK(job_token_from_env() == "ompi:777");
  ::setenv("TORCHELASTIC_RUN_ID", "abc", 1);
  CHECK(job_token_from_env() == "torchelastic:abc");
  ::setenv("TRAINER_JOB_TOKEN", "mine", 1);
  CHECK(job_token_from_env() == "mine");
  for (const char* n : names) ::unsetenv(n);
  for (const auto& [n, v] : saved) ::setenv(n.c_str(), v.c_str(), 1);
}

// The store fuzz's bytes: well-formed requests with arbitrary contents,
// requests whose fields lie, and whole connections of ten kinds, all from
// one seeded generator.
struct StoreFuzz {
  std::mt19937_64 rng{12345};

  uint64_t rnd(uint64_t n) { return n == 0 ? 0 : rng() % n; }
  std::string random_bytes(size_t n) {
    std::string s(n, '\0');
    for (auto& ch : s) ch = static_cast<char>(rng());
    return s;
  }
  static std::string le32(uint32_t v) {
    std::string s(4, '\0');
    for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    return s;
  }
  std::string random_key() {
    if (rnd(8) == 0) return random_bytes(1 + rnd(40));
    return "fuzz/k" + std::to_string(rnd(64));
  }
  std::vector<std::string> random_keys() {
    std::vector<std::string> ks(rnd(6));
    for (auto& k : ks) k = random_key();
    return ks;
  }

  // A well-formed request with plausible but arbitrary contents.
  std::string valid_op() {
    using wire::Op;
    wire::Writer w;
    switch (rnd(7)) {
      case 0: return std::move(w.u8(uint8_t(Op::Set)).str(random_key()).str(random_bytes(rnd(64 * 1024)))).frame();
      case 1: return std::move(w.u8(uint8_t(Op::Get)).str(random_key()).i64(int64_t(rnd(3)))).frame();
      case 2: return std::move(w.u8(uint8_t(Op::Add)).str(random_key()).i64(int64_t(rng()))).frame();
      case 3: return std::move(w.u8(uint8_t(Op::Check)).keys(random_keys())).frame();
      case 4: return std::move(w.u8(uint8_t(Op::Wait)).keys(random_keys()).i64(int64_t(rnd(3)) - 1)).frame();
      case 5: return std::move(w.u8(uint8_t(Op::Del)).str(random_key())).frame();
      default: return std::move(w.u8(uint8_t(Op::MultiGet)).keys(random_keys())).frame();
    }
  }

  // A request whose fields lie: lengths and counts that do not match, huge
  // counts, unknown ops, trailing junk.
  std::string garbage_op() {
    std::string body(1, static_cast<char>(rnd(12)));
    const int fields = static_cast<int>(rnd(5));
    for (int f = 0; f < fields; ++f) {
      switch (rnd(5)) {
        case 0: body += le32(static_cast<uint32_t>(rng())); break;                    // wild length/count
        case 1: body += le32(static_cast<uint32_t>(rnd(8))) + random_bytes(rnd(8)); break;  // near miss
        case 2: body += random_bytes(8); break;                                       // an i64
        case 3: body += le32(0xFFFFFFFFu); break;
        default: body += le32(5000) + random_bytes(rnd(100)); break;                  // key over the limit
      }
    }
    return le32(static_cast<uint32_t>(body.size())) + body;
  }

  // The bytes of one connection of the given kind (see the names in the test).
  std::string connection(int kind) {
    std::string bytes;
    switch (kind) {
      case 0: bytes = random_bytes(rnd(300)); break;
      case 1: {
        const uint32_t lens[] = {0xFFFFFFFFu, 0x80000000u, uint32_t(wire::kMaxFrameBytes + 1),
                                 uint32_t(wire::kMaxHelloFrameBytes + 1), static_cast<uint32_t>(rng())};
        bytes = le32(lens[rnd(5)]) + random_bytes(rnd(64));
        break;
      }
      case 2: {
        const std::string h = hello(kToken);
        bytes = h.substr(0, rnd(h.size()));
        break;
      }
      case 3: bytes = hello(kToken) + le32(rnd(2) ? 0xFFFFFFFFu : uint32_t(wire::kMaxFrameBytes + 1)) + "xyz"; break;
      case 4: {
        const std::string op = valid_op();
        bytes = hello(kToken) + op.substr(0, rnd(op.size()));
        break;
      }
      case 5: bytes = hello(kToken) + garbage_op(); break;
      case 6: bytes = hello("not-" + kToken) + valid_op(); break;
      case 7: {
        bytes = hello(kToken);
        for (int i = 0, n = 1 + static_cast<int>(rnd(5)); i < n; ++i) bytes += valid_op();
        break;
      }
      case 8: {
        const std::string frames[] = {le32(0), le32(1) + std::string(1, '\0'), le32(1) + std::string(1, '\xff'),
                                      hello(kToken)};
        bytes = hello(kToken) + frames[rnd(4)];
        break;
      }
      default: {
        wire::Writer w;
        w.u8(uint8_t(wire::Op::Hello)).u32(rnd(2) ? wire::kMagic : static_cast<uint32_t>(rng()));
        w.u32(rnd(2) ? wire::kVersion + 1 : static_cast<uint32_t>(rng())).str(kToken);
        bytes = std::move(w).frame();
      }
    }
    return bytes;
  }
};

TEST_CASE("store: fuzzed connections neither crash the server nor grow it", "[store]") {
  LogSink sink;
  StoreServerOptions o = quiet(sink);
  o.max_total_bytes = 2 << 20;  // small, so the fuzz reaches "full"
  StoreServer server(kHost, 0, kToken, o);
  const int port = server.port();
  StoreClient legit(kHost, port, kToken, 10);
  legit.set("canary", "alive");

  StoreFuzz fz;

  const char* names[] = {"random bytes",   "huge length prefix", "truncated handshake", "authed huge prefix",
                         "truncated op",   "garbage fields",     "wrong token",         "valid ops",
                         "empty/unknown frame", "bad magic/version"};
  std::map<int, int> cases;
  int closed_by_server = 0, replies = 0, legit_checks = 0;
  const size_t rss0 = rss_bytes();
  const auto t0 = Clock::now();
  int iterations = 0;
  for (; iterations < 2000 && seconds_since(t0) < 8; ++iterations) {
    const int kind = static_cast<int>(fz.rnd(10));
    ++cases[kind];
    Raw raw(port);
    REQUIRE(raw.fd >= 0);
    const std::string bytes = fz.connection(kind);
    // Sometimes in pieces, to exercise reassembly of partial frames.
    if (fz.rnd(4) == 0 && bytes.size() > 2) {
      const size_t cut = 1 + fz.rnd(bytes.size() - 1);
      raw.send(bytes.substr(0, cut));
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      raw.send(bytes.substr(cut));
    } else {
      raw.send(bytes);
    }
    std::string got;
    if (raw.drain(kind == 7 ? 20 : 3, &got)) ++closed_by_server;
    if (!got.empty()) ++replies;
    raw.close(fz.rnd(2) == 0);

    if (iterations % 100 == 0) {
      ++legit_checks;
      REQUIRE(legit.get("canary", 1) == "alive");
    }
  }
  const double elapsed = seconds_since(t0);

  // Afterwards: the server still serves, old and new clients alike.
  CHECK(legit.get("canary", 1) == "alive");
  StoreClient fresh(kHost, port, kToken, 10);
  fresh.set("after", "fuzz");
  CHECK(legit.get("after", 1) == "fuzz");
  CHECK(legit.add("after-counter", 7) == 7);
  CHECK(eventually([&] { return server.stats().connections == 2 && server.stats().pending_waits == 0; }, 5));
  const auto st = server.stats();
  const size_t rss1 = rss_bytes();
  const double growth_mib = (static_cast<double>(rss1) - static_cast<double>(rss0)) / (1 << 20);

  std::printf("store fuzz: %d iterations in %.2f s; %d closed by the server, %d got replies, %d canary checks\n",
              iterations, elapsed, closed_by_server, replies, legit_checks);
  for (const auto& [k, n] : cases) std::printf("  %-20s %d\n", names[k], n);
  std::printf("  server: accepted %lld, protocol errors %lld, rejected tokens %lld, requests %lld, "
              "keys %lld, stored %lld bytes, log lines %zu; RSS growth %.1f MiB\n",
              (long long)st.accepted, (long long)st.protocol_errors, (long long)st.rejected_tokens,
              (long long)st.requests, (long long)st.keys, (long long)st.stored_bytes, sink.lines.size(),
              growth_mib);

  CHECK(iterations >= 500);
  CHECK(st.protocol_errors > 0);
  CHECK(st.rejected_tokens > 0);
  CHECK(st.stored_bytes <= int64_t{2} << 20);
  CHECK(growth_mib < 64);
  CHECK(sink.lines.size() <= 40);  // rate-limited, whatever the fuzz did
}
