// Comm's default message batch, for backends without point-to-point messages here: it holds
// the messages until wait(), then runs them as one all_to_all with split sizes. Also the
// communicator's peer-memory state: probed on first use, dropped for good after a failure.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "comm/comm.h"
#include "comm/comm_debug.h"
#include "comm/peer_memory.h"
#include "util/strings.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>

namespace shardtensor {
namespace {

class PackedMessages final : public Messages {
 public:
  PackedMessages(Comm& comm, const char* counted_as, bool counts)
      : comm_(comm), sends_(comm.size()), receives_(comm.size()), counted_as_(counted_as), counts_(counts) {}

  void receive(int64_t peer, const at::Tensor& into) override { receives_[peer].push_back(into); }
  void send(int64_t peer, const at::Tensor& from) override { sends_[peer].push_back(from); }

  void wait() override {
    if (comm_.size() == 1) return;  // a one-rank group has no one to message
    std::vector<int64_t> send_splits(comm_.size(), 0), receive_splits(comm_.size(), 0);
    std::vector<at::Tensor> outgoing;
    c10::optional<at::TensorOptions> options;
    for (int64_t peer = 0; peer < comm_.size(); ++peer) {
      for (const at::Tensor& t : sends_[peer]) {
        outgoing.push_back(t.reshape({-1}));
        send_splits[peer] += t.numel();
        options = t.options();
      }
      for (const at::Tensor& t : receives_[peer]) {
        receive_splits[peer] += t.numel();
        options = t.options();
      }
    }
    if (!options) options = at::TensorOptions();
    int64_t received = 0;
    for (int64_t n : receive_splits) received += n;
    at::Tensor packed = outgoing.empty() ? at::empty({0}, *options) : at::cat(outgoing);
    at::Tensor unpacked = at::empty({received}, *options);
    {
      // Counted as the batch says, not as the all_to_all that carries it.
      CommDebugPause pause;
      comm_.all_to_all(unpacked, packed, receive_splits, send_splits);
    }
    int64_t sent = 0;
    for (int64_t peer = 0; peer < comm_.size(); ++peer)
      if (peer != comm_.rank()) sent += send_splits[peer];
    record_collective(counted_as_, sent * static_cast<int64_t>(packed.element_size()), counts_);
    int64_t offset = 0;
    for (const auto& pieces : receives_)
      for (const at::Tensor& t : pieces) {
        t.view({-1}).copy_(unpacked.narrow(0, offset, t.numel()));
        offset += t.numel();
      }
  }

 private:
  Comm& comm_;
  std::vector<std::vector<at::Tensor>> sends_, receives_;
  const char* counted_as_;
  bool counts_;
};

}  // namespace

Comm::Comm() = default;

std::string Comm::group_name() const { return "the group of global ranks [" + join(global_ranks(), ", ") + "]"; }
Comm::~Comm() = default;

PeerMemory* Comm::peer_memory() {
  // Host memory only: a CUDA group (NCCL) moves device tensors, and its probe would need them.
  if (size() == 1 || !peer_memory_enabled() || backend_name() == "nccl") return nullptr;
  if (!peer_memory_probed_) {
    peer_memory_ = PeerMemory::probe(*this, why_no_peer_memory_);
    peer_memory_probed_ = true;
  }
  // A member that gave up an exchange (an error) never offers or reads through memory again.
  if (peer_memory_ && peer_memory_->closed()) stop_peer_memory("an exchange through peer memory failed on this rank");
  return peer_memory_.get();
}

void Comm::stop_peer_memory(const std::string& why) {
  peer_memory_.reset();
  why_no_peer_memory_ = why;
  peer_memory_probed_ = true;
}

std::unique_ptr<Messages> Comm::start_messages(const char* counted_as, bool counts) {
  return std::make_unique<PackedMessages>(*this, counted_as, counts);
}

}  // namespace shardtensor
