// Which transport carries each step of a redistribute plan, chosen before any byte moves.
//
// The choice is a pure function of the step, its two layouts, the mesh's device and the plan's
// transport options (shardtensor/transport_options.h), so every rank makes the same one without
// communicating. It is made once, when a plan is made (plan.h), and explain_redistribute
// prints the one the executor runs:
//   - Collective: one native c10d collective per step: all_gather where the gathered pieces
//     are equal, reduce_scatter where the scattered pieces are, all_reduce, and all_to_all
//     with split sizes otherwise (uneven pieces travel unpadded). What NCCL needs, and what
//     SHARDTENSOR_TRANSPORT=collectives asks for on Gloo.
//   - PeerMemory: same-host copies between the ranks' memory (transports/peer_memory/peer_memory.h); the CPU
//     default at every size (see kDefaultPeerCopyBytes). Where the group's members turn out not to share a
//     host (the probe fails), or a copy fails, the executor sends messages instead.
//   - SharedArena: the same, where the options say shared_arena (the default with SHARDTENSOR_ARENA=1):
//     parts that lie in their holders' shared arenas are read in place, and no member writes into
//     another. Where a member has no arena, the group copies as PeerMemory does.
//   - Messages: Gloo point-to-point messages, posted as they become ready, so that packing
//     and local copies overlap the transfers.
//   - None: no byte crosses ranks (a local slice, a one-rank group).
#pragma once

#include <string>

#include "redistribute/plan.h"

namespace shardtensor {

// Below this a CPU all-reduce that does not go through memory is c10d's own (one round);
// above it, a reduce-scatter and an all-gather of messages (the bytes of a ring, no copy of
// the input first): as messages, two rounds cost more latency than the copy c10d's needs.
constexpr int64_t kMessagesAllReduceBytes = 2 << 20;

// This process's defaults, which plans take where their TransportOptions and the open scopes
// leave a field unset; read once, from the environment, and never changed after (every rank
// must see the same):
//   SHARDTENSOR_TRANSPORT ("auto", the default; "collectives"; "messages"):
//     Auto:        CUDA meshes: collectives. CPU: peer memory for large transfers, messages
//                  otherwise, c10d's all_reduce for small reductions.
//     Collectives: native collectives on every device.
//     Messages:    CPU transfers as point-to-point messages, never peer memory (the two-phase
//                  all-reduce included); CUDA meshes still use collectives (NCCL gets no
//                  point-to-point batches here).
//   SHARDTENSOR_PEER_MEMORY=0 (transports/peer_memory/: never probed), SHARDTENSOR_PEER_COPY_BYTES
//   (kDefaultPeerCopyBytes) and SHARDTENSOR_MESSAGE_BYTES (kDefaultMessageBytes) refine Auto.
const ResolvedTransportOptions& process_transport_defaults();
std::string to_string(TransportPreference preference);

// The transport of `step`, which turns `from` into `to`, on this rank (whose mesh coordinate
// is from.mesh().coordinate()) under `options`. Equal on the members of the step's group.
StepTransport transport_for(const MoveStep& step, const ShardTensorSpec& from, const ShardTensorSpec& to,
                            const ResolvedTransportOptions& options);

// Whether a transfer in which each member of a group on `mesh` moves `bytes_per_rank` goes
// through peer memory under `options` (where the group has it: peer_memory_of(comm)): a
// redistribute step's choice, and a halo exchange's (domain/kernel_moves.h). Every member must pass
// the same `bytes_per_rank`.
bool uses_peer_memory(const DeviceMesh& mesh, int64_t bytes_per_rank, const ResolvedTransportOptions& options = resolve());
// Which same-host transport such a transfer takes: SharedArena where the options allow reading
// in place, else PeerMemory.
TransportKind same_host_kind(const ResolvedTransportOptions& options);

// The transport of an exchange of parts in which each member of a group on `mesh` moves at most
// `bytes_per_rank`, of tensors on the CPU or not (`on_cpu`): a halo exchange's and a zigzag
// reorder's. Peer memory where uses_peer_memory says so (messages where the group turns out to
// have none: part_transport.h), point-to-point messages where the options prefer them, else
// one all_to_all with split sizes. Equal on every member; `counted_as` names it for
// CommDebugMode.
StepTransport exchange_transport(const DeviceMesh& mesh, int64_t bytes_per_rank, bool on_cpu, const char* counted_as,
                                 const ResolvedTransportOptions& options = resolve());

// The transport of an all-reduce of `bytes_per_rank` over the group of `mesh_dim`: an AllReduce
// step's, and a kernel's mid-op reduction's (executor.h: reduce_in_place).
StepTransport reduction_transport(const DeviceMesh& mesh, int64_t mesh_dim, int64_t bytes_per_rank,
                                  const ResolvedTransportOptions& options = resolve());

// "all_gather (c10d collective)", "peer memory", "shared arena", "messages", "local".
std::string to_string(const StepTransport& transport);

// Whether `step`'s pieces are equal over its group, so that a fixed-size collective
// (all_gather, reduce_scatter) carries it without padding.
bool pieces_are_equal(const MoveStep& step, const ShardTensorSpec& from, const ShardTensorSpec& to);

}  // namespace shardtensor
