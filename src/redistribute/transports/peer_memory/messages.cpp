// See messages.h.
#include "redistribute/transports/peer_memory/messages.h"

#include <c10/util/Exception.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm_debug.h"
#include "comm/fingerprint.h"
#include "redistribute/transports/peer_memory/peer_memory.h"
#include "redistribute/transports/peer_memory/copies.h"
#include "redistribute/transport.h"

namespace shardtensor {
namespace {

// One message as its sender offers it: three words in the sender's mailbox table.
constexpr size_t kOfferWords = 3;  // receiver, address, bytes

class PeerMemoryMessages final : public Messages {
 public:
  PeerMemoryMessages(Comm& comm, PeerMemory& memory, const char* counted_as, bool counts, bool in_place)
      : comm_(comm), memory_(memory), counted_as_(counted_as), counts_(counts), in_place_(in_place) {}

  void announce(const std::vector<int64_t>& bytes_to, const std::vector<int64_t>& bytes_from, const std::vector<int64_t>&) override {
    announced_ = {bytes_to, bytes_from};
  }
  void receive(int64_t peer, const at::Tensor& into) override {
    if (into.numel() == 0) return;
    TORCH_INTERNAL_ASSERT(into.is_contiguous() && into.is_cpu() && peer != comm_.rank());
    receives_.push_back({peer, into});
  }
  void send(int64_t peer, const at::Tensor& from) override {
    if (from.numel() == 0) return;
    TORCH_INTERNAL_ASSERT(from.is_cpu() && peer != comm_.rank());
    sends_.push_back({peer, from.contiguous()});
  }

  void wait() override {
    fault_point("messages:wait");
    std::vector<int64_t> bytes_to(comm_.size(), 0), bytes_from(comm_.size(), 0);
    std::vector<uint64_t> offers;
    for (const Message& s : sends_) {
      bytes_to[s.peer] += static_cast<int64_t>(s.tensor.nbytes());
      offers.insert(offers.end(), {static_cast<uint64_t>(s.peer), reinterpret_cast<uintptr_t>(s.tensor.data_ptr()), s.tensor.nbytes()});
    }
    for (const Message& r : receives_) bytes_from[r.peer] += static_cast<int64_t>(r.tensor.nbytes());
    if (announced_)
      TORCH_INTERNAL_ASSERT(announced_->first == bytes_to && announced_->second == bytes_from, "a message batch moved other bytes than it announced");
    int64_t bytes_sent = 0;
    for (int64_t b : bytes_to) bytes_sent += b;
    record_collective(counted_as_, bytes_sent, counts_);

    PeerMemory::Exchange exchange(memory_, fingerprint_of(std::string(counted_as_) + " (messages through peer memory)"), offers, in_place_);
    // As with messages, the k-th receive from a peer takes the k-th message that peer addressed
    // to this rank.
    std::vector<size_t> next(comm_.size(), 0);
    bool ok = true;
    std::string error;
    for (const Message& r : receives_) {
      const std::vector<uint64_t>& theirs = exchange.offers_of(r.peer);
      size_t& at = next[r.peer];
      while (at + kOfferWords <= theirs.size() && theirs[at] != static_cast<uint64_t>(comm_.rank())) at += kOfferWords;
      TORCH_CHECK(at + kOfferWords <= theirs.size(), "shardtensor: \"", exchange.operation().description, "\" on ", comm_.group_name(),
                  ": group rank ", r.peer, " sent this rank (group rank ", comm_.rank(), ") fewer messages than it receives from it");
      TORCH_CHECK(theirs[at + 2] == r.tensor.nbytes(), "shardtensor: \"", exchange.operation().description, "\" on ", comm_.group_name(),
                  ": group rank ", r.peer, " sent a message of ", theirs[at + 2], " bytes where this rank (group rank ", comm_.rank(),
                  ") receives ", r.tensor.nbytes(), " bytes: the ranks disagree on the sizes");
      if (ok) ok = !take_injected_copy_failure(error) && exchange.read(r.peer, {{theirs[at + 1], r.tensor.data_ptr(), r.tensor.nbytes()}}, error);
      at += kOfferWords;
    }
    // A message no receive takes would be lost without a word (Gloo would hang on it instead).
    for (int64_t p = 0; p < comm_.size(); ++p) {
      if (p == comm_.rank()) continue;
      const std::vector<uint64_t>& theirs = exchange.offers_of(p);
      for (size_t at = next[p]; at + kOfferWords <= theirs.size(); at += kOfferWords)
        TORCH_CHECK(theirs[at] != static_cast<uint64_t>(comm_.rank()), "shardtensor: \"", exchange.operation().description, "\" on ",
                    comm_.group_name(), ": group rank ", p, " sent this rank (group rank ", comm_.rank(),
                    ") more messages than it receives from it");
    }
    if (!ok) TORCH_WARN("shardtensor: reading a message from a peer's memory failed (", error, "); the group goes back to Gloo messages.");
    if (exchange.finish(ok)) return;
    // Every member saw the failure: this batch, and the group from now on, go as messages.
    stop_peer_memory(comm_, ok ? "another member's copy failed" : "a copy failed: " + error);
    auto messages = comm_.start_messages(counted_as_, /*counts=*/false);
    if (announced_) messages->announce(announced_->first, announced_->second);
    for (const Message& s : sends_) messages->send(s.peer, s.tensor);
    for (const Message& r : receives_) messages->receive(r.peer, r.tensor);
    messages->wait();
  }

 private:
  struct Message {
    int64_t peer;
    at::Tensor tensor;
  };

  Comm& comm_;
  PeerMemory& memory_;
  const char* counted_as_;
  bool counts_;
  bool in_place_;  // messages that lie in their sender's shared arena are read there (TransportOptions::shared_arena)
  std::optional<std::pair<std::vector<int64_t>, std::vector<int64_t>>> announced_;
  std::vector<Message> sends_, receives_;
};

}  // namespace

std::unique_ptr<Messages> start_same_host_messages(Comm& comm, bool on_cpu, const char* counted_as, bool counts) {
  // The transport options in force on this thread (a TransportOptionsScope over the process's
  // defaults) decide, as they do for every other movement. peer_memory_of(comm) is null for one
  // member, NCCL, SHARDTENSOR_PEER_MEMORY=0 or a failed probe.
  const ResolvedTransportOptions options = resolve();
  if (on_cpu && options.preference == TransportPreference::Auto && options.peer_memory)
    if (PeerMemory* memory = peer_memory_of(comm))
      return std::make_unique<PeerMemoryMessages>(comm, *memory, counted_as, counts, options.shared_arena);
  return comm.start_messages(counted_as, counts);
}

}  // namespace shardtensor
