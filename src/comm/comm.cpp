// Comm's default message batch, for backends without point-to-point messages here: it holds
// the messages until wait(), then runs them as one all_to_all with split sizes.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "comm/comm.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>

namespace shardtensor {
namespace {

class PackedMessages final : public Messages {
 public:
  explicit PackedMessages(Comm& comm) : comm_(comm), sends_(comm.size()), receives_(comm.size()) {}

  void receive(int64_t peer, const at::Tensor& into) override { receives_[peer].push_back(into); }
  void send(int64_t peer, const at::Tensor& from) override { sends_[peer].push_back(from); }

  void wait() override {
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
    comm_.all_to_all(unpacked, packed, receive_splits, send_splits);
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
};

}  // namespace

std::unique_ptr<Messages> Comm::start_messages() { return std::make_unique<PackedMessages>(*this); }

}  // namespace shardtensor
