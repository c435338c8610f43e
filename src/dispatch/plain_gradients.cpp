#include "dispatch/plain_gradients.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <typeinfo>
#include <unordered_map>
#include <vector>

#include "shardtensor/dispatch.h"
#include "shardtensor/redistribute.h"
#include "shardtensor/shard_tensor.h"
#include "util/torch_compat.h"

namespace shardtensor {
namespace {

using torch::autograd::Node;
using compat::NodePtr;
using compat::WeakNodePtr;

// Runs before AccumulateGrad, on the sum autograd's input buffer made of every use's gradient.
// By default it hands on the full gradient (one reduction). Once a data-parallel wrapper takes
// the sum over to its own buckets (hand_on_gradient_terms), it hands on this rank's term of a
// sum over the `term_of_ranks` ranks of the activations' mesh instead, with no message.
struct FullGradientHook final : torch::autograd::FunctionPreHook {
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    torch::autograd::variable_list out = grads;
    for (at::Tensor& g : out) {
      if (!g.defined()) continue;
      if (term_of_ranks == 0) {
        if (is_shard_tensor(g)) g = full_tensor(g);
      } else {
        g = term_of_sum(g);
      }
    }
    return out;
  }

  at::Tensor term_of_sum(const at::Tensor& g) const {
    if (!is_shard_tensor(g)) return g / static_cast<double>(term_of_ranks);  // whole on every rank
    const ShardTensorSpec& s = spec(g);
    TORCH_CHECK(s.mesh().size() == term_of_ranks, "shardtensor: a plain parameter's gradient comes from ShardTensors on ",
                s.mesh().to_string(), " (", s.mesh().size(), " ranks), but its data-parallel wrapper sums gradient terms over ",
                term_of_ranks, " ranks of the activations' mesh; pass the mesh whose dims split the activations");
    bool all_sums = true;
    for (const Placement& p : s.placements()) all_sums = all_sums && p.is_partial() && p.reduce_op == ReduceOp::Sum;
    if (all_sums) return shardtensor::to_local(g, std::nullopt);  // already this rank's term
    return full_tensor(g) / static_cast<double>(term_of_ranks);
  }

  int64_t term_of_ranks = 0;  // 0: hand on the full gradient
};

// torch.compile's regions (AOTAutograd's CompiledFunction) run backward code generated for plain
// tensors: Inductor's kernels read data pointers, which a ShardTensor does not have. The
// gradients of such a region's outputs are handed on in full at its boundary instead (one
// reduction per output per backward), so the leaves behind it receive plain gradients.
const std::type_info* python_function_node = nullptr;  // learn_python_function_node

// The class is compared first: a Python node's name is a Python call.
bool takes_only_plain_gradients(const Node& node) {
  return python_function_node && typeid(node) == *python_function_node && node.name() == "CompiledFunctionBackward";
}

void hook_compiled_region(Node& node) {
  for (const auto& hook : node.pre_hooks())
    if (dynamic_cast<FullGradientHook*>(hook.get())) return;
  node.add_pre_hook(std::make_unique<FullGradientHook>());
}

FullGradientHook* hook_of(const at::Tensor& leaf) {
  for (const auto& hook : torch::autograd::impl::hooks(leaf))
    if (auto* ours = dynamic_cast<FullGradientHook*>(hook.get())) return ours;
  return nullptr;
}

FullGradientHook& hook_leaf(const at::Tensor& leaf) {
  if (FullGradientHook* existing = hook_of(leaf)) return *existing;
  auto hook = std::make_unique<FullGradientHook>();
  FullGradientHook& added = *hook;
  torch::autograd::impl::add_hook(leaf, std::move(hook));
  return added;
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
      if (!is_shard_tensor(accumulate->variable)) hook_leaf(accumulate->variable);  // a ShardTensor's gradient keeps its layout
      continue;
    }
    if (takes_only_plain_gradients(*node)) {
      hook_compiled_region(*node);
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

void hand_on_gradient_terms(const at::Tensor& leaf, int64_t ranks) {
  TORCH_CHECK(leaf.defined() && leaf.is_leaf() && leaf.requires_grad() && !is_shard_tensor(leaf),
              "hand_on_gradient_terms: expected a plain parameter (a leaf that requires grad)");
  TORCH_CHECK(ranks >= 1, "hand_on_gradient_terms: the sum is over at least one rank, got ", ranks);
  hook_leaf(leaf).term_of_ranks = ranks;
}

void learn_python_function_node(const at::Tensor& made_by_a_python_function) {
  const NodePtr& node = made_by_a_python_function.grad_fn();
  TORCH_CHECK(node, "learn_python_function_node: expected a tensor made by a Python autograd Function");
  python_function_node = &typeid(*node);
}

}  // namespace shardtensor
