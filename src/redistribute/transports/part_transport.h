// The one seam through which bytes cross ranks: an exchange of parts, described once in
// boxes, moved by any transport.
//
// The executor (redistribute steps, scatters, the reductions' two phases) and the halo
// exchange (domain/kernel_moves.h) describe what moves as a PartExchange: which part of which member's
// tensor lands where in which member's tensor. They never post a message or a copy
// themselves; a PartTransport does, one implementation per file:
//   - messages_transport.cpp:    point-to-point messages, posted as they become ready;
//   - collective_transport.cpp:  one c10d all_to_all with split sizes (uneven parts travel
//                                unpadded), and the native collectives of equal-piece steps;
//   - peer_memory/transport.cpp: same-host copies straight between the members' memory, or
//                                in place from their shared arenas (SharedArena);
//   - traced_exchange.cpp:       while torch.compile traces, a peer-memory step as one
//                                shardtensor::exchange_parts node of the graph, which moves it
//                                through peer memory when the graph runs
// Which one runs is the step's StepTransport, chosen once per plan (redistribute/transport.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "redistribute/transports/peer_memory/copies.h"
#include "redistribute/transports/reduction.h"
#include "redistribute/plan.h"

namespace shardtensor {

class Comm;

// One exchange over a group, as this member sees it. Every part of `parts` moves from its
// holder to its receiver (group ranks), and this member is one of the two (a halo lists several
// parts for one pair, one per stretch); a member's part to itself is not listed (`local_work` copies
// it). All members describe the same exchange: each part is listed, with the same part box, by
// its holder and by its receiver (each side's holds may be its own only: a halo's receiver does
// not know how its holder lays out what it sends).
struct PartExchange {
  PartExchange(std::vector<PeerPart> parts, at::Tensor source, at::Tensor destination, const char* counted_as = "all_to_all",
               bool counts = true)
      : parts(std::move(parts)), source(std::move(source)), destination(std::move(destination)), counted_as(counted_as), counts(counts) {}

  std::vector<PeerPart> parts;
  // Covers p.holder_holds of every part this member holds: any strides, and it may lack the
  // leading extent-1 dims of holder_holds (a stack slot).
  at::Tensor source;
  // Covers p.receiver_holds of every part this member receives; contiguous, allocated for this
  // exchange and shared with no one (peers may write into it: peer_memory/copies.h).
  at::Tensor destination;
  // What CommDebugMode counts the exchange as; with `counts` false, only its bytes (the second
  // phase of one collective).
  const char* counted_as;
  bool counts;
  // Runs once this member's transfers are posted, while they travel: its own part, say.
  std::function<void()> local_work;
  // Set for a reduce-scatter: the exchange's result is then reduction->out, and the destination's
  // slots may stay unfilled (reduction.h).
  std::optional<PartReduction> reduction;
};

// How a group moves an exchange's parts.
class PartTransport {
 public:
  virtual ~PartTransport() = default;
  // Moves every part of `exchange` and runs its local_work, then combines the parts into
  // exchange.reduction's `out` where it is set. False, on every member alike,
  // where this transport turned out unable to (the members do not share memory, or a copy
  // failed): the caller then moves the exchange another way, which rewrites every part.
  // Raises on every member when the members disagree on the exchange, or one is gone, stopped
  // or gave up (the group's timeout). `how` is the step's choice (its message size, say).
  virtual bool move(Comm& comm, const PartExchange& exchange, const StepTransport& how) const = 0;
};

const PartTransport& messages_transport();
const PartTransport& all_to_all_transport();
const PartTransport& peer_memory_transport();
// While torch.compile traces: an exchange as one shardtensor::exchange_parts node of the graph,
// moved by its transport when the graph runs (traced_exchange.cpp).
const PartTransport& traced_exchange_transport();

// The transport a group can run `how` with now: a PeerMemory or SharedArena step becomes
// Messages where the group has no peer memory (its members do not share a host, or an earlier
// copy failed), and a SharedArena one PeerMemory where a member cannot read the others' arenas.
// The first call on a group with peer memory switched on probes it, on every member together.
StepTransport available_on(Comm& comm, StepTransport how);

// Moves `exchange` by `how`'s transport (None, Collective and Messages: as messages or one
// all_to_all; PeerMemory and SharedArena: through memory, or as messages where that turns out
// unable). While tracing, records it as one shardtensor::exchange_parts call that does so when
// the graph runs (traced_exchange.cpp).
void move_parts(Comm& comm, const StepTransport& how, const PartExchange& exchange);

// The part of `t`, which covers `holds`, that covers `part`, as a view; `t` may lack
// holds' leading extent-1 dims.
at::Tensor view_of_part(const at::Tensor& t, const Box& holds, const Box& part);

}  // namespace shardtensor
