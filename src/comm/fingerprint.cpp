// See fingerprint.h.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "comm/fingerprint.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cstdlib>
#include <memory>

#include "comm/comm_debug.h"
#include "util/hash.h"

namespace shardtensor {
namespace {

thread_local const TransferScope* current_transfer = nullptr;

std::atomic<bool>& fingerprints_flag() {
  static std::atomic<bool> flag{[] {
    const char* v = std::getenv("SHARDTENSOR_FINGERPRINT");
    return !(v && std::string(v) == "0");
  }()};
  return flag;
}

std::shared_ptr<const FaultHook>& hook_slot() {
  static std::shared_ptr<const FaultHook> hook;
  return hook;
}
std::atomic<bool> hook_set{false};

}  // namespace

TransferScope::TransferScope(Describe describe, const void* context) : describe_(describe), context_(context), previous_(current_transfer) {
  current_transfer = this;
}
TransferScope::~TransferScope() { current_transfer = previous_; }

Fingerprint fingerprint_of(const std::string& collective) {
  std::string description = current_operator();
  if (current_transfer) description += ": " + current_transfer->description();
  description += " (" + collective + ")";
  return {stable_hash(description), description};
}

at::Tensor record_of(const Fingerprint& operation, int64_t sequence, int64_t bytes) {
  at::Tensor record = at::zeros({kRecordWords}, at::kLong);
  int64_t* words = record.data_ptr<int64_t>();
  words[0] = sequence;
  words[1] = static_cast<int64_t>(operation.hash);
  words[2] = bytes;
  std::memcpy(words + 3, operation.description.data(), std::min(operation.description.size(), sizeof(int64_t) * (kRecordWords - 3) - 1));
  return record;
}

std::string different_operations(const std::string& group, int64_t my_rank, const std::string& mine, int64_t my_sequence,
                                 const std::string& peer, const std::string& theirs, int64_t their_sequence) {
  return "the ranks called different collectives on " + group + ": this rank (group rank " + std::to_string(my_rank) +
         ") runs \"" + mine + "\" as its collective #" + std::to_string(my_sequence) + " there, " + peer + " runs \"" + theirs +
         "\" as its collective #" + std::to_string(their_sequence) + ". Every rank must run the same collectives in the same order.";
}

void check_record(const at::Tensor& theirs, const Fingerprint& mine, int64_t sequence, int64_t bytes, const std::string& group,
                  int64_t my_rank, int64_t peer) {
  const int64_t* words = theirs.data_ptr<int64_t>();
  const char* text = reinterpret_cast<const char*>(words + 3);
  const std::string their_description(text, strnlen(text, sizeof(int64_t) * (kRecordWords - 3)));
  TORCH_CHECK(words[0] == sequence && words[1] == static_cast<int64_t>(mine.hash),
              "shardtensor: ", different_operations(group, my_rank, mine.description, sequence, "group rank " + std::to_string(peer), their_description, words[0]));
  TORCH_CHECK(bytes < 0 || words[2] == bytes, "shardtensor: group rank ", peer, " of ", group, " sends ", words[2], " bytes where this rank (group rank ",
              my_rank, ") expects ", bytes, " in \"", mine.description,
              "\": the ranks disagree on the layout (the sizes or placements they were given differ).");
}

bool message_fingerprints_enabled() { return fingerprints_flag().load(std::memory_order_relaxed); }
void set_message_fingerprints_enabled(bool enabled) { fingerprints_flag() = enabled; }

// Set by tests before the ranks start exchanging, read by the transports after: a plain
// shared_ptr guarded by the flag's release/acquire is enough.
void set_fault_hook(FaultHook hook) {
  hook_slot() = hook ? std::make_shared<const FaultHook>(std::move(hook)) : nullptr;
  hook_set.store(static_cast<bool>(hook_slot()), std::memory_order_release);
}

void fault_point(const char* point) {
  if (!hook_set.load(std::memory_order_acquire)) return;
  if (const auto hook = hook_slot()) (*hook)(point);
}

}  // namespace shardtensor
