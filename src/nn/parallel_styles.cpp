// ColwiseParallel, RowwiseParallel and SequenceParallel for torch::nn modules
// (shardtensor/parallel.h), with the layouts of shardtensor.parallel's styles in Python.
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>


#include "nn/module_parameters.h"
#include "shardtensor/parallel.h"
#include "shardtensor/redistribute.h"
#include "shardtensor/shard_tensor.h"

namespace shardtensor::parallel {
namespace {

Placement normalized(const Placement& p, int64_t ndim) {
  return p.is_shard() && ndim > 0 ? Shard(((p.tensor_dim % ndim) + ndim) % ndim) : p;
}

// `t` as a ShardTensor on `mesh`: a ShardTensor as it is, a plain tensor as this rank's piece of
// a tensor laid out by `layout`. `sizes`, where given, are every rank's piece along the split dim
// (the module's own weight pieces, the same on every rank by construction, so no agreement
// all-gather); without them one small all-gather of shapes gives the global size.
at::Tensor as_shard_tensor(const at::Tensor& t, const DeviceMesh& mesh, const Placement& layout,
                           const std::vector<int64_t>* sizes, const char* style) {
  TORCH_CHECK(t.defined(), style, ": got an undefined input tensor");
  if (is_shard_tensor(t)) {
    TORCH_CHECK(spec(t).mesh() == mesh, style, ": an input is a ShardTensor on ", spec(t).mesh().to_string(),
                ", but the module is parallelized over ", mesh.to_string(), "; redistribute it onto that mesh first");
    return t;
  }
  if (!layout.is_shard()) return from_local(t, mesh, {layout});  // every rank holds the whole (or a term): no message
  TORCH_CHECK(t.dim() > 0, style, ": input_layouts ", shardtensor::to_string(layout), " splits a dim, but the input is a scalar");
  const int64_t dim = normalized(layout, t.dim()).tensor_dim;
  if (sizes == nullptr) return from_local(t, mesh, {Shard(dim)}, ShardSizing::infer());
  return from_local(t, mesh, {Shard(dim)}, ShardSizing::trusted({{dim, *sizes}}));
}

// `t` laid out by `layout` (with `sizes` along its split dim, where given).
at::Tensor redistributed(const at::Tensor& t, const DeviceMesh& mesh, const Placement& layout,
                         const std::vector<int64_t>* sizes = nullptr) {
  const Placement target = normalized(layout, t.dim());
  const ShardTensorSpec& s = spec(t);
  const DimSharding* split = target.is_shard() ? s.sharding_of(target.tensor_dim) : nullptr;
  if (s.placements() == Placements{target} && (sizes == nullptr || (split != nullptr && split->sizes == *sizes))) return t;
  if (sizes == nullptr) return redistribute(t, mesh, {target});
  return redistribute(t, mesh, {target}, ShardSizes{{target.tensor_dim, *sizes}});
}

at::Tensor output_as(const at::Tensor& out, const DeviceMesh& mesh, const Placement& layout, bool use_local_output) {
  if (!is_shard_tensor(out)) return out;
  const at::Tensor laid_out = redistributed(out, mesh, layout);
  return use_local_output ? shardtensor::to_local(laid_out, std::nullopt) : laid_out;
}

enum class Kind { Linear, Embedding };

Kind supported(const char* style, torch::nn::Module& module) {
  if (dynamic_cast<torch::nn::LinearImpl*>(&module) != nullptr) return Kind::Linear;
  if (dynamic_cast<torch::nn::EmbeddingImpl*>(&module) != nullptr) return Kind::Embedding;
  TORCH_CHECK(false, style, " supports torch::nn::Linear and torch::nn::Embedding (as DTensor's does), got ", module.name(),
              "; write the layout of other modules with distribute_module(module, mesh, partition_fn, input_fn, output_fn)");
}

void shard_parameter(torch::nn::Module& module, const std::string& name, const DeviceMesh& mesh, const Placement& layout) {
  for (const auto& p : module.named_parameters(/*recurse=*/false))
    if (p.key() == name && p.value().defined()) replace_parameter(module, name, nn_detail::sharded_parameter(p.value(), mesh, layout));
}

// A Rowwise Linear's input pieces along its last dim: the sizes of its weight's Shard(1) pieces.
const std::vector<int64_t>& weight_column_sizes(torch::nn::Module& module) {
  const at::Tensor& weight = dynamic_cast<torch::nn::LinearImpl&>(module).weight;
  TORCH_CHECK(is_shard_tensor(weight), "RowwiseParallel: the Linear's weight is not a ShardTensor; was the module "
              "partitioned by parallelize_module?");
  const DimSharding* columns = spec(weight).sharding_of(1);
  TORCH_CHECK(columns != nullptr, "RowwiseParallel: the Linear's weight is laid out as ", spec(weight).to_string(),
              ", not split along its input features (Shard(1))");
  return columns->sizes;
}

}  // namespace

// ---- ColwiseParallel ---------------------------------------------------------------------------

ColwiseParallel& ColwiseParallel::input_layouts(Placement layout) { input_layout_ = layout; return *this; }
ColwiseParallel& ColwiseParallel::output_layouts(Placement layout) { output_layout_ = layout; return *this; }
ColwiseParallel& ColwiseParallel::use_local_output(bool local) { use_local_output_ = local; return *this; }

void ColwiseParallel::partition(torch::nn::Module& module, const DeviceMesh& mesh) const {
  if (supported("ColwiseParallel", module) == Kind::Linear) {
    shard_parameter(module, "weight", mesh, Shard(0));
    shard_parameter(module, "bias", mesh, Shard(0));
  } else {
    shard_parameter(module, "weight", mesh, Shard(1));
  }
}

at::Tensor ColwiseParallel::prepare_input(torch::nn::Module&, const at::Tensor& input, const DeviceMesh& mesh) const {
  return redistributed(as_shard_tensor(input, mesh, input_layout_, nullptr, "ColwiseParallel"), mesh, Replicate());
}

at::Tensor ColwiseParallel::prepare_output(torch::nn::Module&, const at::Tensor& output, const DeviceMesh& mesh) const {
  return output_as(output, mesh, output_layout_, use_local_output_);
}

std::string ColwiseParallel::to_string() const {
  return "ColwiseParallel(input_layouts=" + shardtensor::to_string(input_layout_) + ", output_layouts=" + shardtensor::to_string(output_layout_) +
         ", use_local_output=" + (use_local_output_ ? "true" : "false") + ")";
}

// ---- RowwiseParallel ---------------------------------------------------------------------------

RowwiseParallel& RowwiseParallel::input_layouts(Placement layout) { input_layout_ = layout; return *this; }
RowwiseParallel& RowwiseParallel::output_layouts(Placement layout) { output_layout_ = layout; return *this; }
RowwiseParallel& RowwiseParallel::use_local_output(bool local) { use_local_output_ = local; return *this; }

void RowwiseParallel::partition(torch::nn::Module& module, const DeviceMesh& mesh) const {
  if (supported("RowwiseParallel", module) == Kind::Linear) {
    shard_parameter(module, "weight", mesh, Shard(1));
    shard_parameter(module, "bias", mesh, Replicate());
  } else {
    shard_parameter(module, "weight", mesh, Shard(0));
  }
}

at::Tensor RowwiseParallel::prepare_input(torch::nn::Module& module, const at::Tensor& input, const DeviceMesh& mesh) const {
  if (supported("RowwiseParallel", module) == Kind::Embedding)
    return redistributed(as_shard_tensor(input, mesh, input_layout_, nullptr, "RowwiseParallel"), mesh, Replicate());
  // The input's last dim meets the weight's split dim 1: its pieces have the weight's sizes.
  const std::vector<int64_t>& sizes = weight_column_sizes(module);
  const bool splits_last = input_layout_.is_shard() && input.defined() && input.dim() > 0 &&
                           normalized(input_layout_, input.dim()).tensor_dim == input.dim() - 1;
  const at::Tensor x = as_shard_tensor(input, mesh, input_layout_, splits_last ? &sizes : nullptr, "RowwiseParallel");
  return redistributed(x, mesh, Shard(-1), &sizes);
}

at::Tensor RowwiseParallel::prepare_output(torch::nn::Module&, const at::Tensor& output, const DeviceMesh& mesh) const {
  return output_as(output, mesh, output_layout_, use_local_output_);
}

std::string RowwiseParallel::to_string() const {
  return "RowwiseParallel(input_layouts=" + shardtensor::to_string(input_layout_) + ", output_layouts=" + shardtensor::to_string(output_layout_) +
         ", use_local_output=" + (use_local_output_ ? "true" : "false") + ")";
}

// ---- SequenceParallel --------------------------------------------------------------------------

SequenceParallel& SequenceParallel::use_local_output(bool local) { use_local_output_ = local; return *this; }

void SequenceParallel::partition(torch::nn::Module& module, const DeviceMesh& mesh) const {
  nn_detail::replicate_plain_parameters(module, mesh);
}

at::Tensor SequenceParallel::prepare_input(torch::nn::Module&, const at::Tensor& input, const DeviceMesh& mesh) const {
  const Placement sequence = Shard(sequence_dim_);
  return redistributed(as_shard_tensor(input, mesh, sequence, nullptr, "SequenceParallel"), mesh, sequence);
}

at::Tensor SequenceParallel::prepare_output(torch::nn::Module&, const at::Tensor& output, const DeviceMesh&) const {
  return use_local_output_ && is_shard_tensor(output) ? shardtensor::to_local(output, std::nullopt) : output;
}

std::string SequenceParallel::to_string() const {
  return "SequenceParallel(sequence_dim=" + std::to_string(sequence_dim_) +
         ", use_local_output=" + (use_local_output_ ? "true" : "false") + ")";
}

}  // namespace shardtensor::parallel
