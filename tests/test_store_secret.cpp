// The store's secret (comm/store_secret.h, TRAINER_STORE_SECRET): SHA-256 and
// HMAC against their published test vectors; processes holding the same
// secret meet; a client with another secret, or none, is refused with a
// message naming the variable; a client with a secret refuses a server that
// cannot prove it holds it; the secret itself never crosses the wire; a
// proof cannot be replayed; and a real torchrun launch with the variable set
// trains, while a rank with the wrong value exits 2.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "tests/build_paths.h"
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/sha256.h"
#include "comm/store.h"
#include "comm/store_protocol.h"
#include "comm/store_secret.h"
#include "e2e_util.h"

using namespace trainer;
namespace wire = trainer::store_wire;
namespace fs = std::filesystem;
using Catch::Contains;

namespace {

const std::string kToken = "secret-test-token";
const std::string kHost = "127.0.0.1";
const std::string kSecret = "correct horse battery staple 0123456789abcdef";
const std::string kShellSecret = "9f2c41d07be35a68e4c1f0d2a7b96e53";  // no characters the shell would split

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const StoreAuthError& e) {
    return std::string("[auth] ") + e.what();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no error>";
}

struct LogSink {
  std::mutex mu;
  std::vector<std::string> lines;
  size_t count(const std::string& part) {
    std::lock_guard<std::mutex> g(mu);
    size_t n = 0;
    for (const auto& l : lines) n += l.find(part) != std::string::npos;
    return n;
  }
};

StoreServerOptions with_secret(LogSink& sink, const std::string& secret) {
  StoreServerOptions o;
  o.secret = secret;
  o.log = [&sink](const std::string& l) {
    std::lock_guard<std::mutex> g(sink.mu);
    sink.lines.push_back(l);
  };
  return o;
}

// Blocking helpers for hand-made connections.
int connect_raw(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

bool read_exact(int fd, char* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t k = ::recv(fd, p + got, n - got, 0);
    if (k <= 0) return false;
    got += size_t(k);
  }
  return true;
}

// One frame's body, or "" when the peer closed.
std::string read_frame(int fd) {
  char hdr[4];
  if (!read_exact(fd, hdr, 4)) return "";
  std::string body(wire::load_u32(hdr), '\0');
  if (!read_exact(fd, body.data(), body.size())) return "";
  return body;
}

void send_all(int fd, const std::string& s) {
  REQUIRE(::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == ssize_t(s.size()));
}

std::string hello(const std::string& nonce) {
  return std::move(wire::Writer().u8(uint8_t(wire::Op::Hello)).u32(wire::kMagic).u32(wire::kVersion).str(kToken).str(nonce))
      .frame();
}

std::string field_after_status(const std::string& body) {
  wire::Reader r(std::string_view(body).substr(1));
  std::string s;
  REQUIRE(r.str(&s, 4096));
  return s;
}

}  // namespace

TEST_CASE("sha256 and hmac-sha256 match their published test vectors", "[store][secret]") {
  // FIPS 180-4 examples (NIST CSRC), including the two-block padding case.
  CHECK(to_hex(sha256("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(to_hex(sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(to_hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(to_hex(sha256(std::string(1000000, 'a'))) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // RFC 4231 test cases 1, 2 and 6 (a key longer than the block).
  CHECK(to_hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(to_hex(hmac_sha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(to_hex(hmac_sha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  std::printf("[secret] sha256(abc) = %s\n", to_hex(sha256("abc")).c_str());
  // Every part of a proof matters.
  const std::string cn(32, 'c'), sn(32, 's');
  const std::string p = store_proof("k", "client", "t", cn, sn);
  CHECK(p.size() == kStoreProofBytes);
  CHECK(p != store_proof("k", "server", "t", cn, sn));
  CHECK(p != store_proof("K", "client", "t", cn, sn));
  CHECK(p != store_proof("k", "client", "u", cn, sn));
  CHECK(p != store_proof("k", "client", "t", sn, cn));
  CHECK(random_nonce() != random_nonce());
}

TEST_CASE("store secret: the same secret connects across processes, a wrong or missing one is refused", "[store][secret]") {
  LogSink sink;
  StoreServer server(kHost, 0, kToken, with_secret(sink, kSecret));
  const int port = server.port();

  // Another process with the same secret sets a key; this one reads it.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 0;
    try {
      StoreClient c(kHost, port, kToken, 10, 30, kSecret);
      c.set("from_child", std::to_string(::getpid()));
      c.barrier("met", 1, 2, 10);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      code = 1;
    }
    ::_exit(code);
  }
  StoreClient parent(kHost, port, kToken, 10, 30, kSecret);
  parent.barrier("met", 0, 2, 10);
  CHECK(parent.get("from_child", 5) == std::to_string(pid));
  int status = -1;
  ::waitpid(pid, &status, 0);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));

  const std::string endpoint = "store at 127.0.0.1:" + std::to_string(port);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string wrong = error_of([&] { StoreClient c(kHost, port, kToken, 10, 30, "another secret"); });
  const std::string none = error_of([&] { StoreClient c(kHost, port, kToken, 10, 30, ""); });
  const double refusal_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[secret] wrong: %s\n[secret] none: %s\n[secret] both refused in %.3f s (no retries)\n",
              wrong.c_str(), none.c_str(), refusal_s);
  CHECK(wrong == "[auth] " + endpoint + " refused this process: wrong secret: this process's TRAINER_STORE_SECRET "
                                        "differs from rank 0's (every rank needs the same value)");
  CHECK(none == "[auth] " + endpoint + " refused this process: this store requires the job's secret and this "
                                       "process presented none: TRAINER_STORE_SECRET is not set here (every rank "
                                       "needs rank 0's value)");
  CHECK(refusal_s < 5);  // a refusal is final, not retried until the connect timeout
  CHECK(server.stats().refused_secrets == 2);
  CHECK(sink.count("differs from rank 0's") == 1);
  CHECK(sink.count("presented no secret") == 1);
  // The ones that belong are still served.
  parent.set("after", "refusals");
  StoreClient again(kHost, port, kToken, 10, 30, kSecret);
  CHECK(again.get("after", 1) == "refusals");

  // A client with a secret does not trust a server without one.
  LogSink open_sink;
  StoreServer open(kHost, 0, kToken, with_secret(open_sink, ""));
  const std::string unchecked = error_of([&] { StoreClient c(kHost, open.port(), kToken, 10, 30, kSecret); });
  std::printf("[secret] server without a secret: %s\n", unchecked.c_str());
  CHECK_THAT(unchecked, Contains("[auth]") && Contains("without checking its secret") &&
                            Contains("rank 0 runs without TRAINER_STORE_SECRET"));
  StoreClient plain(kHost, open.port(), kToken, 10);  // and no secret on either side still works
  plain.set("k", "v");
  CHECK(plain.get("k", 1) == "v");
}

TEST_CASE("store secret: a proof is not replayable and never reveals the secret", "[store][secret]") {
  LogSink sink;
  StoreServer server(kHost, 0, kToken, with_secret(sink, kSecret));
  const std::string cn = random_nonce();
  // Connection 1: an honest handshake by hand, keeping its proof.
  const int a = connect_raw(server.port());
  send_all(a, hello(cn));
  const std::string ch1 = read_frame(a);
  REQUIRE(uint8_t(ch1[0]) == uint8_t(wire::Status::Challenge));
  const std::string sn1 = field_after_status(ch1);
  REQUIRE(sn1.size() == kStoreNonceBytes);
  const std::string proof1 = store_proof(kSecret, "client", kToken, cn, sn1);
  send_all(a, std::move(wire::Writer().u8(uint8_t(wire::Op::Auth)).str(proof1)).frame());
  const std::string ok = read_frame(a);
  REQUIRE(uint8_t(ok[0]) == uint8_t(wire::Status::Ok));
  CHECK(field_after_status(ok) == store_proof(kSecret, "server", kToken, cn, sn1));
  ::close(a);
  // Connection 2 replays it: the server chose a new nonce, so it is refused.
  const int b = connect_raw(server.port());
  send_all(b, hello(cn));
  const std::string ch2 = read_frame(b);
  REQUIRE(uint8_t(ch2[0]) == uint8_t(wire::Status::Challenge));
  CHECK(field_after_status(ch2) != sn1);
  send_all(b, std::move(wire::Writer().u8(uint8_t(wire::Op::Auth)).str(proof1)).frame());
  const std::string refused = read_frame(b);
  REQUIRE(!refused.empty());
  CHECK(uint8_t(refused[0]) == uint8_t(wire::Status::Refused));
  CHECK(read_frame(b).empty());  // and closed
  ::close(b);
  CHECK(server.stats().refused_secrets == 1);

  // Something squatting on the port, pretending to be a store with a
  // secret: it records what the client sends and answers with a made-up
  // proof. The client refuses it, and the secret was never sent.
  const int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(ls, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(ls, 4) == 0);
  socklen_t len = sizeof addr;
  ::getsockname(ls, reinterpret_cast<sockaddr*>(&addr), &len);
  std::string seen;
  std::thread squatter([&] {
    const int c = ::accept(ls, nullptr, nullptr);
    if (c < 0) return;
    timeval tv{5, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const std::string h = read_frame(c);
    seen += h;
    const std::string challenge =
        std::move(wire::Writer().u8(uint8_t(wire::Status::Challenge)).str(std::string(kStoreNonceBytes, 'n'))).frame();
    ::send(c, challenge.data(), challenge.size(), MSG_NOSIGNAL);
    seen += read_frame(c);
    const std::string fake =
        std::move(wire::Writer().u8(uint8_t(wire::Status::Ok)).str(std::string(kStoreProofBytes, 'p'))).frame();
    ::send(c, fake.data(), fake.size(), MSG_NOSIGNAL);
    char buf[64];
    while (::recv(c, buf, sizeof buf, 0) > 0) {
    }
    ::close(c);
  });
  const std::string msg = error_of([&] { StoreClient c(kHost, ntohs(addr.sin_port), kToken, 10, 30, kSecret); });
  squatter.join();
  ::close(ls);
  std::printf("[secret] squatter: %s (it saw %zu bytes, none of them the secret)\n", msg.c_str(), seen.size());
  CHECK_THAT(msg, Contains("[auth]") && Contains("did not prove that it holds TRAINER_STORE_SECRET"));
  CHECK(seen.size() > 2 * kStoreNonceBytes);  // the HELLO and the AUTH reached it
  CHECK(seen.find(kSecret) == std::string::npos);
  CHECK(seen.find(kSecret.substr(0, 12)) == std::string::npos);
}

TEST_CASE("store secret: read from TRAINER_STORE_SECRET", "[store][secret]") {
  const char* old = std::getenv("TRAINER_STORE_SECRET");
  const std::string saved = old ? old : "";
  ::unsetenv("TRAINER_STORE_SECRET");
  CHECK(store_secret_from_env().empty());
  ::setenv("TRAINER_STORE_SECRET", "s3cret", 1);
  CHECK(store_secret_from_env() == "s3cret");
  if (old) ::setenv("TRAINER_STORE_SECRET", saved.c_str(), 1);
  else ::unsetenv("TRAINER_STORE_SECRET");
}

TEST_CASE("store secret: a torchrun launch with TRAINER_STORE_SECRET trains, a rank with another exits 2",
          "[store][secret][launchers]") {
  const fs::path dir = fs::temp_directory_path() / ("trainer_store_secret_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string tokens = e2e::write_byte_tokens(dir).string();
  const std::string cfg = (dir / "cfg.yaml").string();
  std::ofstream(cfg) << "run: {name: secret}\n"
                     << "model: {vocab_size: 256, d_model: 32, n_layers: 1, n_heads: 2, max_seq_len: 32}\n"
                     << "train: {steps: 4, seq_len: 32, micro_batch_size: 2, global_batch_size: 4, device: cpu,"
                     << " threads: 1}\n"
                     << "parallel: {timeout_s: 5}\n"
                     << "data: {train: [" << tokens << "]}\n"
                     << "log: {progress: lines}\n";
  const std::string bin = TRAINER_BIN;
  {
    std::string out;
    const std::string rd = (dir / "torchrun").string();
    // Debian's torchrun 1.13 needs -r/-t/--log_dir (see test_data_parallel.cpp).
    const int rc = e2e::run("TRAINER_STORE_SECRET=" + kShellSecret + " torchrun -r 1 -t 2 --log_dir " +
                                (dir / "tlog").string() + " --nproc_per_node 2 --master_port " +
                                std::to_string(e2e::free_port()) + " --no_python " + bin + " --config " + cfg +
                                " --set run.dir=" + rd,
                            &out);
    INFO(e2e::tail(out));
    CHECK(rc == 0);
    // With -r/-t the ranks' output goes to --log_dir/<run>/attempt_0/<rank>/.
    std::string rank0;
    for (const auto& e : fs::recursive_directory_iterator(dir / "tlog"))
      if (e.path().filename() == "stdout.log" && e.path().parent_path().filename() == "0") {
        std::ifstream in(e.path());
        rank0.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
    INFO(rank0);
    CHECK_THAT(rank0, Contains("store: every rank must prove it holds TRAINER_STORE_SECRET"));
    const auto losses = e2e::losses(fs::path(rd) / "metrics.jsonl");
    CHECK(losses.size() == 4);
    std::printf("[secret] torchrun --nproc_per_node 2 with TRAINER_STORE_SECRET: exit %d, %zu steps, loss %.4f\n", rc,
                losses.size(), losses.empty() ? 0.0 : losses.back());
  }
  // Hand-set torchrun variables, rank 1 with another secret, then with none.
  for (const std::string rank1_env : {"TRAINER_STORE_SECRET=other", "-u TRAINER_STORE_SECRET"}) {
    const int port = e2e::free_port();
    const std::string rd = (dir / "bad").string();
    auto rank = [&](int r, const std::string& env) {
      return "env " + env + " RANK=" + std::to_string(r) +
             " WORLD_SIZE=2 LOCAL_RANK=" + std::to_string(r) + " LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
             std::to_string(port - 1) + " " + bin + " --config " + cfg + " --set run.dir=" + rd + " > " + rd +
             ".rank" + std::to_string(r) + ".log 2>&1";
    };
    // Built by appending (GCC 12 warns falsely about "(" + a temporary).
    std::string cmd = "(";
    cmd += rank(0, "TRAINER_STORE_SECRET=" + kShellSecret);
    cmd += " & p0=$!; sleep 0.3; ";
    cmd += rank(1, rank1_env);
    cmd += "; echo \"rank 1 exit $?\"; wait $p0; echo \"rank 0 exit $?\")";
    std::string out;
    e2e::run(cmd, &out);
    std::ifstream l1(rd + ".rank1.log"), l0(rd + ".rank0.log");
    const std::string log1((std::istreambuf_iterator<char>(l1)), std::istreambuf_iterator<char>());
    const std::string log0((std::istreambuf_iterator<char>(l0)), std::istreambuf_iterator<char>());
    INFO(out << "\nrank 0:\n" << log0 << "\nrank 1:\n" << log1);
    CHECK_THAT(out, Contains("rank 1 exit 2"));
    CHECK_THAT(log1, Contains("error: store at 127.0.0.1:" + std::to_string(port) + " refused this process") &&
                         Contains("TRAINER_STORE_SECRET"));
    CHECK_THAT(out, !Contains("rank 0 exit 0"));
    CHECK_THAT(log0, Contains("refused a connection") && Contains("rank 1"));
    const auto e1 = log1.find("error:");
    std::printf("[secret] rank 1 with %s: %s\n", rank1_env.c_str(),
                e1 == std::string::npos ? "<none>" : log1.substr(e1, log1.find('\n', e1) - e1).c_str());
  }
  fs::remove_all(dir);
}
