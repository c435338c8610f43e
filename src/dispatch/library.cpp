// The only place that registers anything with the dispatcher.
//
// Why per-operator registration and not just a fallback: kernels registered for
// CompositeExplicitAutograd(NonFunctional) win over a backend fallback (aten::add.Tensor is
// one), so they would run on the storage-less wrapper. Registering our kernel on PrivateUse1
// for each such operator puts it first. CompositeImplicitAutograd operators (matmul, linear,
// conv2d, ...) are left alone: they decompose above autograd and we see their primitives.
#include "dispatch/library.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>

#include "dispatch/kernel.h"

namespace shardtensor {
namespace {

torch::CppFunction kernel_function() { return torch::CppFunction::makeFromBoxedFunction<&shard_tensor_kernel>(); }

void register_everything() {
  // Kept alive for the life of the process: dropping a Library deregisters its kernels.
  static std::vector<std::unique_ptr<torch::Library>> libraries;
  auto fallback = std::make_unique<torch::Library>(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  fallback->fallback(kernel_function());
  libraries.push_back(std::move(fallback));

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
  static std::once_flag once;
  std::call_once(once, register_everything);
}

}  // namespace shardtensor
