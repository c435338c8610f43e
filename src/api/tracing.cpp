// See shardtensor/tracing.h.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "shardtensor/tracing.h"

#include "dispatch/shard_tensor_impl.h"
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

}  // namespace shardtensor
