// Transfers through the peers' memory (peer_memory.h) instead of messages: on a group
// whose members share this host, each part is copied once, straight from the holder's local
// tensor into the receiver's result, with no packing and no socket. The receiver reads it, or,
// where the holder's side lies in more stretches than the receiver's, the holder writes it.
// Each side offers its buffer with the boxes it covers; the copier checks the offer against the
// part it expects.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "redistribute/boxes.h"
#include "redistribute/transports/reduction.h"

namespace shardtensor {

class Comm;
class PeerMemory;


// The size per rank from which a transfer goes through peer memory (transport.h:
// uses_peer_memory): 0 by default, since the mailbox handshake (two polled rounds, no socket) beats
// Gloo at every size measured, from 4 bytes up (bench/RESULTS.md, "Small transfers": a small all-reduce
// 3-10x, small all-gathers and all-to-alls 2-8x, at 2 and 4 ranks), where the Gloo path pays a
// fingerprint round of messages and then the collective. SHARDTENSOR_PEER_COPY_BYTES or
// TransportOptions::peer_copy_bytes raise it. Every rank must hold the same value.
constexpr int64_t kDefaultPeerCopyBytes = 0;
// Test hook: this rank's next `count` part copies fail, as a denied or faulting copy would, so
// that the fallback to messages can be tested.
void fail_next_peer_copies(int count);
// Whether this copy is one of those (then `error` says so); each call uses one up.
bool take_injected_copy_failure(std::string& error);
// How many parts this process has written into its peers' memory as their holder (the rest
// were read by their receivers); tests check which side copied.
int64_t peer_parts_written();
// How many parts this process has read in place from its peers' shared arenas (arena.h),
// copied or combined straight from there.
int64_t peer_parts_read_in_place();
// How many reduce-scatters this process combined straight from its peers' arenas.
int64_t peer_reductions_in_place();

// Moves every part this rank holds or receives (`parts` lists them; parts this rank keeps are
// copied by the caller): this rank offers `source` (which covers p.holder_holds of each part it
// holds) and `destination` (which covers p.receiver_holds of each part it receives, and which
// the caller allocated for this exchange and shares with no one: should the exchange fail, a
// late peer may still write into it, and it is then kept, never freed).
// Counted as one `counted_as` that sent what this rank holds. `local_work` (the caller's own
// part, say) runs once this rank's offers are posted, while the peers post theirs. False, on every member alike,
// when a copy failed: the group has then gone back to messages for good, and the caller moves
// the data that way. Raises on every member when the ranks disagree on the operation or the
// parts, or when a member is gone or gave up (see PeerMemory::Exchange).
// With `reduction` (a reduce-scatter; reduction.h), its result lands in reduction->out: straight
// from the holders' memory where every received part lies in its holder's arena.
// With `in_place` (the SharedArena transport, the same on every member) and a group whose
// members map each other's arenas, parts that lie in their holder's arena are read in place and
// no member writes into another; otherwise every part crosses by cross-memory attach.
bool copy_through_memory(Comm& comm, PeerMemory& memory, const at::Tensor& source, const at::Tensor& destination,
                         const std::vector<PeerPart>& parts, const char* counted_as, bool counts = true,
                         const std::function<void()>& local_work = {}, const PartReduction* reduction = nullptr,
                         bool in_place = false);

}  // namespace shardtensor
