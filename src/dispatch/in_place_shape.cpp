// See in_place_shape.h.
//
// Why not through the generic kernel: it runs an operator on the local pieces and wraps what
// comes back, but an in-place shape change must also change the wrapper itself (its sizes,
// strides and spec), which the local operator cannot see. The out-of-place form has the rule.
#include "dispatch/in_place_shape.h"

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "dispatch/shard_tensor_impl.h"

namespace shardtensor {
namespace {

at::Tensor& take_result(at::Tensor& self, const at::Tensor& result) {
  shard_tensor_impl(self)->take_layout_of(*shard_tensor_impl(result));
  return self;
}

// The out-of-place call goes straight to our kernel: autograd has recorded the in-place op.
at::Tensor& t_in_place(at::Tensor& self) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return take_result(self, self.t());
}

at::Tensor& transpose_in_place(at::Tensor& self, int64_t dim0, int64_t dim1) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return take_result(self, self.transpose(dim0, dim1));
}

at::Tensor& unsqueeze_in_place(at::Tensor& self, int64_t dim) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return take_result(self, self.unsqueeze(dim));
}

at::Tensor& squeeze_in_place(at::Tensor& self) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return take_result(self, self.squeeze());
}

at::Tensor& squeeze_dim_in_place(at::Tensor& self, int64_t dim) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return take_result(self, self.squeeze(dim));
}

// squeeze_.dims (torch 2.0 on) as one squeeze per dim, the last first so that earlier dims keep
// their index; compiled on every line, where at::squeeze(self, dims) is not.
at::Tensor& squeeze_dims_in_place(at::Tensor& self, c10::IntArrayRef dims) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  std::vector<int64_t> wrapped;
  for (int64_t d : dims) wrapped.push_back(c10::maybe_wrap_dim(d, self.dim()));
  std::sort(wrapped.rbegin(), wrapped.rend());
  TORCH_CHECK(std::adjacent_find(wrapped.begin(), wrapped.end()) == wrapped.end(), "squeeze_: dims [",
              c10::Join(", ", dims), "] name a dim more than once; each dim may appear once.");
  at::Tensor result = self;
  for (int64_t d : wrapped) result = result.squeeze(d);
  return take_result(self, result);
}

}  // namespace

void register_in_place_shape_ops(torch::Library& whole) {
  whole.impl("t_", TORCH_FN(t_in_place));
  whole.impl("transpose_", TORCH_FN(transpose_in_place));
  whole.impl("unsqueeze_", TORCH_FN(unsqueeze_in_place));
  whole.impl("squeeze_", TORCH_FN(squeeze_in_place));
  whole.impl("squeeze_.dim", TORCH_FN(squeeze_dim_in_place));
  if (c10::Dispatcher::singleton().findSchema({"aten::squeeze_", "dims"}))  // torch 2.0 on
    whole.impl("squeeze_.dims", TORCH_FN(squeeze_dims_in_place));
}

}  // namespace shardtensor
