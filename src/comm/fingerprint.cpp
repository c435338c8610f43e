// See fingerprint.h.
#include "comm/fingerprint.h"

#include <atomic>
#include <cstdlib>
#include <memory>

#include "comm/comm_debug.h"

namespace shardtensor {
namespace {

thread_local const std::string* current_transfer = nullptr;

std::atomic<bool>& fingerprints_flag() {
  static std::atomic<bool> flag{[] {
    const char* v = std::getenv("SHARDTENSOR_FINGERPRINT");
    return !(v && std::string(v) == "0");
  }()};
  return flag;
}

// FNV-1a: stable across processes and builds (std::hash need not be).
uint64_t stable_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::shared_ptr<const FaultHook>& hook_slot() {
  static std::shared_ptr<const FaultHook> hook;
  return hook;
}
std::atomic<bool> hook_set{false};

}  // namespace

TransferScope::TransferScope(std::string description) : description_(std::move(description)), previous_(current_transfer) {
  current_transfer = &description_;
}
TransferScope::~TransferScope() { current_transfer = previous_; }

Fingerprint fingerprint_of(const std::string& collective) {
  std::string description = current_operator();
  if (current_transfer) description += ": " + *current_transfer;
  description += " (" + collective + ")";
  return {stable_hash(description), description};
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
