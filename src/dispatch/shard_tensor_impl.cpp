// See shard_tensor_impl.h.
#include "dispatch/shard_tensor_impl.h"

#include <c10/core/DispatchKeySet.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/TensorOptions.h>

#include <optional>
#include <typeinfo>


namespace shardtensor {

ShardTensorImpl::ShardTensorImpl(at::Tensor local, ShardTensorSpec spec, std::vector<int64_t> global_strides)
    : c10::TensorImpl(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), local.dtype(), local.device()),
      local_(std::move(local)),
      spec_(std::move(spec)),
      permuted_strides_(std::move(global_strides)) {
  TORCH_INTERNAL_ASSERT(!shard_tensor_impl(local_), "a ShardTensor cannot hold another ShardTensor");
  // torch.autocast("cpu") / ("cuda") must cast ShardTensor arguments as it casts plain ones. A
  // tensor's autocast key comes from its backend, which for a ShardTensor is PrivateUse1 (whose
  // autocast no device_type enables): take the piece's instead. Inference tensors have none.
  if (!is_inference())
    key_set_ = key_set_ | c10::getAutocastRelatedKeySetFromBackend(
                              c10::toBackendComponent(c10::computeDispatchKey(c10::nullopt, c10::nullopt, local_.device())));
  TORCH_INTERNAL_ASSERT(permuted_strides_.empty() || permuted_strides_.size() == spec_.shape().size());
  TORCH_INTERNAL_ASSERT_DEBUG_ONLY(local_.sizes().vec() == spec_.local_shape());
  set_storage_access_should_throw();
  refresh_sizes_and_strides();
}

// Global strides are the contiguous strides of the global shape, permuted for views that
// permute dims, whatever the local piece's memory layout. They must be the same on every rank:
// libtorch's autograd picks formulas by strides (mm's backward transposes one way or the other,
// AccumulateGrad clones or steals), and ranks that pick differently issue different
// collectives and hang. The local piece may still be laid out otherwise; the view rules
// reshape it locally.
void ShardTensorImpl::refresh_sizes_and_strides() {
  set_sizes_and_strides(spec_.shape(), permuted_strides_.empty() ? spec_.stride() : permuted_strides_);
}

void ShardTensorImpl::set_global_strides(std::vector<int64_t> strides) {
  TORCH_INTERNAL_ASSERT(strides.size() == spec_.shape().size());
  permuted_strides_ = std::move(strides);
  refresh_sizes_and_strides();
}

// The cached form is trusted only while nothing can have written the local piece: the wrapper's
// version is unchanged (autograd bumps it on every in-place op through the wrapper, including
// ours, which write the piece with the version bump of the local tensor turned off), and no
// other tensor shares the piece's storage (a view or a to_local() result could write it
// unseen). A gradient that an optimizer reads is that case; anything shared resolves afresh.
bool ShardTensorImpl::resolution_may_be_cached() const {
  return version_counter().enabled() && local_.has_storage() && local_.storage().use_count() == 1;
}

const at::Tensor* ShardTensorImpl::cached_resolution(const ShardTensorSpec& target) const {
  if (!resolution_ || !resolution_may_be_cached()) return nullptr;
  const Resolution& r = *resolution_;
  return r.version == version_counter().current_version() && r.target == target ? &r.resolved : nullptr;
}

void ShardTensorImpl::cache_resolution(const ShardTensorSpec& target, at::Tensor resolved) {
  resolution_.reset();
  if (!resolution_may_be_cached() || resolved.is_alias_of(local_)) return;
  resolution_ = Resolution{target, std::move(resolved), version_counter().current_version()};
}

void ShardTensorImpl::replace(at::Tensor local, ShardTensorSpec spec) {
  TORCH_INTERNAL_ASSERT(!shard_tensor_impl(local), "a ShardTensor cannot hold another ShardTensor");
  if (spec.shape() != spec_.shape()) permuted_strides_.clear();
  local_ = std::move(local);
  spec_ = std::move(spec);
  resolution_.reset();
  guard_alias_.reset();
  refresh_sizes_and_strides();
  refresh_numel();
}

void ShardTensorImpl::take_layout_of(const ShardTensorImpl& other) {
  replace(other.local_, other.spec_);
  permuted_strides_ = other.permuted_strides_;
  refresh_sizes_and_strides();
}

template <typename VersionCounter>
c10::intrusive_ptr<c10::TensorImpl> ShardTensorImpl::detached_copy(VersionCounter&& version_counter,
                                                                   bool allow_tensor_metadata_change) const {
  auto impl = c10::make_intrusive<ShardTensorImpl>(local_, spec_);
  impl->permuted_strides_ = permuted_strides_;
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
  permuted_strides_ = other->permuted_strides_;
  resolution_.reset();
  guard_alias_.reset();
}

const at::Tensor& ShardTensorImpl::guard_alias(bool requires_grad) {
  if (!guard_alias_.defined() || guard_alias_.requires_grad() != requires_grad) {
    guard_alias_ = local_.detach();
    guard_alias_.set_requires_grad(requires_grad);
  }
  return guard_alias_;
}

ShardTensorImpl* shard_tensor_impl(const at::Tensor& t) {
  if (!t.defined() || !t.key_set().has(c10::DispatchKey::PrivateUse1)) return nullptr;
  // Called on every argument and output of every op: ShardTensorImpl is final, so comparing the
  // dynamic type is exact, and cheaper than dynamic_cast's walk of the class hierarchy.
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return typeid(*impl) == typeid(ShardTensorImpl) ? static_cast<ShardTensorImpl*>(impl) : nullptr;
}

at::Tensor make_shard_tensor(at::Tensor local, ShardTensorSpec spec, std::vector<int64_t> global_strides) {
  // The wrapper carries the autograd history; its local tensor never does.
  if (local.requires_grad()) local = local.detach();
  // Inside torch.inference_mode() a new TensorImpl is an inference tensor (no autograd keys, no
  // version counter), but a view of a normal tensor is not: plain torch builds views with their
  // base's keys, and its view handling (ADInplaceOrView) then shares the base's version counter,
  // which an inference tensor refuses ("Cannot set version_counter for inference tensor"). A
  // wrapper is what its piece is: where the piece is a normal tensor (a view of the input's
  // piece, or that piece itself), the wrapper is built as a normal tensor too.
  std::optional<c10::InferenceMode> normal_tensor_construction;
  if (c10::InferenceMode::is_enabled() && !local.is_inference()) normal_tensor_construction.emplace(false);
  return at::detail::make_tensor<ShardTensorImpl>(std::move(local), std::move(spec), std::move(global_strides));
}

}  // namespace shardtensor
