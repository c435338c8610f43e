// Messages: the exchange's parts as point-to-point messages (Gloo's send and recv, or the
// backend's own batch; see comm.h: Comm::start_messages), posted as they become ready, so
// that packing and the local work overlap the transfers (posted_parts.h).
#include "comm/comm.h"
#include "redistribute/transports/posted_parts.h"

namespace shardtensor {

const PartTransport& messages_transport() {
  static const PostedPartsTransport transport(&Comm::start_messages);
  return transport;
}

}  // namespace shardtensor
