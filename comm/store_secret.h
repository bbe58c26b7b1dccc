// The store's secret (TRAINER_STORE_SECRET): what actually keeps others out
// of a job's rendezvous store. The job token (comm/store.h) is derived from
// launcher ids that other users can see, so it only separates jobs that
// collide by accident; the secret is something only the job's own ranks
// hold (an environment variable is readable by the same user and root
// only).
//
// The secret never travels. The handshake is a challenge-response in both
// directions (comm/store_protocol.h, HELLO / CHALLENGE / AUTH):
//   client -> server  HELLO: token, client nonce (32 random bytes)
//   server -> client  CHALLENGE: server nonce
//   client -> server  AUTH: HMAC-SHA256(secret, "client" | token | nonces)
//   server -> client  OK: HMAC-SHA256(secret, "server" | token | nonces)
// so the server learns that the client knows the secret, the client that the
// server does (something else squatting on the port cannot pose as rank 0),
// and an eavesdropper sees only values that never repeat. What follows the
// handshake is neither encrypted nor integrity-protected: someone who can
// rewrite the traffic between two hosts can still tamper with it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace trainer {

inline constexpr const char* kStoreSecretEnv = "TRAINER_STORE_SECRET";
inline constexpr size_t kStoreNonceBytes = 32;
inline constexpr size_t kStoreProofBytes = 32;

// TRAINER_STORE_SECRET, or "" (no secret) when unset or empty.
std::string store_secret_from_env();

// kStoreNonceBytes from the kernel's random source (getrandom). Throws
// StoreError when it cannot be read.
std::string random_nonce();

// HMAC-SHA256(secret, role | token | client_nonce | server_nonce), each part
// length-prefixed so no two different inputs give the same message. role:
// "client" or "server".
std::string store_proof(std::string_view secret, std::string_view role, std::string_view token,
                        std::string_view client_nonce, std::string_view server_nonce);

// Compares in time independent of where the first difference is.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace trainer
