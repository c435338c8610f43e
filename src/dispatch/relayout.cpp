// See relayout.h.
#include "dispatch/relayout.h"

#include <c10/util/intrusive_ptr.h>

#include "autograd/grad_fn.h"
#include "dispatch/propagation.h"
#include "dispatch/shard_tensor_impl.h"
#include "redistribute/executor.h"
#include "redistribute/plan.h"
#include "rules/helpers.h"

namespace shardtensor {

ShardTensorSpec gradient_layout(const ShardTensorSpec& spec) { return without_partial(spec); }

at::Tensor move_to(const at::Tensor& t, const ShardTensorSpec& target, const TransportOptions& options) {
  const ShardTensorSpec& source = shard_tensor_impl(t)->spec();
  // Resolved at each call (not kept in the backward): unset fields follow this process's
  // defaults as they are when each move runs.
  const ResolvedTransportOptions resolved = resolve(options);
  drop_plans_after_broken_groups();
  const std::shared_ptr<const RedistributePlan> plan = plan_redistribute(source, target, default_planner(), resolved);
  at::Tensor local = execute_redistribute(shard_tensor_impl(t)->local(), source, *plan, resolved);
  at::Tensor out = make_shard_tensor(std::move(local), target);
  // A move to the layout it came from is a copy, and so is its backward: the gradient keeps the
  // layout it arrives in (a Partial stays pending, no collective). A copy, not the incoming
  // tensor itself: autograd can then take it as a leaf's .grad instead of copying it into a
  // fresh tensor of the default layout (which would reduce a Partial).
  if (target == source) return attach_grad_fn(out, t, [](const at::Tensor& grad) { return grad.clone(); }, "RedistributeBackward");
  const ShardTensorSpec grad_target = gradient_layout(source);
  return attach_grad_fn(out, t, [grad_target, options](const at::Tensor& grad) { return move_to(grad, grad_target, options); },
                        "RedistributeBackward");
}

namespace {

// Where `leaf` is sharded, its layout; elsewhere Replicate, or the gradient's Partial.
ShardTensorSpec leaf_gradient_target(const ShardTensorSpec& leaf, const ShardTensorSpec& grad) {
  Placements ps = leaf.placements();
  for (size_t m = 0; m < ps.size(); ++m)
    if (!ps[m].is_shard() && grad.placements()[m].is_partial()) ps[m] = grad.placements()[m];
  return with_placements(leaf, ps);
}

}  // namespace

void keep_leaf_gradient_layout(const at::Tensor& leaf) {
  ShardTensorImpl* impl = shard_tensor_impl(leaf);
  if (!impl || !impl->claim_gradient_hook()) return;
  // Weak: the hook lives in the leaf's autograd metadata and must not keep the leaf alive.
  c10::weak_intrusive_ptr<c10::TensorImpl> weak_leaf(leaf.getIntrusivePtr());
  leaf.register_hook([weak_leaf](const at::Tensor& grad) -> at::Tensor {
    const c10::intrusive_ptr<c10::TensorImpl> alive = weak_leaf.lock();
    const ShardTensorImpl* home = alive ? static_cast<const ShardTensorImpl*>(alive.get()) : nullptr;
    const ShardTensorImpl* incoming = shard_tensor_impl(grad);
    if (!home || !incoming || home->spec().has_partial() || home->spec().mesh() != incoming->spec().mesh()) return grad;
    const ShardTensorSpec target = leaf_gradient_target(home->spec(), incoming->spec());
    return target == incoming->spec() ? grad : move_to(grad, target);
  });
}

}  // namespace shardtensor
