// See grad_fn.h.
#include "autograd/grad_fn.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "util/torch_compat.h"

namespace shardtensor {
namespace {

class ConversionBackward final : public torch::autograd::Node {
 public:
  ConversionBackward(BackwardFn backward, const char* name) : backward_(std::move(backward)), name_(name) {}

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    return {backward_(grads[0])};
  }
  std::string name() const override { return name_; }

 private:
  BackwardFn backward_;
  const char* name_;
};

}  // namespace

at::Tensor attach_grad_fn(at::Tensor output, const at::Tensor& input, BackwardFn backward, const char* name) {
  if (!at::GradMode::is_enabled() || !input.requires_grad()) return output;
  auto node = compat::make_autograd_node<ConversionBackward>(std::move(backward), name);
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  torch::autograd::set_history(output, node);
  return output;
}

}  // namespace shardtensor
