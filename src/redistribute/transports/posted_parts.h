// What the two message transports share: an exchange's parts posted on a batch of messages
// (comm.h: Messages), which either sends them point to point or carries them in one
// all_to_all at wait().
#pragma once

#include "redistribute/transports/part_transport.h"

namespace shardtensor {

class Messages;

// Announces the exchange's bytes per peer, posts every send (each part a view of the source:
// no copy for a row block), then every receive (straight into the destination where the part
// is contiguous there, else into a staging buffer), runs local_work while they travel, waits,
// and copies the staged parts into place.
void post_parts(Comm& comm, Messages& batch, const PartExchange& exchange);

}  // namespace shardtensor
