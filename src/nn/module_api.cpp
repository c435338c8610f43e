// distribute_module, parallelize_module with a plan, and the parameter surgery both need
// (shardtensor/parallel.h). Built on the public API only.
#include <fnmatch.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <utility>

#include "nn/module_parameters.h"
#include "shardtensor/parallel.h"
#include "shardtensor/redistribute.h"
#include "shardtensor/shard_tensor.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

// Module keeps its parameters in a protected OrderedDict. A pointer to that member, named
// through a class derived from Module, reaches it in any module (the rule for protected access
// allows exactly this, and ParameterDict relies on the same member): that is how a parameter is
// replaced under its own name, where register_parameter would refuse a second one.
struct ParameterSlots : torch::nn::Module {
  static torch::OrderedDict<std::string, at::Tensor>& of(torch::nn::Module& module) {
    return module.*(&ParameterSlots::parameters_);
  }
};

// The members through which torch::nn's own modules read their parameters in forward.
at::Tensor* member_holding(torch::nn::Module& module, const std::string& name) {
  auto weight_or_bias = [&](auto* m) -> at::Tensor* {
    if (name == "weight") return &m->weight;
    if (name == "bias") return &m->bias;
    return nullptr;
  };
  if (auto* m = dynamic_cast<torch::nn::LinearImpl*>(&module)) return weight_or_bias(m);
  if (auto* m = dynamic_cast<torch::nn::EmbeddingImpl*>(&module)) return name == "weight" ? &m->weight : nullptr;
  if (auto* m = dynamic_cast<torch::nn::LayerNormImpl*>(&module)) return weight_or_bias(m);
  if (auto* m = dynamic_cast<torch::nn::GroupNormImpl*>(&module)) return weight_or_bias(m);
  if (auto* m = dynamic_cast<torch::nn::Conv1dImpl*>(&module)) return weight_or_bias(m);
  if (auto* m = dynamic_cast<torch::nn::Conv2dImpl*>(&module)) return weight_or_bias(m);
  if (auto* m = dynamic_cast<torch::nn::Conv3dImpl*>(&module)) return weight_or_bias(m);
  if (auto* m = dynamic_cast<torch::nn::BatchNorm1dImpl*>(&module)) return weight_or_bias(m);
  if (auto* m = dynamic_cast<torch::nn::BatchNorm2dImpl*>(&module)) return weight_or_bias(m);
  if (auto* m = dynamic_cast<torch::nn::BatchNorm3dImpl*>(&module)) return weight_or_bias(m);
  return nullptr;
}

std::vector<std::string> child_names(const torch::nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& child : module.named_children()) names.push_back(child.key());
  return names;
}

using Resolved = nn_detail::ResolvedPath;

Resolved resolve(torch::nn::Module& root, const std::string& path) {
  std::vector<std::pair<torch::nn::Module*, std::shared_ptr<torch::nn::Module>>> found = {{nullptr, root.shared_from_this()}};
  std::vector<std::string> misses;
  size_t start = 0;
  while (!path.empty() && start <= path.size()) {
    const size_t dot = std::min(path.find('.', start), path.size());
    const std::string token = path.substr(start, dot - start);
    std::vector<std::pair<torch::nn::Module*, std::shared_ptr<torch::nn::Module>>> deeper;
    for (const auto& [_, parent] : found) {
      bool any = false;
      for (const auto& child : parent->named_children())
        if (fnmatch(token.c_str(), child.key().c_str(), 0) == 0) {
          deeper.emplace_back(parent.get(), child.value());
          any = true;
        }
      if (!any)
        misses.push_back("no child of " + parent->name() + " (children [" + join(child_names(*parent), ", ") + "]) matches '" + token + "'");
    }
    found = std::move(deeper);
    start = dot + 1;
  }
  return {std::move(found), std::move(misses)};
}

// A module called through `style`: the wrapper's input and output functions.
DistributedModule called_through(torch::nn::AnyModule module, const DeviceMesh& mesh,
                                 const std::shared_ptr<const parallel::ParallelStyle>& style, bool register_child) {
  InputFn input = [style](torch::nn::Module& m, const at::Tensor& x, const DeviceMesh& dm) { return style->prepare_input(m, x, dm); };
  OutputFn output = [style](torch::nn::Module& m, const at::Tensor& y, const DeviceMesh& dm) { return style->prepare_output(m, y, dm); };
  return DistributedModule(std::move(module), mesh, std::move(input), std::move(output), register_child);
}

// Where `parent` is a Sequential holding `module`, its entry calls `module` through the style's
// conversions from now on; the Sequential keeps `module` as its registered child.
void wrap_sequential_entry(torch::nn::Module* parent, const std::shared_ptr<torch::nn::Module>& module,
                           const DeviceMesh& mesh, const std::shared_ptr<const parallel::ParallelStyle>& style) {
  auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(parent);
  if (sequential == nullptr) return;
  for (auto entry = sequential->begin(); entry != sequential->end(); ++entry) {
    if (entry->ptr() != module) continue;
    *entry = torch::nn::AnyModule(called_through(std::move(*entry), mesh, style, /*register_child=*/false));
  }
}

}  // namespace

void replace_parameter(torch::nn::Module& module, const std::string& name, at::Tensor value) {
  auto& slots = ParameterSlots::of(module);
  at::Tensor* slot = slots.find(name);
  TORCH_CHECK(slot != nullptr, "replace_parameter: ", module.name(), " has no parameter '", name, "' (it has [",
              join(slots.keys(), ", "), "])");
  if (value.defined()) value.set_requires_grad(slot->defined() && slot->requires_grad());
  *slot = value;
  if (at::Tensor* member = member_holding(module, name)) *member = value;
}

namespace nn_detail {

ResolvedPath resolve_path(torch::nn::Module& root, const std::string& path) { return resolve(root, path); }

bool has_known_member(torch::nn::Module& module, const std::string& name) { return member_holding(module, name) != nullptr; }

void set_parameter_slot(torch::nn::Module& module, const std::string& name, const at::Tensor& value) {
  at::Tensor* slot = ParameterSlots::of(module).find(name);
  at::Tensor* member = member_holding(module, name);
  TORCH_CHECK(slot != nullptr && member != nullptr, "internal: ", module.name(), " has no swappable parameter '", name, "'");
  *slot = value;
  *member = value;
}

void replicate_plain_parameters(torch::nn::Module& module, const DeviceMesh& mesh) {
  const Placements replicate(static_cast<size_t>(mesh.ndim()), Replicate());
  at::NoGradGuard no_grad;
  auto copy_rank0 = [&](const at::Tensor& t) {
    if (t.defined() && !is_shard_tensor(t)) t.copy_(shardtensor::to_local(distribute_tensor(t, mesh, replicate)));
  };
  for (const auto& p : module.named_parameters(/*recurse=*/false)) copy_rank0(p.value());
  for (const auto& b : module.named_buffers(/*recurse=*/false)) copy_rank0(b.value());
}

at::Tensor sharded_parameter(const at::Tensor& param, const DeviceMesh& mesh, const Placement& placement) {
  const at::Tensor detached = param.detach();
  if (is_shard_tensor(detached)) return redistribute(detached, mesh, {placement});
  return distribute_tensor(detached, mesh, {placement});
}

}  // namespace nn_detail

DistributedModuleImpl::DistributedModuleImpl(torch::nn::AnyModule module, DeviceMesh mesh, InputFn input_fn,
                                             OutputFn output_fn, bool register_child)
    : module_(std::move(module)), mesh_(std::move(mesh)), input_fn_(std::move(input_fn)), output_fn_(std::move(output_fn)) {
  if (register_child) register_module("module", module_.ptr());
}

at::Tensor DistributedModuleImpl::forward(const at::Tensor& input) {
  torch::nn::Module& inner = *module_.ptr();
  const at::Tensor x = input_fn_ ? input_fn_(inner, input, mesh_) : input;
  const at::Tensor y = module_.forward(x);
  return output_fn_ ? output_fn_(inner, y, mesh_) : y;
}

DistributedModule distribute_module(torch::nn::AnyModule module, const DeviceMesh& mesh, const PartitionFn& partition_fn,
                                    InputFn input_fn, OutputFn output_fn) {
  TORCH_CHECK(!module.is_empty(), "distribute_module: got an empty module");
  for (const auto& named : module.ptr()->named_modules()) {
    if (partition_fn) partition_fn(named.key(), *named.value(), mesh);
    nn_detail::replicate_plain_parameters(*named.value(), mesh);
  }
  return DistributedModule(std::move(module), mesh, std::move(input_fn), std::move(output_fn));
}

namespace parallel {

at::Tensor ParallelStyle::prepare_input(torch::nn::Module&, const at::Tensor& input, const DeviceMesh&) const { return input; }
at::Tensor ParallelStyle::prepare_output(torch::nn::Module&, const at::Tensor& output, const DeviceMesh&) const { return output; }

namespace {

void check_one_dimensional(const DeviceMesh& mesh) {
  if (mesh.ndim() == 1) return;
  const auto& names = mesh.dim_names();
  TORCH_CHECK(false, "parallelize_module: tensor parallelism takes a 1-D DeviceMesh, got the ", mesh.ndim(), "-D ",
              mesh.to_string(), "; pass its tensor-parallel dim, e.g. mesh.submesh(",
              names.empty() ? std::string("1") : "\"" + names.back() + "\"", ")");
}

}  // namespace

void parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh, const ParallelizePlan& plan) {
  check_one_dimensional(mesh);
  for (const PlanEntry& entry : plan) {
    TORCH_CHECK(entry.style != nullptr, "parallelize_module: the plan entry '", entry.path, "' has no style");
    Resolved resolved = resolve(module, entry.path);
    if (!resolved.misses.empty())
      TORCH_WARN("parallelize_module: plan key '", entry.path, "' could not be resolved: ", join(resolved.misses, "; "),
                 "; skipping it there (as DTensor does)");
    for (const auto& [parent, submodule] : resolved.modules) {
      entry.style->partition(*submodule, mesh);
      wrap_sequential_entry(parent, submodule, mesh, entry.style);
    }
  }
}

DistributedModule parallelize_module(torch::nn::AnyModule module, const DeviceMesh& mesh,
                                     std::shared_ptr<const ParallelStyle> style) {
  check_one_dimensional(mesh);
  TORCH_CHECK(!module.is_empty(), "parallelize_module: got an empty module");
  TORCH_CHECK(style != nullptr, "parallelize_module: got no style");
  style->partition(*module.ptr(), mesh);
  return called_through(std::move(module), mesh, style, /*register_child=*/true);
}

}  // namespace parallel
}  // namespace shardtensor
