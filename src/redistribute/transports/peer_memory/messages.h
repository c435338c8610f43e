// Point-to-point message batches through the peers' memory, for callers whose every group
// member starts each batch and waits on it together (attention's ring, zigzag reordering).
//
// Over Gloo a batch first sends fixed-size fingerprint records to every checked peer, then the
// messages: two socket round trips per batch, 4-7 ms at 4 ranks on 2 cores. Through peer memory
// the same batch is one PeerMemory::Exchange: each member offers its messages (receiver,
// address, bytes) in its mailbox, every receiver reads what is addressed to it, and every
// member posts "done" (bench/RESULTS.md, "Small transfers": 2-10x faster than the checked
// Gloo path). The bytes move inside wait(), so a batch no longer overlaps the caller's compute;
// that overlap hid less than the round trips cost.
//
// Same guarantees as the redistribute exchanges (peer_memory.h): the fingerprint is
// compared before any byte moves; a peer that is gone or gave up is an error on every member;
// a message whose size differs from the receive posted for it is an error naming both sizes;
// a failed copy (every member learns it) makes the group send this batch and every later one as
// Gloo messages.
#pragma once

#include <memory>

#include "comm/comm.h"

namespace shardtensor {

// A message batch on `comm`: through peer memory where the group's members share this host
// (the first call probes, on every member), the tensors are CPU ones (`on_cpu`, the same on
// every member: the mesh's device), and the transport options in force on this thread (a
// TransportOptionsScope over the process's defaults) say "auto" with peer memory on; otherwise
// comm.start_messages(). Every member must call it for every batch, in the same order.
std::unique_ptr<Messages> start_same_host_messages(Comm& comm, bool on_cpu, const char* counted_as, bool counts = true);

}  // namespace shardtensor
