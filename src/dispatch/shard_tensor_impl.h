// ShardTensorImpl: the TensorImpl behind every ShardTensor.
//
// It reports the GLOBAL sizes and strides, the LOCAL tensor's device and dtype, and carries the
// PrivateUse1 dispatch key (the TensorImpl constructor adds AutogradPrivateUse1 and
// ADInplaceOrView), so every ATen operator on it reaches our kernel. It has no storage: any
// attempt to read its data raises instead of reading garbage.
// Invariant: local_.sizes() == spec_.local_shape() and local_ is never a ShardTensor.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include <optional>
#include <utility>

#include "shardtensor/spec.h"

namespace shardtensor {

// What a ShardTensor kernel excludes while it computes on local pieces: autograd (autograd
// records the call on the wrappers, not on their pieces) and autocast (a kernel below autocast
// never casts: autocast acted on the ShardTensor call already, or the op is not on its lists).
constexpr c10::DispatchKeySet kExcludedOnPieces = c10::autograd_dispatch_keyset | c10::autocast_dispatch_keyset;

class ShardTensorImpl final : public c10::TensorImpl {
 public:
  // `global_strides`: as set_global_strides; empty for the contiguous ones.
  ShardTensorImpl(at::Tensor local, ShardTensorSpec spec, std::vector<int64_t> global_strides = {});

  const at::Tensor& local() const { return local_; }
  const ShardTensorSpec& spec() const { return spec_; }

  // Gives the wrapper a new local piece and spec (an out= result, a Partial self resolved by an
  // in-place op). Other wrappers viewing the old local piece keep it.
  void replace(at::Tensor local, ShardTensorSpec spec);

  // Takes another wrapper's piece, spec and global strides: an operator that changes its
  // input's shape in place (t_, unsqueeze_) becomes its out-of-place form taken back into
  // self. The piece is a view of the old one, as plain torch's would be.
  void take_layout_of(const ShardTensorImpl& other);

  // The Replicate form of this Partial wrapper that its last resolution computed, reused while
  // the local piece is unchanged (same tensor, same version): an optimizer reads a Partial
  // gradient 2-3 times, and each read would otherwise all-reduce again. The wrapper keeps its
  // Partial placements either way: an op never changes its caller's inputs.
  const at::Tensor* cached_resolution(const ShardTensorSpec& target) const;
  void cache_resolution(const ShardTensorSpec& target, at::Tensor resolved);

  // True the first time only: whether the caller is the one to hook this leaf's gradient
  // (keep_leaf_gradient_layout in dispatch/relayout.h).
  bool claim_gradient_hook() { return !std::exchange(gradient_hooked_, true); }

  // The plain tensor that torch.compile's guards compare this ShardTensor by (python/src/tracing.h:
  // guard_piece): the piece, detached, requiring grad as asked. The same object while the piece
  // stays, for the guards compare tensors by identity (two arguments must not alias).
  const at::Tensor& guard_alias(bool requires_grad);

  // Global strides other than the contiguous ones, for views that permute dims (see the kernel);
  // a permutation of the contiguous strides of the global shape. Kept while the shape is.
  void set_global_strides(std::vector<int64_t> strides);

  // Detach and set_data copy the wrapper's fields too, or detach() would lose the local tensor.
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(const c10::VariableVersion& version_counter,
                                                              bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(c10::VariableVersion&& version_counter,
                                                              bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;

 private:
  template <typename VersionCounter>
  c10::intrusive_ptr<c10::TensorImpl> detached_copy(VersionCounter&& version_counter, bool allow_tensor_metadata_change) const;

  void refresh_sizes_and_strides();

  at::Tensor local_;
  ShardTensorSpec spec_;
  std::vector<int64_t> permuted_strides_;  // empty: contiguous
  struct Resolution {
    ShardTensorSpec target;
    at::Tensor resolved;
    int64_t version;  // the wrapper's, when resolved (replace and set_data drop the cache)
  };
  std::optional<Resolution> resolution_;
  bool resolution_may_be_cached() const;
  bool gradient_hooked_ = false;
  at::Tensor guard_alias_;  // dropped with the piece it aliases (replace, set_data)
};

// The wrapper's impl, or nullptr for any other tensor (including undefined ones).
ShardTensorImpl* shard_tensor_impl(const at::Tensor& t);

// Wraps without checks; callers (from_local, the kernel) have validated local against spec.
at::Tensor make_shard_tensor(at::Tensor local, ShardTensorSpec spec, std::vector<int64_t> global_strides = {});

}  // namespace shardtensor
