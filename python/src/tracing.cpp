// See tracing.h.
#include "tracing.h"

#include <ATen/core/grad_mode.h>

#include "autograd/grad_fn.h"
#include "dispatch/relayout.h"
#include "dispatch/shard_tensor_impl.h"
#include "shardtensor/redistribute.h"
#include "shardtensor/shard_tensor.h"
#include "util/strings.h"

namespace shardtensor {

at::Tensor shard_tensor_over(const at::Tensor& local, const ShardTensorSpec& spec, std::vector<int64_t> global_strides) {
  TORCH_CHECK(!is_shard_tensor(local), "shard_tensor_over: the local piece is itself a ShardTensor");
  TORCH_CHECK(local.sizes().vec() == spec.local_shape(), "shard_tensor_over: a piece of shape [", join(local.sizes().vec(), ", "),
              "] for ", spec, ", whose piece on this rank has shape [", join(spec.local_shape(), ", "), "]");
  TORCH_CHECK(local.scalar_type() == spec.dtype(), "shard_tensor_over: a piece of dtype ", local.scalar_type(), " for ", spec);
  return make_shard_tensor(local, spec, std::move(global_strides));
}

at::Tensor local_piece_of(const at::Tensor& t) {
  const ShardTensorImpl* impl = shard_tensor_impl(t);
  TORCH_CHECK(impl, "local_piece_of: not a ShardTensor");
  return impl->local();
}

at::Tensor guard_piece(const at::Tensor& t, const ShardTensorSpec& spec, c10::IntArrayRef global_strides) {
  ShardTensorImpl* impl = shard_tensor_impl(t);
  if (!impl || impl->spec() != spec || t.strides() != global_strides) return {};
  return impl->guard_alias(t.requires_grad());
}

at::Tensor piece_into_graph(const at::Tensor& t, const std::shared_ptr<GradientLayoutSlot>& slot) {
  const ShardTensorImpl* impl = shard_tensor_impl(t);
  TORCH_CHECK(impl, "piece_into_graph: not a ShardTensor");
  if (!t.requires_grad() || !at::GradMode::is_enabled()) return impl->local();
  return attach_grad_fn(impl->local().variable_data(), t,
                        [slot, unset = gradient_layout(impl->spec())](const at::Tensor& grad) {
                          return make_shard_tensor(grad, slot->layout.value_or(unset));
                        },
                        "PieceIntoGraphBackward");
}

at::Tensor shard_tensor_out_of_graph(const at::Tensor& piece, const ShardTensorSpec& spec, std::vector<int64_t> global_strides) {
  ShardTensorSpec grad_layout = gradient_layout(spec);
  return attach_grad_fn(shard_tensor_over(piece, spec, std::move(global_strides)), piece,
                        [grad_layout](const at::Tensor& grad) {
                          const ShardTensorImpl* impl = shard_tensor_impl(grad);
                          return impl && impl->spec() == grad_layout ? impl->local() : local_piece_of(move_to(grad, grad_layout));
                        },
                        "OutOfGraphBackward");
}

}  // namespace shardtensor
