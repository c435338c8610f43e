// See part_transport.h: the choice among the transports, and what they share.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "redistribute/transports/part_transport.h"

#include "comm/comm.h"
#include "redistribute/transports/peer_memory/peer_memory.h"

namespace shardtensor {

at::Tensor view_of_part(const at::Tensor& t, const Box& holds, const Box& part) {
  at::Tensor v = t.dim() == static_cast<int64_t>(holds.shape.size()) ? t : t.view(holds.shape);
  for (int64_t d = 0; d < v.dim(); ++d) v = v.narrow(d, part.offsets[d] - holds.offsets[d], part.shape[d]);
  return v;
}

StepTransport available_on(Comm& comm, StepTransport how) {
  const bool through_memory = how.kind == TransportKind::PeerMemory || how.kind == TransportKind::SharedArena;
  if (!through_memory) return how;
  const PeerMemory* memory = peer_memory_of(comm);
  if (!memory)
    how.kind = TransportKind::Messages;
  else if (!memory->reads_in_place())
    how.kind = TransportKind::PeerMemory;  // a member has no arena, or cannot map another's
  return how;
}

void move_parts(Comm& comm, const StepTransport& how, const PartExchange& exchange) {
  const StepTransport available = available_on(comm, how);
  // A graph holds every exchange of parts as one shardtensor::exchange_parts call
  // (traced_exchange.cpp), an ordered effect that moves the parts by this transport when the
  // graph runs. Not as torch's all_to_all_single: what a rank sends differs between ranks, and a
  // rank that sends nothing would hand it a fresh buffer that depends on no input, which
  // AOTAutograd then puts in the forward graph on that rank alone (a backward exchange of the
  // causal ring, say), and Inductor may reorder it; the ranks would run their collectives in
  // different orders. Ordered effects keep every rank's exchanges in the traced order.
  if (comm.records_graph() && available.kind != TransportKind::None) {
    traced_exchange_transport().move(comm, exchange, available);
    return;
  }
  switch (available.kind) {
    case TransportKind::PeerMemory:
    case TransportKind::SharedArena:
      if (peer_memory_transport().move(comm, exchange, available)) return;
      break;  // the group has gone back to messages for good
    case TransportKind::Collective:
      all_to_all_transport().move(comm, exchange, how);
      return;
    case TransportKind::None:
      if (!comm.records_graph()) break;
      all_to_all_transport().move(comm, exchange, how);  // a one-member group: a graph holds no messages
      return;
    case TransportKind::Messages:
      break;
  }
  messages_transport().move(comm, exchange, how);
}

}  // namespace shardtensor
