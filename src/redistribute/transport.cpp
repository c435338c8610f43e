// transport_for: the transport of each plan step, from metadata only (see transport.h).
#include "redistribute/transport.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <numeric>

#include "redistribute/transports/peer_memory/peer_memory.h"
#include "redistribute/boxes.h"
#include "redistribute/transports/peer_memory/copies.h"  // kDefaultPeerCopyBytes

namespace shardtensor {
namespace {

// A byte count from the environment variable `name`, or `fallback` where it is unset; anything
// but an integer of at least `least` raises, naming the variable.
int64_t bytes_from_environment(const char* name, int64_t fallback, int64_t least) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long long bytes = std::strtoll(v, &end, 10);
  TORCH_CHECK(end && *end == '\0' && bytes >= least, name, "=", v, " is not a byte count (an integer of at least ", least, ")");
  return bytes;
}

// Read at first use, not at load: a bad value is then an error the caller sees, not a
// terminate while the library loads. Every rank must see the same environment.
ResolvedTransportOptions defaults_from_environment() {
  ResolvedTransportOptions defaults;
  const char* transport = std::getenv("SHARDTENSOR_TRANSPORT");
  if (transport && *transport) defaults.preference = parse_transport_preference(transport, "SHARDTENSOR_TRANSPORT");
  defaults.peer_memory = peer_memory_enabled();
  defaults.peer_copy_bytes = bytes_from_environment("SHARDTENSOR_PEER_COPY_BYTES", kDefaultPeerCopyBytes, 0);
  defaults.message_bytes = bytes_from_environment("SHARDTENSOR_MESSAGE_BYTES", kDefaultMessageBytes, 1);
  defaults.shared_arena = own_arena().base != 0;  // SHARDTENSOR_ARENA=1 installed it when the library loaded
  return defaults;
}

int64_t element_size(const ShardTensorSpec& spec) { return static_cast<int64_t>(c10::elementSize(spec.dtype())); }

// The bytes each member moves, as the executor measures them to decide on peer memory: the
// held box for reductions (the same box on every member), the tensor over the mesh otherwise.
int64_t bytes_moved(const MoveStep& step, const ShardTensorSpec& from) {
  if (std::holds_alternative<AllReduceStep>(step) || std::holds_alternative<ReduceScatterStep>(step))
    return box_in_piece_order(from, from.mesh().coordinate()).numel() * element_size(from);
  const int64_t numel = std::accumulate(from.shape().begin(), from.shape().end(), int64_t{1}, std::multiplies<>());
  return numel * element_size(from) / from.mesh().size();
}

// The native collective for a step that is not copied.
const char* native_collective(const MoveStep& step, const ShardTensorSpec& from, const ShardTensorSpec& to) {
  if (std::holds_alternative<AllReduceStep>(step)) return "all_reduce";
  const bool equal = pieces_are_equal(step, from, to);
  if (std::holds_alternative<AllGatherStep>(step) && equal) return "all_gather";
  if (std::holds_alternative<ReduceScatterStep>(step) && equal) return "reduce_scatter";
  return "all_to_all";
}

int64_t group_size(const MoveStep& step, const DeviceMesh& mesh) {
  if (std::holds_alternative<LocalChunkStep>(step)) return 1;
  const int64_t mesh_dim = mesh_dim_of(step);
  return mesh_dim < 0 ? mesh.size() : mesh.size(mesh_dim);
}

}  // namespace

TransportPreference parse_transport_preference(const std::string& name, const char* what) {
  if (name == "auto") return TransportPreference::Auto;
  if (name == "collectives") return TransportPreference::Collectives;
  TORCH_CHECK(name == "messages", what, " is '", name,
              "'; use 'auto' (the default), 'collectives' (native c10d collectives) or 'messages' (point-to-point, no peer memory).");
  return TransportPreference::Messages;
}

const ResolvedTransportOptions& process_transport_defaults() {
  static const ResolvedTransportOptions defaults = defaults_from_environment();
  return defaults;
}

std::string to_string(TransportPreference preference) {
  switch (preference) {
    case TransportPreference::Auto: return "auto";
    case TransportPreference::Collectives: return "collectives";
    case TransportPreference::Messages: return "messages";
  }
  TORCH_INTERNAL_ASSERT(false, "unknown TransportPreference");
}

bool pieces_are_equal(const MoveStep& step, const ShardTensorSpec& from, const ShardTensorSpec& to) {
  const DeviceMesh& mesh = from.mesh();
  if (auto* s = std::get_if<AllGatherStep>(&step)) {
    const auto members = members_along(mesh, s->mesh_dim);
    const Box first = box_in_piece_order(from, members.front());
    for (const auto& member : members)
      if (box_in_piece_order(from, member).shape != first.shape) return false;
    return true;
  }
  if (auto* s = std::get_if<ReduceScatterStep>(&step)) {
    const auto members = members_along(mesh, s->mesh_dim);
    const Box held = box_in_piece_order(from, mesh.coordinate());
    const Box first = box_in_piece_order(to, members.front());
    for (const auto& member : members)
      if (box_in_piece_order(to, member).shape != first.shape) return false;
    return first.shape[s->tensor_dim] * static_cast<int64_t>(members.size()) == held.shape[s->tensor_dim];
  }
  return false;
}

namespace {
thread_local TransportOptions scoped_options;  // what the open TransportOptionsScopes set

// Raises, naming the field, where a set size is out of range (a scope's, or a call's).
void check_sizes(const TransportOptions& options) {
  TORCH_CHECK(!options.peer_copy_bytes || *options.peer_copy_bytes >= 0, "TransportOptions: peer_copy_bytes ", *options.peer_copy_bytes,
              " is not a size");
  TORCH_CHECK(!options.message_bytes || *options.message_bytes > 0, "TransportOptions: message_bytes ", *options.message_bytes,
              " is not a positive size");
}
}  // namespace

TransportOptionsScope::TransportOptionsScope(const TransportOptions& options) : outer_(scoped_options) {
  check_sizes(options);
  if (options.transport) scoped_options.transport = options.transport;
  if (options.peer_memory) scoped_options.peer_memory = options.peer_memory;
  if (options.peer_copy_bytes) scoped_options.peer_copy_bytes = options.peer_copy_bytes;
  if (options.message_bytes) scoped_options.message_bytes = options.message_bytes;
  if (options.shared_arena) scoped_options.shared_arena = options.shared_arena;
}

TransportOptionsScope::~TransportOptionsScope() { scoped_options = outer_; }

const TransportOptions& TransportOptionsScope::current() { return scoped_options; }

// A call's own fields, then the open scopes', then this process's defaults.
ResolvedTransportOptions resolve(const TransportOptions& options) {
  const TransportOptions& scoped = scoped_options;
  const ResolvedTransportOptions& defaults = process_transport_defaults();
  check_sizes(options);
  ResolvedTransportOptions resolved;
  resolved.preference = options.transport.value_or(scoped.transport.value_or(defaults.preference));
  resolved.peer_memory = options.peer_memory.value_or(scoped.peer_memory.value_or(defaults.peer_memory));
  resolved.peer_copy_bytes = options.peer_copy_bytes.value_or(scoped.peer_copy_bytes.value_or(defaults.peer_copy_bytes));
  resolved.message_bytes = options.message_bytes.value_or(scoped.message_bytes.value_or(defaults.message_bytes));
  resolved.shared_arena = options.shared_arena.value_or(scoped.shared_arena.value_or(defaults.shared_arena));
  return resolved;
}

TransportKind same_host_kind(const ResolvedTransportOptions& options) {
  // Reading in place is a plain copy where cross-memory attach is a kernel call that pins the
  // peer's pages: never slower, so it is taken wherever the options allow it.
  return options.shared_arena ? TransportKind::SharedArena : TransportKind::PeerMemory;
}

bool uses_peer_memory(const DeviceMesh& mesh, int64_t bytes_per_rank, const ResolvedTransportOptions& options) {
  return mesh.device_type() == "cpu" && options.preference == TransportPreference::Auto && options.peer_memory &&
         bytes_per_rank >= options.peer_copy_bytes;
}

namespace {
// Whether every rank already holds what `to` gives it under `from`: wherever the two differ,
// `from` is replicated (an Exchange into a zigzag order from a replicated sequence only cuts).
bool only_cuts(const ShardTensorSpec& from, const ShardTensorSpec& to) {
  for (size_t m = 0; m < from.placements().size(); ++m) {
    const Placement& p = from.placements()[m];
    if (p.is_replicate()) continue;
    if (p != to.placements()[m]) return false;
    if (p.is_shard() && from.sharding_of(p.tensor_dim)->sizes != to.sharding_of(p.tensor_dim)->sizes) return false;
  }
  return true;
}
}  // namespace

StepTransport transport_for(const MoveStep& step, const ShardTensorSpec& from, const ShardTensorSpec& to,
                            const ResolvedTransportOptions& options) {
  TORCH_INTERNAL_ASSERT(is_redistribute_step(step), to_string(step), " is a kernel's move, not a redistribute step");
  const DeviceMesh& mesh = from.mesh();
  // A rank outside the mesh holds nothing and moves nothing (plans are made there too: the
  // dispatcher propagates every op on every rank).
  if (!mesh.includes_this_rank() || group_size(step, mesh) == 1) return {TransportKind::None, "", ""};
  if (std::holds_alternative<AllReduceStep>(step) && box_in_piece_order(from, mesh.coordinate()).empty()) return {TransportKind::None, "", ""};
  if (std::holds_alternative<ExchangeStep>(step) && only_cuts(from, to)) return {TransportKind::None, "", ""};
  if (auto* s = std::get_if<AllReduceStep>(&step)) return reduction_transport(mesh, s->mesh_dim, bytes_moved(step, from), options);
  const char* counted = counted_as(step);
  const TransportPreference preference = options.preference;
  if (mesh.device_type() != "cpu" || preference == TransportPreference::Collectives)
    return {TransportKind::Collective, native_collective(step, from, to), counted};
  const int64_t bytes = bytes_moved(step, from);
  // Peer memory falls back to messages where the group turns out unable (part_transport.h).
  if (uses_peer_memory(mesh, bytes, options)) return {same_host_kind(options), counted, counted, options.message_bytes};
  return {TransportKind::Messages, counted, counted, options.message_bytes};
}

StepTransport reduction_transport(const DeviceMesh& mesh, int64_t mesh_dim, int64_t bytes_per_rank,
                                  const ResolvedTransportOptions& options) {
  if (mesh.size(mesh_dim) == 1) return {TransportKind::None, "", ""};
  if (mesh.device_type() != "cpu" || options.preference == TransportPreference::Collectives)
    return {TransportKind::Collective, "all_reduce", "all_reduce"};
  if (uses_peer_memory(mesh, bytes_per_rank, options)) return {same_host_kind(options), "all_reduce", "all_reduce", options.message_bytes};
  if (bytes_per_rank < kMessagesAllReduceBytes) return {TransportKind::Collective, "all_reduce", "all_reduce"};
  return {TransportKind::Messages, "all_reduce", "all_reduce", options.message_bytes};
}

StepTransport exchange_transport(const DeviceMesh& mesh, int64_t bytes_per_rank, bool on_cpu, const char* counted_as,
                                 const ResolvedTransportOptions& options) {
  if (on_cpu && uses_peer_memory(mesh, bytes_per_rank, options))
    return {same_host_kind(options), "all_to_all", counted_as, options.message_bytes};
  if (on_cpu && mesh.device_type() == "cpu" && options.preference == TransportPreference::Messages)
    return {TransportKind::Messages, "all_to_all", counted_as, options.message_bytes};
  return {TransportKind::Collective, "all_to_all", counted_as, options.message_bytes};
}

std::string to_string(const StepTransport& transport) {
  switch (transport.kind) {
    case TransportKind::None: return "local";
    case TransportKind::Collective: return std::string(transport.collective) + " (c10d collective)";
    case TransportKind::PeerMemory: return "peer memory";
    case TransportKind::SharedArena: return "shared arena";
    case TransportKind::Messages: return "messages";
  }
  TORCH_INTERNAL_ASSERT(false, "unknown TransportKind");
}

}  // namespace shardtensor
