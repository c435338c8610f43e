// Comm's default message batch, for backends without point-to-point messages here: it holds
// the messages until wait(), then runs them as one all_to_all with split sizes. The
// reduce-scatter of backends without one. Also the
// communicator's peer-memory state: probed on first use, dropped for good after a failure.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "comm/comm.h"
#include "comm/comm_debug.h"
#include "util/strings.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/amin.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/prod.h>
#include <ATen/ops/sum.h>

#include <atomic>

namespace shardtensor {
namespace {

class PackedMessages final : public Messages {
 public:
  PackedMessages(Comm& comm, const char* counted_as, bool counts)
      : comm_(comm),
        device_(comm.backend_name() == "nccl" ? at::Device(at::kCUDA) : at::Device(at::kCPU)),  // NCCL: the current device
        sends_(comm.size()),
        receives_(comm.size()),
        counted_as_(counted_as),
        counts_(counts) {}

  void receive(int64_t peer, const at::Tensor& into) override { keep(receives_[peer], into); }
  void send(int64_t peer, const at::Tensor& from) override { keep(sends_[peer], from); }

  // Everything travels as bytes: a rank with nothing to send or receive knows no dtype, and the
  // members' fingerprints of the all_to_all must agree (the step's description names the dtype).
  void wait() override {
    if (comm_.size() == 1) return;  // a one-rank group has no one to message
    std::vector<int64_t> send_splits(comm_.size(), 0), receive_splits(comm_.size(), 0);
    std::vector<at::Tensor> outgoing;
    for (int64_t peer = 0; peer < comm_.size(); ++peer) {
      for (const at::Tensor& t : sends_[peer]) {
        outgoing.push_back(as_bytes(t));
        send_splits[peer] += outgoing.back().numel();
      }
      for (const at::Tensor& t : receives_[peer]) receive_splits[peer] += static_cast<int64_t>(t.nbytes());
    }
    const at::TensorOptions bytes = at::TensorOptions().dtype(at::kByte).device(device_);
    int64_t received = 0;
    for (int64_t n : receive_splits) received += n;
    at::Tensor packed = outgoing.empty() ? at::empty({0}, bytes) : at::cat(outgoing);
    at::Tensor unpacked = at::empty({received}, bytes);
    {
      // Counted as the batch says, not as the all_to_all that carries it.
      CommDebugPause pause;
      comm_.all_to_all(unpacked, packed, receive_splits, send_splits);
    }
    int64_t sent = 0;
    for (int64_t peer = 0; peer < comm_.size(); ++peer)
      if (peer != comm_.rank()) sent += send_splits[peer];
    record_collective(counted_as_, sent, counts_);
    int64_t offset = 0;
    for (const auto& pieces : receives_)
      for (const at::Tensor& t : pieces) {
        const at::Tensor into = as_bytes(t);
        into.copy_(unpacked.narrow(0, offset, into.numel()));
        offset += into.numel();
      }
  }

 private:
  void keep(std::vector<at::Tensor>& list, const at::Tensor& t) {
    TORCH_INTERNAL_ASSERT(t.is_contiguous());
    device_ = t.device();
    list.push_back(t);
  }
  // The bytes of a contiguous tensor, flat, sharing its storage.
  static at::Tensor as_bytes(const at::Tensor& t) { return t.reshape({-1}).view(at::kByte); }

  Comm& comm_;
  at::Device device_;  // where the tensors live (a rank with none still takes part, with empty buffers there)
  std::vector<std::vector<at::Tensor>> sends_, receives_;
  const char* counted_as_;
  bool counts_;
};

}  // namespace

Comm::Comm() {
  static std::atomic<int64_t> made{0};
  number_ = ++made;
}

std::string Comm::group_name() const { return "the group of global ranks [" + join(global_ranks(), ", ") + "]"; }
Comm::~Comm() = default;

std::unique_ptr<Messages> Comm::start_messages(const char* counted_as, bool counts) { return start_all_to_all(counted_as, counts); }

std::unique_ptr<Messages> Comm::start_all_to_all(const char* counted_as, bool counts) {
  return std::make_unique<PackedMessages>(*this, counted_as, counts);
}

void Comm::reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  const int64_t n = size(), block = output.numel();
  TORCH_INTERNAL_ASSERT(input.is_contiguous() && output.is_contiguous() && input.numel() == n * block);
  at::Tensor blocks = at::empty({n, block}, input.options());
  {
    CommDebugPause pause;  // counted as the reduce_scatter it carries
    all_to_all(blocks.view({-1}), input.view({-1}), std::vector<int64_t>(n, block), std::vector<int64_t>(n, block));
  }
  record_collective("reduce_scatter", (n - 1) * block * static_cast<int64_t>(input.element_size()));
  at::Tensor out = output.view({1, block});
  switch (op) {
    case ReduceOp::Sum: at::sum_out(out, blocks, {0}, /*keepdim=*/true); break;
    case ReduceOp::Avg: at::sum_out(out, blocks, {0}, /*keepdim=*/true).div_(n); break;
    case ReduceOp::Max: at::amax_out(out, blocks, {0}, /*keepdim=*/true); break;
    case ReduceOp::Min: at::amin_out(out, blocks, {0}, /*keepdim=*/true); break;
    case ReduceOp::Product: at::prod_out(out, blocks, 0, /*keepdim=*/true); break;
    case ReduceOp::Norm: TORCH_INTERNAL_ASSERT(false, "a pending norm reaches the transports only as a sum of powers");
  }
}

}  // namespace shardtensor
