// Softmax, log_softmax and layer norm, forward and backward.
//
// These read whole rows along the normalised dims: those dims are gathered first (a softmax
// over a sharded dim redistributes), every other dim keeps its sharding, and the statistics
// (mean, rstd) follow the batch dims. The weight and bias gradients of layer norm are sums
// over rows, so they are Partial(sum) on every mesh dim that shards rows.
#include "rules/helpers.h"

namespace shardtensor {
namespace {

RuleResult softmax_rule(const OpMeta& op) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  const int64_t dim = wrap_dim(int_arg(op, 1), in.ndim(), op);
  const ShardTensorSpec target = replicate_tensor_dims(in, {dim});
  RuleResult r;
  r.input_targets = {target};
  r.outputs = {layout_of(target)};
  return r;
}

// _softmax_backward_data(grad_output, output, dim, input_dtype)
RuleResult softmax_backward_rule(const OpMeta& op) {
  const ShardTensorSpec& grad = op.inputs[0].spec;
  const int64_t dim = wrap_dim(int_arg(op, 2), grad.ndim(), op);
  const ShardTensorSpec target = replicate_tensor_dims(grad, {dim});
  RuleResult r;
  r.input_targets = {target, align_to(op.inputs[1].spec, target)};
  r.outputs = {layout_of(target)};
  return r;
}

std::vector<int64_t> trailing_dims(int64_t ndim, size_t count) {
  std::vector<int64_t> dims;
  for (int64_t d = ndim - static_cast<int64_t>(count); d < ndim; ++d) dims.push_back(d);
  return dims;
}

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd)
RuleResult layer_norm_rule(const OpMeta& op) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  const ShardTensorSpec target = replicate_tensor_dims(in, trailing_dims(in.ndim(), int_list_arg(op, 1).size()));
  RuleResult r;
  r.input_targets.push_back(target);
  for (size_t k = 1; k < op.inputs.size(); ++k) r.input_targets.push_back(replicated(op.inputs[k].spec));
  r.outputs = {layout_of(target), layout_of(target), layout_of(target)};
  return r;
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?,
// output_mask) -> (grad_input, grad_weight, grad_bias)
RuleResult layer_norm_backward_rule(const OpMeta& op) {
  const ShardTensorSpec& in = op.input_at(1)->spec;
  const ShardTensorSpec target = replicate_tensor_dims(in, trailing_dims(in.ndim(), int_list_arg(op, 2).size()));
  RuleResult r;
  for (const TensorInput& input : op.inputs) {
    const bool row_aligned = input.arg_index <= 4;  // grad_out, input, mean, rstd
    r.input_targets.push_back(row_aligned ? align_to(input.spec, target) : replicated(input.spec));
  }
  const OutputLayout params{summed_over_shards(target), {}};
  r.outputs = {layout_of(target), params, params};
  return r;
}

}  // namespace

void register_normalization_rules(RuleRegistry& registry) {
  for (const char* name : {"aten::_softmax", "aten::_log_softmax"}) registry.add(name, softmax_rule);
  for (const char* name : {"aten::_softmax_backward_data", "aten::_log_softmax_backward_data"})
    registry.add(name, softmax_backward_rule);
  registry.add("aten::native_layer_norm", layer_norm_rule);
  registry.add("aten::native_layer_norm_backward", layer_norm_backward_rule);
}

}  // namespace shardtensor
