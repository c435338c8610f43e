// DTensor's module API for torch::nn modules: distribute_module, parallelize_module and the
// Colwise / Rowwise / Sequence parallel styles, under the names and meanings of
// torch.distributed.tensor(.parallel) and of shardtensor.parallel in Python, on any sizes: a
// mesh that does not divide a width, a vocabulary or a sequence gives uneven (or empty) pieces.
//
// A C++ module's forward has no hooks, so a style acts in two places:
//  * On the parameters, wherever the module sits: parallelize_module(*model, mesh, plan) splits
//    each planned module's parameters in place, and the model's own forward then computes on
//    them. Layouts flow through the operators: a plain input counts as Replicate (implicit
//    replication), a Colwise Linear returns a Shard(-1) ShardTensor, a Rowwise one a pending
//    sum that is reduced where it is next needed whole.
//  * On the call: a style's input and output conversions (input_layouts, output_layouts,
//    use_local_output) run where the module is called through shardtensor: a Sequential entry
//    that the plan names (its call is wrapped, its registered child and parameter names stay),
//    or the DistributedModule that distribute_module and parallelize_module(module, mesh, style)
//    return.
//
//   struct MlpImpl : torch::nn::Module {
//     MlpImpl() : up(register_module("up", torch::nn::Linear(8, 30))),
//                 down(register_module("down", torch::nn::Linear(30, 8))) {}
//     at::Tensor forward(const at::Tensor& x) { return down(torch::relu(up(x))); }
//     torch::nn::Linear up, down;
//   };
//   TORCH_MODULE(Mlp);
//
//   Mlp mlp;
//   namespace par = shardtensor::parallel;
//   par::parallelize_module(*mlp, mesh, {{"up", par::ColwiseParallel()}, {"down", par::RowwiseParallel()}});
//   at::Tensor y = mlp(x);  // x: the whole input on every rank; y: one process's value, replicated
//
// fully_shard (namespace fsdp, below) adds sharded data parallelism on another mesh dim.
//
// Parameters a style leaves whole stay plain tensors, with rank 0's values copied into them: they
// count as Replicate beside ShardTensors, and their gradients come back plain, equal to one
// process's (dispatch.h, set_implicit_replication).
//
// Every call here is collective over the mesh: all its ranks make it, in the same order.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "shardtensor/device_mesh.h"
#include "shardtensor/placement.h"

namespace shardtensor {

// distribute_module's three functions, as DTensor's Python API takes them. partition_fn runs on
// every submodule (the module itself named ""), input_fn on the module's input before its forward,
// output_fn on what the forward returns.
using PartitionFn = std::function<void(const std::string& name, torch::nn::Module& module, const DeviceMesh& mesh)>;
using InputFn = std::function<at::Tensor(torch::nn::Module& module, const at::Tensor& input, const DeviceMesh& mesh)>;
using OutputFn = std::function<at::Tensor(torch::nn::Module& module, const at::Tensor& output, const DeviceMesh& mesh)>;

// A module called through its input and output functions: forward(x) is
// output_fn(module(input_fn(x))). The wrapped module is its child "module" (so its parameters are
// "module.weight"...), except inside a Sequential that parallelize_module rewired, where the
// Sequential keeps the module as its registered child and the wrapper only makes the call.
class DistributedModuleImpl : public torch::nn::Module {
 public:
  DistributedModuleImpl(torch::nn::AnyModule module, DeviceMesh mesh, InputFn input_fn, OutputFn output_fn,
                        bool register_child = true);

  at::Tensor forward(const at::Tensor& input);

  torch::nn::Module& module() { return *module_.ptr(); }
  const DeviceMesh& device_mesh() const { return mesh_; }

 private:
  torch::nn::AnyModule module_;
  DeviceMesh mesh_;
  InputFn input_fn_;
  OutputFn output_fn_;
};
TORCH_MODULE(DistributedModule);

// DTensor's distribute_module: partition_fn(name, submodule, mesh) runs on every submodule, in
// named_modules() order, and splits what it wants in place (replace_parameter below); every
// parameter it leaves plain stays plain, with rank 0's values. Returns the module called through
// input_fn and output_fn (either may be empty).
DistributedModule distribute_module(torch::nn::AnyModule module, const DeviceMesh& mesh,
                                    const PartitionFn& partition_fn = nullptr, InputFn input_fn = nullptr,
                                    OutputFn output_fn = nullptr);

template <typename ModuleType>  // a ModuleHolder (torch::nn::Linear) or a std::shared_ptr to a module
DistributedModule distribute_module(ModuleType module, const DeviceMesh& mesh, const PartitionFn& partition_fn = nullptr,
                                    InputFn input_fn = nullptr, OutputFn output_fn = nullptr) {
  return distribute_module(torch::nn::AnyModule(std::move(module)), mesh, partition_fn, std::move(input_fn),
                           std::move(output_fn));
}

// Puts `value` in place of `module`'s parameter `name` (keeping its requires_grad), under the same
// name, so parameters(), named_parameters() and optimizers see the new tensor. torch::nn's own
// modules (Linear, Embedding, LayerNorm, Conv1d-3d, BatchNorm1d-3d, GroupNorm) also read the new
// tensor in forward; a module of yours that keeps its parameter in a member must update that
// member too. Raises when the module has no parameter `name`.
void replace_parameter(torch::nn::Module& module, const std::string& name, at::Tensor value);

namespace parallel {

// How parallelize_module parallelizes one module: its parameters (partition) and its call
// (prepare_input, prepare_output; the identity unless a style says otherwise).
class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  virtual void partition(torch::nn::Module& module, const DeviceMesh& mesh) const = 0;
  virtual at::Tensor prepare_input(torch::nn::Module& module, const at::Tensor& input, const DeviceMesh& mesh) const;
  virtual at::Tensor prepare_output(torch::nn::Module& module, const at::Tensor& output, const DeviceMesh& mesh) const;
  virtual std::string to_string() const = 0;
};

// Splits a Linear's output features (weight and bias Shard(0)) or an Embedding's embedding dim
// (weight Shard(1)). Input: input_layouts (default Replicate), moved to Replicate. Output:
// Shard(-1), moved to output_layouts (default Shard(-1)); the local piece when use_local_output
// (default true).
class ColwiseParallel : public ParallelStyle {
 public:
  ColwiseParallel& input_layouts(Placement layout);
  ColwiseParallel& output_layouts(Placement layout);
  ColwiseParallel& use_local_output(bool local);

  void partition(torch::nn::Module& module, const DeviceMesh& mesh) const override;
  at::Tensor prepare_input(torch::nn::Module& module, const at::Tensor& input, const DeviceMesh& mesh) const override;
  at::Tensor prepare_output(torch::nn::Module& module, const at::Tensor& output, const DeviceMesh& mesh) const override;
  std::string to_string() const override;

 private:
  Placement input_layout_ = Replicate(), output_layout_ = Shard(-1);
  bool use_local_output_ = true;
};

// Splits a Linear's input features (weight Shard(1), bias Replicate) or an Embedding's vocabulary
// (weight Shard(0): each rank looks up its own rows into a pending sum). Input: input_layouts
// (default Shard(-1), a plain input being this rank's piece, sized as the weight's), moved to
// Shard(-1) for a Linear and Replicate for an Embedding. Output: a pending sum, moved to
// output_layouts (default Replicate: one all-reduce; Shard(d): one reduce-scatter); the local
// piece when use_local_output (default true).
class RowwiseParallel : public ParallelStyle {
 public:
  RowwiseParallel& input_layouts(Placement layout);
  RowwiseParallel& output_layouts(Placement layout);
  RowwiseParallel& use_local_output(bool local);

  void partition(torch::nn::Module& module, const DeviceMesh& mesh) const override;
  at::Tensor prepare_input(torch::nn::Module& module, const at::Tensor& input, const DeviceMesh& mesh) const override;
  at::Tensor prepare_output(torch::nn::Module& module, const at::Tensor& output, const DeviceMesh& mesh) const override;
  std::string to_string() const override;

 private:
  Placement input_layout_ = Shard(-1), output_layout_ = Replicate();
  bool use_local_output_ = true;
};

// Runs a module that computes position by position (LayerNorm, Dropout, an RMSNorm of yours) on
// its input split along sequence_dim (default 1; any split: 13 positions over 4 ranks is 4, 4, 4,
// 1). Its parameters stay plain, with rank 0's values. Input: a plain tensor is this rank's piece
// of the sequence (the lengths are gathered once per call), a ShardTensor is moved to
// Shard(sequence_dim). Output: as computed; the local piece when use_local_output (default false).
class SequenceParallel : public ParallelStyle {
 public:
  explicit SequenceParallel(int64_t sequence_dim = 1) : sequence_dim_(sequence_dim) {}
  SequenceParallel& use_local_output(bool local);

  void partition(torch::nn::Module& module, const DeviceMesh& mesh) const override;
  at::Tensor prepare_input(torch::nn::Module& module, const at::Tensor& input, const DeviceMesh& mesh) const override;
  at::Tensor prepare_output(torch::nn::Module& module, const at::Tensor& output, const DeviceMesh& mesh) const override;
  std::string to_string() const override;

 private:
  int64_t sequence_dim_;
  bool use_local_output_ = false;
};

// One entry of a plan: a module path and the style for the modules it names. A path is dotted
// ("layers.0.mlp.up"), each part a glob ("layers.*.attention"); "" names the root.
struct PlanEntry {
  template <typename Style, typename = std::enable_if_t<std::is_base_of_v<ParallelStyle, Style>>>
  PlanEntry(std::string module_path, Style s) : path(std::move(module_path)), style(std::make_shared<Style>(std::move(s))) {}

  std::string path;
  std::shared_ptr<const ParallelStyle> style;
};
using ParallelizePlan = std::vector<PlanEntry>;

// Applies each entry's style to the submodules its path names: their parameters are split in
// place, and where a named module is an entry of a Sequential, that entry's call is wrapped with
// the style's input and output conversions. A path that names nothing is skipped with a warning
// that names the children that were there (as DTensor does). The mesh must be 1-D (pass
// mesh.submesh("tp") of a larger one).
void parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh, const ParallelizePlan& plan);

// One module under one style: partitioned, and returned called through the style's conversions.
DistributedModule parallelize_module(torch::nn::AnyModule module, const DeviceMesh& mesh,
                                     std::shared_ptr<const ParallelStyle> style);

template <typename ModuleType, typename Style, typename = std::enable_if_t<std::is_base_of_v<ParallelStyle, Style>>>
DistributedModule parallelize_module(ModuleType module, const DeviceMesh& mesh, Style style) {
  // ModuleType: a ModuleHolder (torch::nn::Linear) or a std::shared_ptr to a module.
  return parallelize_module(torch::nn::AnyModule(std::move(module)), mesh, std::make_shared<Style>(std::move(style)));
}

}  // namespace parallel

// Sharded data parallelism: FSDP2's fully_shard for torch::nn modules, with the meanings of
// shardtensor.fsdp.fully_shard in Python. Each parameter of the module becomes a ShardTensor
// split on dim 0 over the data-parallel mesh (nested inside what tensor parallelism gave it),
// on any sizes, unevenly, without padding; a call of the module all-gathers them for its
// forward, and backward reduce-scatters each gradient, averaged over the data-parallel ranks.
// Between calls parameters(), optimizers and checkpoints see the sharded ShardTensors.
//
//   namespace fsdp = shardtensor::fsdp;
//   torch::nn::Sequential net(Block(), Block(), torch::nn::Linear(64, 10));
//   par::parallelize_module(*net, mesh.submesh("tp"), plan);   // optional, before fully_shard
//   fsdp::fully_shard(*net, mesh.submesh("dp"), "0");           // each block, in place
//   fsdp::fully_shard(*net, mesh.submesh("dp"), "1");
//   fsdp::FSDPModule model = fsdp::fully_shard(net, mesh.submesh("dp"));  // the root: the rest
//   at::Tensor loss = model(x).pow(2).mean();  // x: this data-parallel rank's batch
//
// As with parallelize_module, a C++ forward has no hooks, so the gathers happen where the module
// is called through shardtensor: the FSDPModule fully_shard returns, or a Sequential entry a
// path names (its registered child and parameter names stay).
namespace fsdp {

// FSDP2's MixedPrecisionPolicy: the forward computes in param_dtype (the gather moves it),
// gradients are reduced in reduce_dtype (default: param_dtype), the output is cast to
// output_dtype; the sharded parameters keep their dtype, which optimizers step.
struct MixedPrecisionPolicy {
  std::optional<c10::ScalarType> param_dtype;
  std::optional<c10::ScalarType> reduce_dtype;
  std::optional<c10::ScalarType> output_dtype;
};

struct FullyShardOptions {
  // true: the unsharded parameters are not kept from the forward to the backward: their memory
  // is freed when the forward returns and gathered again when the backward of the module's
  // output begins (FSDP2 frees and refills the same storage, and so does this). So the module's
  // backward must start from its output, as it does for a module whose forward returns it.
  bool reshard_after_forward = true;
  MixedPrecisionPolicy mp_policy;
};

// A module called through fully_shard's gathers: forward(x) gathers the parameters it manages,
// runs the module, and puts the sharded parameters back. The wrapped module is its child
// "module", except inside a Sequential that fully_shard(root, mesh, path) rewired.
class FSDPModuleImpl : public torch::nn::Module {
 public:
  struct State;
  using Call = std::function<at::Tensor(const at::Tensor&)>;
  FSDPModuleImpl(std::shared_ptr<torch::nn::Module> module, Call call, std::shared_ptr<State> state, bool register_child = true);
  at::Tensor forward(const at::Tensor& input);
  torch::nn::Module& module() { return *module_; }
  void set_reshard_after_forward(bool reshard_after_forward);

 private:
  std::shared_ptr<torch::nn::Module> module_;
  Call call_;  // the module's forward
  std::shared_ptr<State> state_;
};
TORCH_MODULE(FSDPModule);

// Shards every parameter of `module` that no earlier fully_shard call took: over `mesh`, 1-D
// (FSDP: Shard(0)) or 2-D (HSDP: (Replicate(), Shard(0))). A parameter that is a ShardTensor
// already (tensor parallelism) must lie on another dim of the mesh `mesh` is a dim of
// (mesh.submesh("tp") beside mesh.submesh("dp")). Returns the module called through the gathers.
FSDPModule fully_shard(torch::nn::AnyModule module, const DeviceMesh& mesh, FullyShardOptions options = {});
// A Sequential (which AnyModule cannot hold: its forward is a template), called as forward(x).
FSDPModule fully_shard(torch::nn::Sequential module, const DeviceMesh& mesh, FullyShardOptions options = {});
template <typename ModuleType>  // a ModuleHolder (torch::nn::Linear) or a std::shared_ptr to a module
FSDPModule fully_shard(ModuleType module, const DeviceMesh& mesh, FullyShardOptions options = {}) {
  return fully_shard(torch::nn::AnyModule(std::move(module)), mesh, std::move(options));
}
// The same for each entry of a Sequential that `path` names in `root` (a dotted path of globs,
// as parallelize_module's plans), in place: the Sequential calls the entry through its gathers.
// A path that names no Sequential entry raises.
void fully_shard(torch::nn::Module& root, const DeviceMesh& mesh, const std::string& path, FullyShardOptions options = {});

}  // namespace fsdp
}  // namespace shardtensor
