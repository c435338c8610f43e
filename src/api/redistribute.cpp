// redistribute, full_tensor, differentiable to_local and distribute_tensor: argument checks
// (on every rank, before any collective), the plan, the executor and the backward functions.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "shardtensor/redistribute.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>

#include "api/conversions.h"
#include "autograd/grad_fn.h"
#include "comm/agreement.h"
#include "comm/comm.h"
#include "dispatch/shard_tensor_impl.h"
#include "redistribute/executor.h"
#include "redistribute/plan.h"
#include "rules/helpers.h"
#include "shardtensor/shard_tensor.h"
#include "spec/placement_checks.h"
#include "spec/sequence_order.h"
#include "util/hash.h"
#include "util/strings.h"

namespace shardtensor {

namespace {

// `requested` over `spec`'s mesh and shape (see relayout); Partial allowed for gradients.
ShardTensorSpec relaid(const ShardTensorSpec& spec, const Placements& requested) {
  return relayout(spec, normalize_placements("grad_placements", spec.mesh(), requested, spec.ndim()), {});
}

ShardTensorSpec checked_target(const at::Tensor& t, const DeviceMesh* mesh, const Placements& placements,
                               const ShardSizes* sizes) {
  const ShardTensorSpec& source = spec(t);
  if (mesh) {
    TORCH_CHECK_NOT_IMPLEMENTED(*mesh == source.mesh(), "redistribute: the tensor lives on ", source.mesh(), " and the target mesh is ",
                *mesh, "; redistributing to another mesh is not supported yet. Use to_local() and from_local() on the new mesh.");
  }
  return redistribute_target(source, placements, sizes);
}

// scatter_boxes to `target`; a zigzag piece is two stretches, not a box, so it is scattered in
// order and then exchanged into zigzag order.
at::Tensor scattered(const at::Tensor& global, const std::vector<int64_t>& root, const ShardTensorSpec& target) {
  if (!has_zigzag(target)) return scatter_boxes(global, root, target);
  const ShardTensorSpec ordered = in_order(target);
  return execute_redistribute(scatter_boxes(global, root, ordered), ordered, *plan_redistribute(ordered, target));
}

}  // namespace

at::Tensor redistribute(const at::Tensor& t, const Placements& placements) {
  return move_to(t, checked_target(t, nullptr, placements, nullptr));
}

at::Tensor redistribute(const at::Tensor& t, const Placements& placements, const ShardSizes& sizes) {
  return move_to(t, checked_target(t, nullptr, placements, &sizes));
}

at::Tensor redistribute(const at::Tensor& t, const DeviceMesh& mesh, const Placements& placements,
                        const std::optional<ShardSizes>& sizes, const TransportOptions& options) {
  return move_to(t, checked_target(t, &mesh, placements, sizes ? &*sizes : nullptr), options);
}

at::Tensor redistribute(const at::Tensor& t, const Placements& placements, const TransportOptions& options,
                        const std::optional<ShardSizes>& sizes) {
  return move_to(t, checked_target(t, nullptr, placements, sizes ? &*sizes : nullptr), options);
}

at::Tensor to_local(const at::Tensor& t, const std::optional<Placements>& grad_placements) {
  const ShardTensorSpec& s = spec(t);
  const at::Tensor& stored = shard_tensor_impl(t)->local();
  if (!t.requires_grad() || !at::GradMode::is_enabled()) return stored;
  const ShardTensorSpec grad_spec = grad_placements ? relaid(s, *grad_placements) : s;
  TORCH_CHECK_VALUE(grad_spec.local_shape() == s.local_shape(), "to_local: grad_placements ", to_string(*grad_placements),
              " give this rank a gradient of shape [", join(grad_spec.local_shape(), ", "), "] but its local tensor has shape [",
              join(s.local_shape(), ", "), "].");
  return attach_grad_fn(stored.variable_data(), t,
                        [grad_spec](const at::Tensor& grad) { return new_shard_tensor(grad, grad_spec); }, "ToLocalBackward");
}

at::Tensor full_tensor(const at::Tensor& t, const std::optional<Placements>& grad_placements) {
  const ShardTensorSpec& s = spec(t);
  at::Tensor replicated = redistribute(t, Placements(s.placements().size(), Replicate()));
  return to_local(replicated, grad_placements ? grad_placements : Placements(s.placements().size(), Replicate()));
}

at::Tensor distribute_tensor(const at::Tensor& global, const DeviceMesh& mesh, const Placements& placements,
                             const std::optional<ShardSizes>& sizes, std::optional<int64_t> src_data_rank) {
  // Every rank reads its own tensor and arguments; one small all-gather makes sure they agree
  // (shape, dtype, placements, sizes, requires_grad) before the root's bytes are scattered
  // into pieces each rank sized alone. A disagreement raises on every rank. With
  // src_data_rank=None no byte moves, so nothing is gathered either (as DTensor): each rank
  // raises its own argument errors, and a layout the ranks disagree on is caught by the
  // fingerprint of the first exchange that uses it.
  std::optional<ShardTensorSpec> target;
  const std::exception_ptr failure = failure_of([&] {
    TORCH_CHECK_VALUE(global.defined() && !is_shard_tensor(global), "distribute_tensor: expects a plain tensor that every rank holds, got ",
                global.defined() ? "a ShardTensor; use redistribute" : "an undefined tensor", ".");
    // RuntimeError, as DTensor raises.
    TORCH_CHECK(global.is_leaf(), "distribute_tensor: expects a leaf tensor, as DTensor's does, got a non-leaf (one ",
                "computed from a tensor that requires grad). Distribute the leaf it was computed from, or pass .detach() ",
                "(the result is then a leaf of its own).");
    if (!global.is_meta()) check_on_mesh_device("distribute_tensor", global, mesh);
    target.emplace(mesh, normalize_placements("distribute_tensor", mesh, placements, global.dim()), global.sizes().vec(),
                   global.scalar_type(), sizes ? *sizes : ShardSizes{});
    if (src_data_rank)
      for (int64_t m = 0; m < mesh.ndim(); ++m)
        TORCH_CHECK_VALUE(*src_data_rank >= 0 && *src_data_rank < mesh.size(m), "distribute_tensor: src_data_rank=", *src_data_rank,
                    " is not a rank of mesh dim ", m, " (size ", mesh.size(m), "); it names the source's rank within each mesh dim's ",
                    "group, as DTensor's does: 0 to ", mesh.size(m) - 1, ", or None for each rank's own tensor.");
  });
  const bool inside = mesh.includes_this_rank();  // outside: no piece, no part in the check
  const std::string source_name = (src_data_rank ? "src_data_rank=" + std::to_string(*src_data_rank) : "src_data_rank=None") +
                                  (global.is_meta() ? ", on the meta device" : "");
  enum Column : size_t { kFailed, kLayout, kRequiresGrad, kColumns };
  std::vector<int64_t> row(kColumns, 0);
  row[kFailed] = failure_code(failure);
  if (!failure) {
    row[kLayout] = static_cast<int64_t>(stable_hash(target->to_string() + source_name) >> 1);
    row[kRequiresGrad] = global.requires_grad();
  }
  if (agreement_checks_enabled() && inside && src_data_rank) {
    const AgreementRows rows = gather_rows(mesh, row);
    raise_where_any_rank_failed(mesh, rows, kFailed, failure);
    check_rows_agree(mesh, rows, kLayout, "distribute_tensor: the ranks passed different tensors or layouts",
                     [&] { return target->to_string() + ", " + source_name; },
                     "Every rank must pass a tensor of the same shape and dtype, with the same placements, sizes and src_data_rank.");
    check_rows_agree(mesh, rows, kRequiresGrad, "distribute_tensor: the ranks passed tensors that differ in requires_grad",
                     [&] { return std::string(global.requires_grad() ? "requires_grad=True" : "requires_grad=False"); },
                     "Every rank must pass the same; the gradient is computed by all of them together.");
  } else if (failure) {
    std::rethrow_exception(failure);
  }
  // The source of truth is the rank at coordinate src_data_rank of each mesh dim (DTensor's
  // group rank on each dim): every rank gets its box of the tensor that rank holds, and only
  // its box. With none, each rank cuts its box out of its own tensor and nothing moves.
  const std::vector<int64_t> root(mesh.ndim(), src_data_rank.value_or(0));
  // A meta tensor (deferred initialisation) has no values: each rank makes its piece's shape on
  // meta, and to_empty / empty_like(device=...) later allocates only that piece.
  at::Tensor local = !inside ? piece_outside_mesh(*target, global.options())
                     : global.is_meta() ? at::empty(target->local_shape(), global.options())
                     : src_data_rank ? scattered(global.detach(), root, *target)
                                     : local_box_of(global.detach(), *target).clone(at::MemoryFormat::Contiguous);
  // Partial: the value on the source's coordinate, the reduction's identity on the others (avg,
  // max and min keep the value everywhere, which reduces to it too).
  for (int64_t m = 0; inside && m < mesh.ndim(); ++m) {
    const Placement& p = target->placements()[m];
    if (!p.is_partial() || mesh.coordinate()[m] == root[m]) continue;
    if (p.reduce_op == ReduceOp::Sum || p.reduce_op == ReduceOp::Norm) local.zero_();
    if (p.reduce_op == ReduceOp::Product) local.fill_(1);
  }
  at::Tensor out = new_shard_tensor(local, *target);
  if (global.requires_grad()) out.set_requires_grad(true);  // a leaf, as DTensor's distribute_tensor
  return out;
}

}  // namespace shardtensor
