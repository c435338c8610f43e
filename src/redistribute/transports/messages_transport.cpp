// Messages: the exchange's parts as point-to-point messages (Gloo's send and recv, or the
// backend's own batch; see comm.h: Comm::start_messages), posted as they become ready, so
// that packing and the local work overlap the transfers.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "comm/comm.h"
#include "redistribute/transports/posted_parts.h"

namespace shardtensor {
namespace {

class MessagesTransport final : public PartTransport {
 public:
  bool move(Comm& comm, const PartExchange& exchange) const override {
    post_parts(comm, *comm.start_messages(exchange.counted_as, exchange.counts), exchange);
    return true;
  }
};

}  // namespace

const PartTransport& messages_transport() {
  static const MessagesTransport transport;
  return transport;
}

}  // namespace shardtensor
