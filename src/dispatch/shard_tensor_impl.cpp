// See shard_tensor_impl.h.
#include "dispatch/shard_tensor_impl.h"

#include "dispatch/library.h"

#include <algorithm>
#include <numeric>

namespace shardtensor {

ShardTensorImpl::ShardTensorImpl(at::Tensor local, ShardTensorSpec spec)
    : c10::TensorImpl(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), local.dtype(), local.device()),
      local_(std::move(local)),
      spec_(std::move(spec)) {
  TORCH_INTERNAL_ASSERT(!shard_tensor_impl(local_), "a ShardTensor cannot hold another ShardTensor");
  TORCH_INTERNAL_ASSERT_DEBUG_ONLY(local_.sizes().vec() == spec_.local_shape());
  set_storage_access_should_throw();
  refresh_sizes_and_strides();
}

// Global strides follow the local piece's memory order: a transposed local piece gives a
// transposed-looking wrapper, so code above the dispatcher that inspects strides (reshape
// choosing view or copy, contiguity checks) decides as it would on one device.
void ShardTensorImpl::refresh_sizes_and_strides() {
  if (local_.is_contiguous() || local_.dim() < 2) {
    set_sizes_and_strides(spec_.shape(), spec_.stride());
    return;
  }
  const int64_t ndim = local_.dim();
  std::vector<int64_t> order(ndim);
  std::iota(order.begin(), order.end(), 0);
  const auto local_strides = local_.strides();
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return local_strides[a] > local_strides[b]; });
  std::vector<int64_t> strides(ndim);
  int64_t running = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    strides[*it] = running;
    running *= std::max<int64_t>(spec_.shape()[*it], 1);
  }
  set_sizes_and_strides(spec_.shape(), strides);
}

void ShardTensorImpl::replace(at::Tensor local, ShardTensorSpec spec) {
  TORCH_INTERNAL_ASSERT(!shard_tensor_impl(local), "a ShardTensor cannot hold another ShardTensor");
  local_ = std::move(local);
  spec_ = std::move(spec);
  refresh_sizes_and_strides();
  refresh_numel();
}

template <typename VersionCounter>
c10::intrusive_ptr<c10::TensorImpl> ShardTensorImpl::detached_copy(VersionCounter&& version_counter,
                                                                   bool allow_tensor_metadata_change) const {
  auto impl = c10::make_intrusive<ShardTensorImpl>(local_, spec_);
  copy_tensor_metadata(this, impl.get(), std::forward<VersionCounter>(version_counter), allow_tensor_metadata_change);
  impl->refresh_numel();
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl> ShardTensorImpl::shallow_copy_and_detach(const c10::VariableVersion& version_counter,
                                                                             bool allow_tensor_metadata_change) const {
  return detached_copy(version_counter, allow_tensor_metadata_change);
}

c10::intrusive_ptr<c10::TensorImpl> ShardTensorImpl::shallow_copy_and_detach(c10::VariableVersion&& version_counter,
                                                                             bool allow_tensor_metadata_change) const {
  return detached_copy(std::move(version_counter), allow_tensor_metadata_change);
}

void ShardTensorImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) {
  auto* other = dynamic_cast<ShardTensorImpl*>(impl.get());
  TORCH_CHECK(other, "ShardTensor: set_data() needs another ShardTensor, got a plain ", impl->device().str(), " tensor.");
  copy_tensor_metadata(other, this, version_counter(), allow_tensor_metadata_change());
  refresh_numel();
  local_ = other->local_;
  spec_ = other->spec_;
}

ShardTensorImpl* shard_tensor_impl(const at::Tensor& t) {
  if (!t.defined() || !t.key_set().has(c10::DispatchKey::PrivateUse1)) return nullptr;
  return dynamic_cast<ShardTensorImpl*>(t.unsafeGetTensorImpl());
}

at::Tensor make_shard_tensor(at::Tensor local, ShardTensorSpec spec) {
  ensure_dispatch_registered();
  // The wrapper carries the autograd history; its local tensor never does.
  if (local.requires_grad()) local = local.detach();
  return at::detail::make_tensor<ShardTensorImpl>(std::move(local), std::move(spec));
}

}  // namespace shardtensor
