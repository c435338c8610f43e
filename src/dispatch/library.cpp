// The only place that registers anything with the dispatcher.
//
// Why per-operator registration and not just a fallback: kernels registered for
// CompositeExplicitAutograd(NonFunctional) win over a backend fallback (aten::add.Tensor is
// one), so they would run on the storage-less wrapper. Registering our kernel on PrivateUse1
// for each such operator puts it first. CompositeImplicitAutograd operators (matmul, linear,
// conv2d, ...) are left alone: they decompose above autograd and we see their primitives.
#include "dispatch/library.h"

#include "shardtensor/dispatch.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <torch/library.h>

#include <map>
#include <memory>

#include "dispatch/decompositions.h"
#include "dispatch/direct_kernel.h"
#include "dispatch/foreach.h"
#include "dispatch/fused_steps.h"
#include "dispatch/in_place_shape.h"
#include "dispatch/kernel.h"
#include "dispatch/op_name.h"

namespace shardtensor {
namespace {

torch::CppFunction kernel_function() { return torch::CppFunction::makeFromBoxedFunction<&shard_tensor_kernel>(); }

// CompositeImplicitAutograd backward helpers that build a plain zeros tensor and scatter the
// gradient into it: decomposed, they would mix a plain full-size tensor with ShardTensors.
// Our kernel takes them whole, on PrivateUse1 and on its autograd key (they run inside
// backward; differentiating them again is refused below).
const char* const kWholeCompositeOps[] = {"aten::value_selecting_reduction_backward", "aten::index_select_backward",
                                          "aten::gather_backward"};

void whole_composite_autograd_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (at::GradMode::is_enabled()) {
    const size_t n = op.schema().arguments().size();
    for (size_t i = stack->size() - n; i < stack->size(); ++i)
      TORCH_CHECK(!(*stack)[i].isTensor() || !(*stack)[i].toTensor().requires_grad(), full_op_name(op.operator_name()),
                  ": differentiating this backward operator again (double backward) is not supported on ShardTensors.");
  }
  shard_tensor_kernel(op, stack);
}

// "name.overload" of an aten operator as the dispatcher names it.
c10::OperatorName aten_operator(const std::string& unqualified) {
  const size_t dot = unqualified.find('.');
  return {"aten::" + unqualified.substr(0, dot), dot == std::string::npos ? "" : unqualified.substr(dot + 1)};
}

void register_everything() {
  // Kept alive for the life of the process: dropping a Library deregisters its kernels.
  static std::vector<std::unique_ptr<torch::Library>> libraries;
  auto fallback = std::make_unique<torch::Library>(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  fallback->fallback(kernel_function());
  libraries.push_back(std::move(fallback));

  auto whole = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  auto whole_autograd = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradPrivateUse1, __FILE__, __LINE__);
  for (const char* name : kWholeCompositeOps) {
    const std::string unqualified = std::string(name).substr(6);
    whole->impl(unqualified.c_str(), kernel_function());
    whole_autograd->impl(unqualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&whole_composite_autograd_kernel>());
  }
  // Decompositions of our own for composite ops whose libtorch one cannot run on ShardTensors.
  whole_autograd->impl("_pad_circular", TORCH_FN(circular_pad));
  whole->impl("linear", TORCH_FN(linear_on_shards));
  whole_autograd->impl("linear", TORCH_FN(linear_on_shards));
  whole->impl("_batch_norm_impl_index", TORCH_FN(batch_norm_as_native));
  whole_autograd->impl("_batch_norm_impl_index", TORCH_FN(batch_norm_as_native));
  whole->impl("dist", TORCH_FN(dist_as_norm));
  whole_autograd->impl("dist", TORCH_FN(dist_as_norm));
  for (torch::Library* lib : {whole.get(), whole_autograd.get()}) {
    lib->impl("tensor_split.tensor_indices_or_sections", TORCH_FN(tensor_split_by_host_indices));
    lib->impl("ctc_loss.Tensor", TORCH_FN(ctc_loss_by_host_lengths));
    lib->impl("max_pool1d", TORCH_FN(max_pool1d_with_indices_first));
  }
  // Fused optimizer steps and GradScaler's unscale, on the local pieces (fused_steps.h).
  for (torch::Library* lib : {whole.get(), whole_autograd.get()}) {
    for (const char* name : kFusedStepOps)
      if (c10::Dispatcher::singleton().findSchema(aten_operator(name))) lib->impl(name, torch::CppFunction::makeFromBoxedFunction<&fused_step_kernel>());
    lib->impl(kUnscaleOp, torch::CppFunction::makeFromBoxedFunction<&unscale_kernel>());
  }
  register_upsample_vec_decompositions(*whole, *whole_autograd);
  register_in_place_shape_ops(*whole);
  register_direct_kernels(*whole);
  // _foreach_* operators: one per-tensor call per element (foreach.h), above autograd so that
  // each element's call is recorded by the per-tensor operator's own formula.
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("aten::_foreach_", 0) != 0) continue;
    auto op = c10::Dispatcher::singleton().findOp(name);
    if (!op || !op->hasSchema() || op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) continue;
    const std::string unqualified = full_op_name(name).substr(6);
    whole->impl(unqualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&foreach_kernel>());
    whole_autograd->impl(unqualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&foreach_kernel>());
  }
  libraries.push_back(std::move(whole));
  libraries.push_back(std::move(whole_autograd));

  std::map<std::string, torch::Library*> by_namespace;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasSchema()) continue;
    if (op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) continue;
    if (op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    const std::string ns = name.name.substr(0, name.name.find("::"));
    torch::Library*& lib = by_namespace[ns];
    if (!lib) {
      libraries.push_back(std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1, __FILE__, __LINE__));
      lib = libraries.back().get();
    }
    lib->impl(full_op_name(name).c_str(), kernel_function());
  }
}

}  // namespace

void ensure_dispatch_registered() {
  // Asked on every wrapper made: a function-local static's guard is one inline check, where
  // std::call_once is a library call each time.
  static const bool registered = (register_everything(), true);
  (void)registered;
}

void register_kernels() { ensure_dispatch_registered(); }

}  // namespace shardtensor
