// The ShardTensor kernel: one boxed function for every operator.
//
// 1. unwrap: collect the specs of the ShardTensor arguments;
// 2. propagate: the operator's rule gives the input layouts it needs and the output specs;
// 3. (redistribute inputs whose layout differs: arrives with the redistribute issue, #3;
//    until then such a call raises instead of computing on the wrong layout);
// 4. run the operator on the local tensors with the autograd keys excluded, so local tensors
//    record no second graph;
// 5. wrap each output tensor with its spec.
#include "dispatch/kernel.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "dispatch/shard_tensor_impl.h"
#include "rules/registry.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

// Replaces every ShardTensor in [begin, end) of the stack by its local tensor and returns their specs.
std::vector<ShardTensorSpec> unwrap_arguments(const std::string& op_name, torch::jit::Stack& stack, size_t begin) {
  std::vector<ShardTensorSpec> specs;
  auto unwrap_one = [&](const at::Tensor& t) -> at::Tensor {
    if (ShardTensorImpl* impl = shard_tensor_impl(t)) {
      specs.push_back(impl->spec());
      return impl->local();
    }
    TORCH_CHECK(!t.defined() || t.dim() == 0, op_name, ": got a plain ", t.dim(), "-d tensor next to ShardTensors; ",
                "wrap it with from_local() or distribute it first.");
    return t;
  };
  for (size_t i = begin; i < stack.size(); ++i) {
    c10::IValue& arg = stack[i];
    if (arg.isTensor()) {
      arg = unwrap_one(arg.toTensor());
    } else if (arg.isTensorList()) {
      std::vector<at::Tensor> locals;
      for (const at::Tensor& t : arg.toTensorVector()) locals.push_back(unwrap_one(t));
      arg = locals;
    }
  }
  for (const ShardTensorSpec& s : specs)
    TORCH_CHECK(s.mesh() == specs.front().mesh(), op_name, ": inputs are on different meshes (", specs.front().mesh(),
                " vs ", s.mesh(), "). All sharded inputs must share one mesh; redistribute one input first.");
  return specs;
}

void wrap_outputs(const std::string& op_name, torch::jit::Stack& stack, size_t begin, const RuleResult& result) {
  size_t next = 0;
  auto wrap_one = [&](const at::Tensor& local) {
    TORCH_INTERNAL_ASSERT(next < result.output_specs.size(), op_name, ": the rule gave ", result.output_specs.size(),
                          " output specs for more tensor outputs");
    return make_shard_tensor(local, result.output_specs[next++]);
  };
  for (size_t i = begin; i < stack.size(); ++i) {
    c10::IValue& out = stack[i];
    if (out.isTensor()) {
      out = wrap_one(out.toTensor());
    } else if (out.isTensorList()) {
      std::vector<at::Tensor> wrapped;
      for (const at::Tensor& t : out.toTensorVector()) wrapped.push_back(wrap_one(t));
      out = wrapped;
    }
  }
}

}  // namespace

std::string full_op_name(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

void shard_tensor_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string name = full_op_name(op.operator_name());
  const size_t num_args = op.schema().arguments().size();
  const size_t args_begin = stack->size() - num_args;

  // Unwrapping first checks the inputs themselves (plain tensors, mixed meshes), whatever the rule.
  OpMeta meta{name, unwrap_arguments(name, *stack, args_begin)};
  const Rule* rule = rule_registry().find(name);
  TORCH_CHECK(rule, name, ": no sharding rule for this operator on ShardTensors yet. Call to_local() and ",
              "compute on local tensors, or register a rule for '", name, "'.");
  RuleResult result = (*rule)(meta);
  TORCH_CHECK(result.unsupported_reason.empty(), name, ": the sharding rule refuses inputs ",
              join(meta.inputs, ", "), ": ", result.unsupported_reason);
  TORCH_INTERNAL_ASSERT(result.input_targets.size() == meta.inputs.size());
  for (size_t i = 0; i < meta.inputs.size(); ++i)
    TORCH_CHECK(result.input_targets[i] == meta.inputs[i], name, ": input ", i, " must move from ", meta.inputs[i],
                " to ", result.input_targets[i], ", and redistribution inside operators is not available yet.");

  {
    c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset);
    op.callBoxed(stack);
  }
  wrap_outputs(name, *stack, stack->size() - op.schema().returns().size(), result);
}

}  // namespace shardtensor
