// PeerMemory: on a group whose members share this host, each part is copied once, straight from
// its holder's tensor into its receiver's (copies.h: the offers, who copies, the checks of
// fingerprints and extents; peer_memory.h: what a timeout leaves safe).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "comm/comm.h"
#include "redistribute/transports/part_transport.h"
#include "redistribute/transports/peer_memory/peer_memory.h"

namespace shardtensor {
namespace {

class PeerMemoryTransport final : public PartTransport {
 public:
  bool move(Comm& comm, const PartExchange& exchange, const StepTransport& how) const override {
    PeerMemory* memory = peer_memory_of(comm);
    if (!memory) return false;
    // Peers compute where a part lies in the holder's tensor from its box: it must be contiguous.
    return copy_through_memory(comm, *memory, exchange.source.contiguous(), exchange.destination, exchange.parts,
                               exchange.counted_as, exchange.counts, exchange.local_work,
                               exchange.reduction ? &*exchange.reduction : nullptr, how.kind == TransportKind::SharedArena);
  }
};

}  // namespace

const PartTransport& peer_memory_transport() {
  static const PeerMemoryTransport transport;
  return transport;
}

}  // namespace shardtensor
