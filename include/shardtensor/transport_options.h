// How a redistribution may move bytes between ranks: per-call plan options. Each unset field
// takes this process's default, read once from the environment (SHARDTENSOR_TRANSPORT,
// SHARDTENSOR_PEER_MEMORY, SHARDTENSOR_PEER_COPY_BYTES, SHARDTENSOR_MESSAGE_BYTES,
// SHARDTENSOR_ARENA); nothing
// changes a default afterwards, so what a plan was lowered with is all that decides how it
// runs. Plans are cached and lowered per options, so a call with other options gets its own
// plan, and `explain_redistribute` shows the transport of each step. Every rank must pass the
// same options: ranks that choose different transports never meet, and time out with an error.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace shardtensor {

enum class TransportPreference {
  Auto,         // CPU: same-host peer memory, else point-to-point messages; accelerators: collectives
  Collectives,  // native c10d collectives on every device (what NCCL needs)
  Messages,     // CPU: point-to-point messages, never peer memory
};

struct TransportOptions {
  std::optional<TransportPreference> transport;
  std::optional<bool> peer_memory;         // whether same-host CPU ranks may copy through memory
  std::optional<int64_t> peer_copy_bytes;  // the smallest transfer per rank that may use it
  std::optional<int64_t> message_bytes;    // the size point-to-point messages are cut to (> 0)
  // Whether same-host peers read the parts that lie in their holder's shared arena in place (a
  // plain copy, no kernel call; the "shared arena" transport). Default: on where this process
  // has an arena (SHARDTENSOR_ARENA=1); off, peer memory copies them by cross-memory attach.
  std::optional<bool> shared_arena;
};

// The options every movement on this thread takes where its call passes none, while the scope
// lives: the redistributes an operator makes, its halo exchanges and its mid-op reductions, as
// well as redistribute() and explain calls (whose own set fields still win). A scope's set
// fields override an outer scope's; its unset ones keep them. Every rank must open the same
// scope around the same calls. Autograd runs a CPU backward on the thread that calls
// backward(): open the scope around that call too.
//   { TransportOptionsScope by_messages(TransportOptions{TransportPreference::Messages});
//     y = at::conv2d(x, w); }   // its halo and any redistribute go as messages
class TransportOptionsScope {
 public:
  explicit TransportOptionsScope(const TransportOptions& options);
  ~TransportOptionsScope();
  TransportOptionsScope(const TransportOptionsScope&) = delete;
  TransportOptionsScope& operator=(const TransportOptionsScope&) = delete;

  // What a scope opened now on this thread holds: the fields set by the open scopes.
  static const TransportOptions& current();

 private:
  TransportOptions outer_;
};

// "auto", "collectives" or "messages" as a TransportPreference; anything else raises, naming
// `what` (where the name came from) and the names allowed.
TransportPreference parse_transport_preference(const std::string& name, const char* what);

}  // namespace shardtensor
