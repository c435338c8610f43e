// SelfComm: the one-rank group. A mesh dim of size 1 (shapes such as 1x4 or 4x1) needs no
// process group, so it gets this instead of a Gloo group that would talk to itself.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>

#include "comm/comm.h"

namespace shardtensor {
namespace {

class SelfComm final : public Comm {
 public:
  explicit SelfComm(int64_t global_rank) : ranks_{global_rank} {}
  int64_t rank() const override { return 0; }
  int64_t size() const override { return 1; }
  const std::vector<int64_t>& global_ranks() const override { return ranks_; }
  std::string backend_name() const override { return "self"; }
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(0); }  // never waits
  void all_gather(const at::Tensor& input, const at::Tensor& output) override { output.select(0, 0).copy_(input); }
  void all_reduce(const at::Tensor&, ReduceOp) override {}
  void broadcast(const at::Tensor&, int64_t) override {}
  void barrier() override {}
  void all_to_all(const at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>&,
                  const std::vector<int64_t>&) override {
    output.copy_(input);
  }

 private:
  std::vector<int64_t> ranks_;
};

}  // namespace

std::shared_ptr<Comm> make_self_comm(int64_t global_rank) { return std::make_shared<SelfComm>(global_rank); }

}  // namespace shardtensor
