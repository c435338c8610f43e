// Comm: the collectives of one mesh-dimension group, as the layers above see them.
//
// Group ranks follow the mesh coordinate along that dim (group rank i is coordinate i). Every
// call blocks until done and raises, on every rank that waits, if the group's timeout passes,
// so a rank that failed before a collective makes the others fail instead of hang.
// This header names no c10d type: src/comm/c10d_*.cpp are the only files that include c10d.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/placement.h"

namespace at {
class Tensor;
}

namespace shardtensor {

// A batch of point-to-point messages within a group. Every tensor is contiguous and stays
// untouched (sends) or unread (receives) until wait(). Between a pair of ranks, the k-th
// receive posted matches the k-th send posted, with the same number of elements.
class Messages {
 public:
  virtual ~Messages() = default;
  virtual void receive(int64_t peer, const at::Tensor& into) = 0;
  virtual void send(int64_t peer, const at::Tensor& from) = 0;
  virtual void wait() = 0;  // raises on every waiting rank after the group's timeout
  // Optional, before any receive or send: the bytes this batch sends each peer and receives from
  // each (indexed by group rank). Where fingerprints are checked, the members then exchange them
  // at once, and each receive is posted as soon as its sender's record has arrived and matched,
  // instead of once every member has reached wait(): the transfers overlap the caller's packing
  // and local copies again. Receives and sends must then add up to exactly these bytes.
  // `checked_peers` (group ranks; empty: every member): the records go to these peers only,
  // which must include every peer this batch moves bytes with. No byte is ever received
  // unchecked either way; a member left out that runs something else is caught by the next
  // batch that checks it (its record, left unread, fails the sequence check first), not by
  // this one. For a fixed pattern that every step repeats: attention's ring checks its two
  // neighbours, whatever moves, instead of all n - 1 members.
  virtual void announce(const std::vector<int64_t>& bytes_to, const std::vector<int64_t>& bytes_from,
                        const std::vector<int64_t>& checked_peers = {}) {}
};

class Comm {
 public:
  Comm();
  virtual ~Comm();

  virtual int64_t rank() const = 0;  // this process's rank in the group
  virtual int64_t size() const = 0;
  virtual const std::vector<int64_t>& global_ranks() const = 0;
  virtual std::string backend_name() const = 0;
  // "the group of global ranks [0, 2]": how errors name this group.
  std::string group_name() const;
  // A number no other Comm of this process has had: how a compiled graph's traced exchanges
  // name the group they run on (redistribute/transports/traced_exchange.cpp).
  int64_t number() const { return number_; }
  // How long a member waits for the others in a collective before it raises.
  virtual std::chrono::milliseconds timeout() const = 0;

  // The communicator whose bytes move: this one, or the eager one a traced Comm stands for.
  virtual Comm& eager() { return *this; }
  // Whether this Comm records its collectives in a graph being traced instead of moving bytes
  // (comm/traced_comm.h): a transport handed one records its own moves as graph operators too.
  virtual bool records_graph() const { return false; }
  // This group's traced form (comm/traced_comm.h), where it has one.
  virtual Comm* traced_form() { return nullptr; }

  // Every rank gives `input` of one shape; `output` ([size(), *input.shape], contiguous) gets
  // them in group-rank order.
  virtual void all_gather(const at::Tensor& input, const at::Tensor& output) = 0;
  // In place. Avg is a sum followed by a division, since Gloo has no average.
  virtual void all_reduce(const at::Tensor& tensor, ReduceOp op) = 0;
  // In place: every rank ends with `root`'s tensor (root is a group rank).
  virtual void broadcast(const at::Tensor& tensor, int64_t root) = 0;
  virtual void barrier() = 0;
  // `input` and `output` are 1-D and contiguous: the first input_splits[0] elements of input go
  // to group rank 0, the next input_splits[1] to rank 1, ...; output receives output_splits[i]
  // elements from rank i, in rank order. Splits may be zero (no message) and differ per rank.
  virtual void all_to_all(const at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_splits,
                          const std::vector<int64_t>& input_splits) = 0;
  // `input` (contiguous, size() * output.numel() elements) holds one block per group rank, in
  // rank order; `output` (contiguous) gets this rank's block reduced over the group. Backends
  // without a native reduce-scatter (Gloo on libtorch 1.x) run it as an all_to_all of the
  // blocks and a local reduction. Counted as one reduce_scatter.
  virtual void reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op);
  // An all-to-all as a batch of point-to-point messages, posted as they become ready, so that
  // packing and local copies overlap the transfers. Counted as one all_to_all.
  // CommDebugMode counts the batch as one `counted_as`; with `counts` false it only adds its
  // bytes (the second phase of one collective).
  virtual std::unique_ptr<Messages> start_messages(const char* counted_as = "all_to_all", bool counts = true);
  // The same batch carried by one all_to_all with split sizes at wait(): the native collective
  // where a step's transport is Collective (redistribute/transport.h).
  std::unique_ptr<Messages> start_all_to_all(const char* counted_as = "all_to_all", bool counts = true);

  // State a layer above keeps per communicator (the peer memory transport's probe and mailbox:
  // redistribute/transports/peer_memory/), made on first use and destroyed with the Comm, which
  // knows nothing of what it holds. `key`: the address of something of the owner's.
  struct Attachment {
    virtual ~Attachment() = default;
  };
  // A traced Comm shares its eager one's.
  std::unique_ptr<Attachment>& attachment(const void* key) { return eager().attachments_[key]; }
  // Destroys them now, before the Comm (at shutdown: release_communicators).
  void drop_attachments() { attachments_.clear(); }

 protected:
  // A Comm that stands for another's group, under its number (comm/traced_comm.h).
  explicit Comm(int64_t number) : number_(number) {}

 private:
  std::map<const void*, std::unique_ptr<Attachment>> attachments_;
  int64_t number_;
};

// How many process groups have become unusable in this process (a collective on them failed
// or timed out; the count only grows). Dispatch compares it at each propagation lookup and drops
// the layout caches when it changed: their entries keep meshes alive, and with them the broken
// groups, whose Gloo event loops would otherwise go on polling the abandoned exchanges.
uint64_t broken_group_count();

// The group of a mesh dim of size 1: every collective is a local copy.
std::shared_ptr<Comm> make_self_comm(int64_t global_rank);

}  // namespace shardtensor
