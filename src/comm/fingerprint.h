// What a collective belongs to, as every member must agree on it: a hash and a description.
//
// Ranks that call collectives in different orders, or with different sizes, must get an error
// that names both operations, never wrong bytes or a backend abort. Every transport posts the
// fingerprint of the exchange it is about to run and compares it with its peers' before it
// moves a byte (peer memory through the mailbox; on Gloo a fixed-size record message ahead of
// each message of a batch, or from every rank to every other before a collective; see
// c10d_comm.cpp).
//
// The description is the operator running (current_operator()), the step of it that moves bytes
// (TransferScope, set by the executor: "S(0) -> S(1) of float[2048, 2048]") and the collective.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace at {
class Tensor;
}

namespace shardtensor {

// Names the transfer this thread is running, for fingerprints and errors. The name is made by
// `describe(context)` only when a fingerprint is taken: most steps (local slices, NCCL, one
// rank) never need it, and a redistribute should not build strings it does not use.
class TransferScope {
 public:
  using Describe = std::string (*)(const void* context);
  TransferScope(Describe describe, const void* context);
  ~TransferScope();
  TransferScope(const TransferScope&) = delete;
  TransferScope& operator=(const TransferScope&) = delete;

  std::string description() const { return describe_(context_); }

 private:
  Describe describe_;
  const void* context_;
  const TransferScope* previous_;
};

struct Fingerprint {
  uint64_t hash;
  std::string description;
};

// `collective` ("all_to_all", "all_reduce of 4096 float elements", ...) within the current
// operator and transfer.
Fingerprint fingerprint_of(const std::string& collective);

// A fingerprint as a message of fixed size: [sequence, hash, bytes, description]. Message
// transports exchange these before the bytes they describe, so that a mismatch is found before
// a receive of the wrong size is posted (Gloo aborts on one).
constexpr int64_t kRecordWords = 3 + 15;  // 120 characters of description
at::Tensor record_of(const Fingerprint& operation, int64_t sequence, int64_t bytes);
// Raises, naming both operations, unless `theirs` (group rank `peer`'s record) is `mine` at
// `sequence` and, where `bytes` >= 0, announces that many bytes. `group` names the group.
void check_record(const at::Tensor& theirs, const Fingerprint& mine, int64_t sequence, int64_t bytes, const std::string& group,
                  int64_t my_rank, int64_t peer);

// The error for two members that run different operations, as both transports word it
// (without the "shardtensor: " prefix).
std::string different_operations(const std::string& group, int64_t my_rank, const std::string& mine, int64_t my_sequence,
                                 const std::string& peer, const std::string& theirs, int64_t their_sequence);

// Whether message transports check fingerprints (SHARDTENSOR_FINGERPRINT=0 turns it off; it
// costs one small message round on Gloo; peer memory checks them for free).
// Every rank must hold the same setting.
bool message_fingerprints_enabled();
void set_message_fingerprints_enabled(bool enabled);

// Test hook: `hook(point)` runs at named points inside the transports ("peer_memory:read",
// "peer_memory:finish", "messages:wait", ...), so that a test can kill or stop this process at
// an exact point, such as the middle of a copy. Null (the default) costs one load per point.
using FaultHook = std::function<void(const char* point)>;
void set_fault_hook(FaultHook hook);
void fault_point(const char* point);

}  // namespace shardtensor
