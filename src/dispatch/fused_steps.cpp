// See fused_steps.h.
#include "dispatch/fused_steps.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <string>
#include <vector>

#include "comm/comm.h"
#include "dispatch/op_name.h"
#include "dispatch/shard_tensor_impl.h"
#include "redistribute/executor.h"
#include "redistribute/plan.h"

namespace shardtensor {

const char* const kFusedStepOps[8] = {"_fused_adam_",          "_fused_adam_.tensor_lr", "_fused_adamw_",
                                      "_fused_adamw_.tensor_lr", "_fused_sgd_",            "_fused_sgd_.tensor_lr",
                                      "_fused_adagrad_",        "_fused_adagrad_.tensor_lr"};

namespace {

// `spec` with `dtype`: a state or gradient may hold another dtype than its parameter.
ShardTensorSpec with_dtype(const ShardTensorSpec& spec, c10::ScalarType dtype) {
  return ShardTensorSpec(spec.mesh(), spec.placements(), spec.shape(), dtype, spec.shard_sizes());
}

// A scalar argument (a step count, a tensor learning rate, grad_scale, found_inf): one value per
// process, so a ShardTensor must be Replicate, and its piece is the value.
at::Tensor scalar_piece(const std::string& op, const std::string& arg, const at::Tensor& t) {
  const ShardTensorImpl* impl = shard_tensor_impl(t);
  if (!impl) return t;
  TORCH_CHECK(impl->spec().is_replicated(), op, ": argument '", arg, "' is one value per process, so a ShardTensor there must be "
              "Replicate; got ", impl->spec());
  return impl->local();
}

// The local piece of `t`, element `k` of list `arg`, for a step of parameter `param`.
at::Tensor piece_for_step(const std::string& op, const std::string& arg, size_t k, const at::Tensor& t, const at::Tensor& param) {
  const ShardTensorImpl* impl = shard_tensor_impl(t);
  const ShardTensorImpl* home = param.defined() ? shard_tensor_impl(param) : nullptr;
  if (arg == "state_steps") return scalar_piece(op, arg + "[" + std::to_string(k) + "]", t);
  if (!home && !impl) return t;
  TORCH_CHECK(home && impl, op, ": parameter ", k, " is a ", home ? "ShardTensor" : "plain tensor", " but its '", arg, "' is a ",
              impl ? "ShardTensor" : "plain tensor", "; a parameter's gradient and state must be distributed as it is");
  const ShardTensorSpec& from = impl->spec();
  const ShardTensorSpec to = with_dtype(home->spec(), from.dtype());
  if (from == to) return impl->local();
  TORCH_CHECK(arg == "grads" && from.mesh() == to.mesh(), op, ": parameter ", k, " is laid out as ", home->spec(), " but its '", arg,
              "' as ", from, "; the optimizer's state must be laid out as its parameter (zeros_like(param) makes it so)");
  // A gradient in another layout of the same mesh (a pending sum): moved to its parameter's.
  return execute_redistribute(impl->local(), from, *plan_redistribute(from, to));
}

}  // namespace

void fused_step_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard on_pieces(kExcludedOnPieces);
  const c10::FunctionSchema& schema = op.schema();
  const size_t n = schema.arguments().size(), begin = stack->size() - n;
  const std::string name = full_op_name(op.operator_name());
  const std::vector<at::Tensor> params = (*stack)[begin].toTensorVector();
  for (size_t i = 0; i < n; ++i) {
    c10::IValue& arg = (*stack)[begin + i];
    const std::string& arg_name = schema.arguments()[i].name();
    if (arg.isTensorList()) {
      std::vector<at::Tensor> pieces = arg.toTensorVector();
      TORCH_CHECK(pieces.empty() || pieces.size() == params.size(), name, ": '", arg_name, "' has ", pieces.size(),
                  " tensors for ", params.size(), " parameters");
      for (size_t k = 0; k < pieces.size(); ++k) pieces[k] = piece_for_step(name, arg_name, k, pieces[k], params[k]);
      arg = pieces;
    } else if (arg.isTensor()) {
      arg = scalar_piece(name, arg_name, arg.toTensor());
    }
  }
  op.callBoxed(stack);  // every tensor is a plain piece now: torch's own fused kernel
}

void unscale_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard on_pieces(kExcludedOnPieces);
  const size_t n = op.schema().arguments().size(), begin = stack->size() - n;
  const std::string name = full_op_name(op.operator_name());
  std::vector<at::Tensor> grads = (*stack)[begin].toTensorVector();
  std::vector<const DeviceMesh*> meshes;  // in the order the gradients name them: the same on every rank
  for (at::Tensor& g : grads) {
    const ShardTensorImpl* impl = shard_tensor_impl(g);
    if (!impl) continue;
    const DeviceMesh& mesh = impl->spec().mesh();
    bool seen = false;
    for (const DeviceMesh* m : meshes) seen = seen || *m == mesh;
    if (!seen) meshes.push_back(&mesh);
    g = impl->local();  // unscaled in place: the gradient's own piece
  }
  const at::Tensor found_inf = scalar_piece(name, "found_inf", (*stack)[begin + 1].toTensor());
  (*stack)[begin] = grads;
  (*stack)[begin + 1] = found_inf;
  (*stack)[begin + 2] = scalar_piece(name, "inv_scale", (*stack)[begin + 2].toTensor());
  op.callBoxed(stack);
  for (const DeviceMesh* mesh : meshes) {
    if (!mesh->includes_this_rank()) continue;
    for (int64_t d = 0; d < mesh->ndim(); ++d) mesh->comm(d).all_reduce(found_inf, ReduceOp::Max);
  }
}

}  // namespace shardtensor
