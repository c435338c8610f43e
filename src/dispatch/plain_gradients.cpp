#include "dispatch/plain_gradients.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <unordered_map>
#include <vector>

#include "shardtensor/redistribute.h"
#include "shardtensor/shard_tensor.h"
#include "util/torch_compat.h"

namespace shardtensor {
namespace {

using torch::autograd::Node;
using compat::NodePtr;
using compat::WeakNodePtr;

// Runs before AccumulateGrad, on the sum autograd's input buffer made of every use's gradient.
struct FullGradientHook final : torch::autograd::FunctionPreHook {
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    torch::autograd::variable_list out = grads;
    for (at::Tensor& g : out)
      if (g.defined() && is_shard_tensor(g)) g = full_tensor(g);
    return out;
  }
};

void hook_leaf(const at::Tensor& leaf) {
  if (is_shard_tensor(leaf)) return;  // a ShardTensor parameter's gradient keeps its layout
  for (const auto& hook : torch::autograd::impl::hooks(leaf))
    if (dynamic_cast<const FullGradientHook*>(hook.get())) return;
  torch::autograd::impl::add_hook(leaf, std::make_unique<FullGradientHook>());
}

// Graph nodes already walked on this thread. A plain non-leaf is usually a step or two from its
// leaves (w.t(), w.to(dtype)), but one derived from earlier sharded work reaches back through
// the whole graph, and an operator must not pay for that walk again on every use. The weak
// pointer tells a live entry from one whose address a newer node reuses.
thread_local std::unordered_map<const Node*, WeakNodePtr> walked;

bool first_visit(const NodePtr& node) {
  auto [it, inserted] = walked.try_emplace(node.get(), WeakNodePtr(node));
  if (inserted) return true;
  if (!it->second.expired()) return false;
  it->second = WeakNodePtr(node);
  return true;
}

void forget_dead_nodes() {
  if (walked.size() < (size_t{1} << 14)) return;
  for (auto it = walked.begin(); it != walked.end();) it = it->second.expired() ? walked.erase(it) : std::next(it);
}

void hook_leaves_behind(const NodePtr& root) {
  forget_dead_nodes();
  std::vector<NodePtr> stack{root};
  while (!stack.empty()) {
    NodePtr node = std::move(stack.back());
    stack.pop_back();
    if (!node || !first_visit(node)) continue;
    if (auto* accumulate = dynamic_cast<torch::autograd::AccumulateGrad*>(node.get())) {
      hook_leaf(accumulate->variable);
      continue;
    }
    for (const torch::autograd::Edge& edge : node->next_edges()) stack.push_back(edge.function);
  }
}

}  // namespace

void keep_gradient_plain(const at::Tensor& plain) {
  if (!plain.defined() || is_shard_tensor(plain) || !plain.requires_grad() || !at::GradMode::is_enabled()) return;
  if (const NodePtr& grad_fn = plain.grad_fn())
    hook_leaves_behind(grad_fn);
  else
    hook_leaf(plain);
}

}  // namespace shardtensor
