// What the two message transports share: an exchange's parts posted on a batch of messages
// (comm.h: Messages), which either sends them point to point or carries them in one
// all_to_all at wait().
#pragma once

#include <memory>

#include "redistribute/transports/part_transport.h"

namespace shardtensor {

class Messages;

// A transport that posts the parts on the batch `start` opens: Comm::start_messages (point to
// point; messages_transport.cpp) or Comm::start_all_to_all (one all_to_all at wait();
// collective_transport.cpp).
class PostedPartsTransport final : public PartTransport {
 public:
  using StartBatch = std::unique_ptr<Messages> (Comm::*)(const char* counted_as, bool counts);
  explicit PostedPartsTransport(StartBatch start) : start_(start) {}
  bool move(Comm& comm, const PartExchange& exchange, const StepTransport& how) const override;

 private:
  StartBatch start_;
};

// Announces the exchange's bytes per peer, posts every send (each part a view of the source:
// no copy for a row block), then every receive (straight into the destination where the part
// is contiguous there, else into a staging buffer), runs local_work while they travel, waits,
// and copies the staged parts into place. A part travels as messages of about `message_bytes`.
void post_parts(Comm& comm, Messages& batch, const PartExchange& exchange, int64_t message_bytes);

}  // namespace shardtensor
