// Our own decompositions: of CompositeImplicitAutograd operators whose libtorch decomposition
// cannot run on ShardTensors (it writes into views of a fresh tensor), and of operators whose
// every sharding follows from a composition of ruled ones (dist). They are built from
// differentiable operators that have sharding rules, and library.cpp registers them on
// AutogradPrivateUse1, so autograd records their pieces as usual.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>
#include <vector>

namespace torch {
class Library;
}

namespace shardtensor {

// _pad_circular(self, pad) on a ShardTensor. Split padded dims exchange a periodic halo
// (each rank gathers its output window, wrapping around the field's ends: only the pad rows
// move), differentiable; a layout it cannot handle (Partial, a dim split by two mesh dims)
// runs as a cat of the far slices, which gathers the padded dim.
at::Tensor circular_pad(const at::Tensor& self, c10::IntArrayRef pad);

// dist(self, other, p) as norm(self - other, p): the difference broadcasts and keeps its
// layout, and the norm is a pending norm of the local norms (no collective). Also on
// PrivateUse1, where autograd is off (inference mode), so it never gathers.
at::Tensor dist_as_norm(const at::Tensor& self, const at::Tensor& other, const at::Scalar& p);

// linear(input, weight, bias) on a ShardTensor input of 3 or more dims whose one split leading
// dim is not the first ([B, S, E] split on the sequence, as context parallelism lays it out).
// libtorch's decomposition flattens the leading dims with a view, and a flattening cannot keep
// an inner dim's split, so every linear layer would gather the sequence. linear treats rows
// alike, so moving the split dim to the front first keeps the split through the flattening
// (a local copy, no message); the result moves back. A 2-D call that autograd does not record
// runs as one operator (direct_kernel.h); other inputs take libtorch's own decomposition.
at::Tensor linear_on_shards(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias);

// _batch_norm_impl_index (what batch_norm calls) as native_batch_norm, the operator the
// normalization rule reads. libtorch picks cuDNN's (or MIOpen's) batch norm for CUDA inputs,
// and a rule for cudnn_batch_norm would need its reserve space kept per shard; the native
// operator computes the same statistics and output on any device. Its fourth result, which only
// cuDNN's backward reads, is empty, and the index 0 says "native", as libtorch's own CPU path.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t> batch_norm_as_native(
    const at::Tensor& input, const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias,
    const c10::optional<at::Tensor>& running_mean, const c10::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps, bool cudnn_enabled);

// Composites that read a tensor argument's values on the host (its data pointer): a ShardTensor
// has none, so libtorch's decomposition would raise "Cannot access data pointer". Each reads the
// whole value of that argument (a plain tensor, gathered where it is split) and goes on as
// libtorch does; its other arguments keep their layouts.
//  - tensor_split(self, tensor_indices_or_sections, dim): the indices or the section count;
//  - ctc_loss(log_probs, targets, input_lengths, target_lengths, ...): the two lengths.
std::vector<at::Tensor> tensor_split_by_host_indices(const at::Tensor& self, const at::Tensor& indices_or_sections, int64_t dim);
at::Tensor ctc_loss_by_host_lengths(const at::Tensor& log_probs, const at::Tensor& targets, const at::Tensor& input_lengths,
                                    const at::Tensor& target_lengths, int64_t blank, int64_t reduction, bool zero_infinity);

// max_pool1d as max_pool1d_with_indices, which the pooling rules serve: libtorch's own CPU
// path for an input that needs no gradient computes on the input's data pointer.
at::Tensor max_pool1d_with_indices_first(const at::Tensor& self, c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                                         c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceil_mode);

// Registers the `.vec` upsample overloads (output size or scale factors) as their sized
// overloads, computing the output size as libtorch does, on the libtorch lines where they do
// not decompose by themselves (SHARDTENSOR_DECOMPOSES_UPSAMPLE_VEC); elsewhere a no-op.
void register_upsample_vec_decompositions(torch::Library& whole, torch::Library& whole_autograd);

}  // namespace shardtensor
