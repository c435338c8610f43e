#include "dispatch/decompositions.h"

#include <ATen/ATen.h>
#include <ATen/ops/ctc_loss_native.h>
#include <ATen/ops/linear_native.h>
#include <ATen/ops/tensor_split_native.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <vector>

#include "dispatch/direct_kernel.h"
#include "dispatch/shard_tensor_impl.h"
#include "domain/kernel_moves.h"
#include "redistribute/executor.h"
#include "redistribute/plan.h"
#include "shardtensor/redistribute.h"
#include "util/torch_compat.h"

namespace shardtensor {
namespace {

void check_pad(const at::Tensor& self, c10::IntArrayRef pad) {
  TORCH_CHECK(pad.size() % 2 == 0 && static_cast<int64_t>(pad.size()) / 2 <= self.dim(), "circular padding: ", pad.size(),
              " padding values for a ", self.dim(), "-d tensor; give (before, after) pairs from the last dim back");
  for (size_t i = 0; i < pad.size() / 2; ++i) {
    const int64_t dim = self.dim() - 1 - static_cast<int64_t>(i), length = self.size(dim);
    TORCH_CHECK(pad[2 * i] >= 0 && pad[2 * i + 1] >= 0 && pad[2 * i] <= length && pad[2 * i + 1] <= length,
                "circular padding of dim ", dim, " (length ", length, ") by (", pad[2 * i], ", ", pad[2 * i + 1],
                "): each side must be between 0 and the length");
  }
}

at::Tensor circular_pad_by_cat(const at::Tensor& self, c10::IntArrayRef pad) {
  at::Tensor out = self;
  for (size_t i = 0; i < pad.size() / 2; ++i) {
    const int64_t dim = self.dim() - 1 - static_cast<int64_t>(i), before = pad[2 * i], after = pad[2 * i + 1];
    const int64_t length = out.size(dim);
    std::vector<at::Tensor> parts;
    if (before) parts.push_back(out.narrow(dim, length - before, before));
    parts.push_back(out);
    if (after) parts.push_back(out.narrow(dim, 0, after));
    if (parts.size() > 1) out = at::cat(parts, dim);
  }
  return out;
}

// The periodic halo axes of a circular pad of `in`, and the padded output's spec. Rank r owns
// the outputs opposite its rows (shifted by the padding before them); its window is those
// outputs' sources, wrapping around the ends.
struct PeriodicPad {
  std::vector<HaloAxis> axes;
  ShardTensorSpec out;
};

PeriodicPad periodic_pad(const ShardTensorSpec& in, const std::vector<int64_t>& pad) {
  std::vector<HaloAxis> axes;
  std::vector<int64_t> shape = in.shape();
  ShardSizes sizes = in.shard_sizes();
  for (size_t i = 0; i < pad.size() / 2; ++i) {
    const int64_t dim = in.ndim() - 1 - static_cast<int64_t>(i), before = pad[2 * i], after = pad[2 * i + 1];
    const int64_t length = in.shape()[dim], out_length = length + before + after;
    const DimSharding* s = in.sharding_of(dim);
    HaloAxis axis{dim, s ? s->mesh_dims.front() : -1, length, sizes_to_ranges(s ? s->sizes : std::vector<int64_t>{length}), {},
                  /*periodic=*/true};
    const std::vector<Range> outputs = shifted_ranges(axis.owned, before, out_length);
    for (const Range& o : outputs) axis.window.push_back({o.begin - before, o.end - before});
    const std::vector<int64_t> out_sizes = range_sizes(outputs);
    for (DimShardSizes& entry : sizes)
      if (entry.tensor_dim == dim) entry.sizes = out_sizes;
    shape[dim] = out_length;
    axes.push_back(std::move(axis));
  }
  return {std::move(axes), ShardTensorSpec(in.mesh(), in.placements(), shape, in.dtype(), sizes)};
}

struct SpecHolder : torch::CustomClassHolder {
  explicit SpecHolder(ShardTensorSpec s) : spec(std::move(s)) {}
  ShardTensorSpec spec;
};

class PeriodicHaloPad : public torch::autograd::Function<PeriodicHaloPad> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& self, std::vector<int64_t> pad) {
    const ShardTensorSpec& in = shard_tensor_impl(self)->spec();
    const PeriodicPad plan = periodic_pad(in, pad);
    at::Tensor local = shard_tensor_impl(self)->local();
    // A decomposition, not a cached kernel: its halo is lowered per call.
    const HaloPlan halo{in.mesh(), plan.axes};
    local = KernelMoves(halo_gathers(halo), {halo.mesh, halo.axes}).gather_windows(local);
    ctx->saved_data["pad"] = pad;
    ctx->saved_data["spec"] = c10::IValue::make_capsule(c10::make_intrusive<SpecHolder>(in));
    return make_shard_tensor(local.contiguous(), plan.out);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const ShardTensorSpec in = c10::static_intrusive_pointer_cast<SpecHolder>(ctx->saved_data["spec"].toCapsule())->spec;
    const PeriodicPad plan = periodic_pad(in, ctx->saved_data["pad"].toIntVector());
    const ShardTensorImpl* grad = shard_tensor_impl(grads[0]);
    TORCH_CHECK(grad, "circular padding: the gradient of a ShardTensor output is a plain tensor");
    at::Tensor local = grad->local();
    if (grad->spec() != plan.out) local = execute_redistribute(local, grad->spec(), *plan_redistribute(grad->spec(), plan.out));
    const HaloPlan halo{in.mesh(), plan.axes};
    local = KernelMoves(halo_scatter_adds(halo), {halo.mesh, halo.axes}).scatter_add_windows(local);
    return {make_shard_tensor(local, in), at::Tensor()};
  }
};

}  // namespace

at::Tensor circular_pad(const at::Tensor& self, c10::IntArrayRef pad) {
  check_pad(self, pad);
  const ShardTensorImpl* impl = shard_tensor_impl(self);
  bool periodic_halo = impl && !impl->spec().has_partial();
  for (size_t i = 0; periodic_halo && i < pad.size() / 2; ++i) {
    const DimSharding* s = impl->spec().sharding_of(self.dim() - 1 - static_cast<int64_t>(i));
    periodic_halo = !s || s->mesh_dims.size() == 1;
  }
  return periodic_halo ? PeriodicHaloPad::apply(self, pad.vec()) : circular_pad_by_cat(self, pad);
}

namespace {
// Whether autograd records an operator that reads `t` (a gradient or a forward-mode tangent).
bool recorded_by_autograd(const at::Tensor& t) {
  return t.defined() && ((t.requires_grad() && at::GradMode::is_enabled()) || t._fw_grad(/*level=*/0).defined());
}
}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t> batch_norm_as_native(
    const at::Tensor& input, const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias,
    const c10::optional<at::Tensor>& running_mean, const c10::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps, bool /*cudnn_enabled*/) {
  auto [out, mean, invstd] = at::native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps);
  return {out, mean, invstd, at::empty({0}, input.options().dtype(at::kByte)), 0};
}

at::Tensor linear_on_shards(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  if (input.dim() == 2 && weight.dim() == 2 && !recorded_by_autograd(input) && !recorded_by_autograd(weight) &&
      !(bias && recorded_by_autograd(*bias)))
    return linear_2d_as_one_operator(input, weight, bias);
  int64_t split = -1, split_leading_dims = 0;
  if (const ShardTensorImpl* impl = shard_tensor_impl(input); impl && input.dim() >= 3) {
    for (const DimSharding& s : impl->spec().shardings())
      if (s.tensor_dim < input.dim() - 1) {
        split = s.tensor_dim;
        ++split_leading_dims;
      }
  }
  // Two split leading dims cannot both survive a flattening either way: libtorch's, which gathers.
  if (split <= 0 || split_leading_dims != 1) return at::native::linear(input, weight, bias);
  return at::native::linear(input.movedim(split, 0), weight, bias).movedim(0, split);
}

namespace {
// The whole value of a tensor argument that a composite reads on the host.
at::Tensor host_value(const at::Tensor& t) { return shard_tensor_impl(t) ? full_tensor(t) : t; }
}  // namespace

std::vector<at::Tensor> tensor_split_by_host_indices(const at::Tensor& self, const at::Tensor& indices_or_sections, int64_t dim) {
  return at::native::tensor_split(self, host_value(indices_or_sections), dim);
}

at::Tensor ctc_loss_by_host_lengths(const at::Tensor& log_probs, const at::Tensor& targets, const at::Tensor& input_lengths,
                                    const at::Tensor& target_lengths, int64_t blank, int64_t reduction, bool zero_infinity) {
  return at::native::ctc_loss(log_probs, targets, host_value(input_lengths), host_value(target_lengths), blank, reduction,
                              zero_infinity);
}

at::Tensor max_pool1d_with_indices_first(const at::Tensor& self, c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                                         c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceil_mode) {
  return std::get<0>(at::max_pool1d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode));
}

at::Tensor dist_as_norm(const at::Tensor& self, const at::Tensor& other, const at::Scalar& p) {
  return at::norm(self - other, p);
}

#if SHARDTENSOR_DECOMPOSES_UPSAMPLE_VEC
namespace {

using ScaleFactors = c10::optional<at::ArrayRef<double>>;

// compute_output_size (UpSample.cpp): the given size, else each spatial size times its factor.
std::vector<int64_t> sized(const at::Tensor& input, at::OptionalSymIntArrayRef output_size, ScaleFactors scales, int64_t spatial) {
  TORCH_CHECK(output_size.has_value() != scales.has_value(), "upsample: give exactly one of output_size and scale_factors");
  if (output_size) return c10::asIntArrayRefSlow(*output_size).vec();
  TORCH_CHECK(static_cast<int64_t>(scales->size()) == spatial, "upsample: ", scales->size(), " scale factors for ", spatial,
              " spatial dims");
  std::vector<int64_t> out;
  for (int64_t i = 0; i < spatial; ++i) out.push_back(static_cast<int64_t>(input.size(input.dim() - spatial + i) * (*scales)[i]));
  return out;
}

c10::optional<double> scale(ScaleFactors scales, size_t i) { return scales ? c10::optional<double>((*scales)[i]) : c10::nullopt; }

using OptSize = at::OptionalSymIntArrayRef;
at::Tensor linear1d(const at::Tensor& in, OptSize size, bool align, ScaleFactors s) {
  return at::upsample_linear1d(in, sized(in, size, s, 1), align, scale(s, 0));
}
at::Tensor bilinear2d(const at::Tensor& in, OptSize size, bool align, ScaleFactors s) {
  return at::upsample_bilinear2d(in, sized(in, size, s, 2), align, scale(s, 0), scale(s, 1));
}
at::Tensor bicubic2d(const at::Tensor& in, OptSize size, bool align, ScaleFactors s) {
  return at::upsample_bicubic2d(in, sized(in, size, s, 2), align, scale(s, 0), scale(s, 1));
}
at::Tensor trilinear3d(const at::Tensor& in, OptSize size, bool align, ScaleFactors s) {
  return at::upsample_trilinear3d(in, sized(in, size, s, 3), align, scale(s, 0), scale(s, 1), scale(s, 2));
}
at::Tensor nearest1d(const at::Tensor& in, OptSize size, ScaleFactors s) { return at::upsample_nearest1d(in, sized(in, size, s, 1), scale(s, 0)); }
at::Tensor nearest2d(const at::Tensor& in, OptSize size, ScaleFactors s) {
  return at::upsample_nearest2d(in, sized(in, size, s, 2), scale(s, 0), scale(s, 1));
}
at::Tensor nearest3d(const at::Tensor& in, OptSize size, ScaleFactors s) {
  return at::upsample_nearest3d(in, sized(in, size, s, 3), scale(s, 0), scale(s, 1), scale(s, 2));
}
at::Tensor exact1d(const at::Tensor& in, OptSize size, ScaleFactors s) {
  return at::_upsample_nearest_exact1d(in, sized(in, size, s, 1), scale(s, 0));
}
at::Tensor exact2d(const at::Tensor& in, OptSize size, ScaleFactors s) {
  return at::_upsample_nearest_exact2d(in, sized(in, size, s, 2), scale(s, 0), scale(s, 1));
}
at::Tensor exact3d(const at::Tensor& in, OptSize size, ScaleFactors s) {
  return at::_upsample_nearest_exact3d(in, sized(in, size, s, 3), scale(s, 0), scale(s, 1), scale(s, 2));
}

template <typename Fn>
void on_both(torch::Library& whole, torch::Library& whole_autograd, const char* name, Fn fn) {
  whole.impl(name, fn);
  whole_autograd.impl(name, fn);
}

}  // namespace

void register_upsample_vec_decompositions(torch::Library& whole, torch::Library& whole_autograd) {
  on_both(whole, whole_autograd, "upsample_linear1d.vec", TORCH_FN(linear1d));
  on_both(whole, whole_autograd, "upsample_bilinear2d.vec", TORCH_FN(bilinear2d));
  on_both(whole, whole_autograd, "upsample_bicubic2d.vec", TORCH_FN(bicubic2d));
  on_both(whole, whole_autograd, "upsample_trilinear3d.vec", TORCH_FN(trilinear3d));
  on_both(whole, whole_autograd, "upsample_nearest1d.vec", TORCH_FN(nearest1d));
  on_both(whole, whole_autograd, "upsample_nearest2d.vec", TORCH_FN(nearest2d));
  on_both(whole, whole_autograd, "upsample_nearest3d.vec", TORCH_FN(nearest3d));
  on_both(whole, whole_autograd, "_upsample_nearest_exact1d.vec", TORCH_FN(exact1d));
  on_both(whole, whole_autograd, "_upsample_nearest_exact2d.vec", TORCH_FN(exact2d));
  on_both(whole, whole_autograd, "_upsample_nearest_exact3d.vec", TORCH_FN(exact3d));
}
#else
void register_upsample_vec_decompositions(torch::Library&, torch::Library&) {}
#endif

}  // namespace shardtensor
