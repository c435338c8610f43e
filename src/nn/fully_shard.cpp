// fully_shard for torch::nn modules (shardtensor/parallel.h, namespace fsdp): the C++ side of
// python/shardtensor/fsdp. Each managed parameter is a ShardTensor on the mesh of its own dims
// (tensor parallelism's, if any) followed by the data-parallel ones, Shard(0) on the last, so
// the data-parallel piece nests inside the tensor-parallel one; the forward's all-gather and the
// backward's reduce-scatter are redistributes of it, joined by one backward function per
// parameter.
#include <c10/core/StorageImpl.h>
#include <torch/nn/modules/container/sequential.h>

#include <algorithm>
#include <mutex>
#include <utility>

#include "autograd/grad_fn.h"
#include "nn/module_parameters.h"
#include "shardtensor/parallel.h"
#include "shardtensor/redistribute.h"
#include "shardtensor/shard_tensor.h"
#include "util/strings.h"

namespace shardtensor::fsdp {

// One managed parameter.
struct Param {
  std::string fqn;
  std::vector<std::pair<torch::nn::Module*, std::string>> owners;  // (module, attribute): several for tied weights
  at::Tensor sharded;  // the leaf ShardTensor the owners hold between calls
  DeviceMesh mesh;     // the parameter's dims, then the data-parallel ones
  Placements placements, gathered_placements, grad_placements;
  std::optional<DeviceMesh> unsharded_mesh;  // tensor parallelism's mesh, for a ShardTensor parameter
  Placements unsharded_placements;
  ShardSizes unsharded_sizes, sharded_sizes;
};

// A parameter as one forward gathered it, while that forward's backward may read it: with
// reshard_after_forward its storage is emptied when the forward returns and refilled when the
// backward begins (each forward its own, so two forwards before one backward each get theirs).
struct Gathered {
  const Param* param;
  at::Tensor local;
  size_t bytes = 0;
  bool emptied = false;
};
using GatheredSet = std::vector<Gathered>;

struct FSDPModuleImpl::State {
  std::vector<Param> params;  // never resized after construction: backward functions point into it
  FullyShardOptions options;
};

namespace {

// Every parameter some fully_shard call manages, so that an outer call leaves it alone.
struct Managed {
  std::mutex mutex;
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> params;

  void add(const at::Tensor& t) {
    std::lock_guard<std::mutex> lock(mutex);
    params.erase(std::remove_if(params.begin(), params.end(), [](const auto& w) { return w.expired(); }), params.end());
    params.emplace_back(t.getIntrusivePtr());
  }
  bool contains(const at::Tensor& t) {
    std::lock_guard<std::mutex> lock(mutex);
    return std::any_of(params.begin(), params.end(), [&](const auto& w) { return w._unsafe_get_target() == t.unsafeGetTensorImpl() && !w.expired(); });
  }
};

Managed& managed() {
  static Managed m;
  return m;
}

// (the mesh `mesh` was sliced from, `mesh`'s dims in it).
std::pair<DeviceMesh, std::vector<int64_t>> root_and_dims(const DeviceMesh& mesh) {
  if (auto parent = mesh.parent()) return {parent->first, {parent->second}};
  std::vector<int64_t> dims(static_cast<size_t>(mesh.ndim()));
  for (size_t d = 0; d < dims.size(); ++d) dims[d] = static_cast<int64_t>(d);
  return {mesh, dims};
}

std::string dim_names_of(const DeviceMesh& root, const std::vector<int64_t>& dims) {
  std::vector<std::string> names;
  for (int64_t d : dims) names.push_back(root.dim_names().empty() ? std::to_string(d) : root.dim_names()[d]);
  return "[" + join(names, ", ") + "]";
}

std::optional<ShardSizes> sizes_or_none(const ShardSizes& sizes) {
  return sizes.empty() ? std::nullopt : std::optional<ShardSizes>(sizes);
}

Param make_param(std::string fqn, std::vector<std::pair<torch::nn::Module*, std::string>> owners, const at::Tensor& param,
                 const DeviceMesh& dp_mesh) {
  Param p{std::move(fqn), std::move(owners), at::Tensor(), dp_mesh};
  Placements dp(static_cast<size_t>(dp_mesh.ndim() - 1), Replicate());
  dp.push_back(Shard(0));
  const auto [dp_root, dp_dims] = root_and_dims(dp_mesh);
  Placements lead;
  if (is_shard_tensor(param)) {
    const ShardTensorSpec& layout = spec(param);
    const auto [root, dims] = root_and_dims(layout.mesh());
    TORCH_CHECK_VALUE(root.same_groups(dp_root), "fully_shard: parameter '", p.fqn, "' is a ShardTensor on ",
                      layout.mesh().to_string(), ", and the data-parallel mesh ", dp_mesh.to_string(),
                      " is not a dim of the same mesh. Build one mesh with both dims and pass mesh.submesh(\"tp\") to "
                      "parallelize_module and mesh.submesh(\"dp\") to fully_shard");
    for (int64_t d : dims)
      TORCH_CHECK_VALUE(std::find(dp_dims.begin(), dp_dims.end(), d) == dp_dims.end(), "fully_shard: parameter '", p.fqn,
                        "' is already laid out over the data-parallel mesh dims ", dim_names_of(dp_root, dp_dims),
                        " (placements ", to_string(layout.placements()), " on ", layout.mesh().to_string(),
                        "); fully_shard shards parameters over mesh dims they are not laid out on");
    std::vector<int64_t> all = dims;
    all.insert(all.end(), dp_dims.begin(), dp_dims.end());
    p.mesh = root.of_dims(all);
    p.unsharded_mesh = layout.mesh();
    p.unsharded_placements = layout.placements();
    p.unsharded_sizes = layout.shard_sizes();
    lead = layout.placements();
  }
  p.placements = p.gathered_placements = p.grad_placements = lead;
  p.placements.insert(p.placements.end(), dp.begin(), dp.end());
  p.gathered_placements.insert(p.gathered_placements.end(), dp.size(), Replicate());
  p.grad_placements.insert(p.grad_placements.end(), dp.size(), Partial(ReduceOp::Avg));
  at::NoGradGuard no_grad;
  const at::Tensor local = is_shard_tensor(param) ? to_local(param.detach()) : param.detach();
  // Every rank holds its tensor-parallel piece whole: each keeps its part, no message.
  const at::Tensor whole = from_local(local, p.mesh, p.gathered_placements, ShardSizing::trusted(p.unsharded_sizes));
  p.sharded = redistribute(whole, p.mesh, p.placements).detach();
  p.sharded.set_requires_grad(param.requires_grad());
  p.sharded_sizes = spec(p.sharded).shard_sizes();
  return p;
}

// The parameters of `module`'s subtree no fully_shard call manages yet, each with its owners.
std::vector<Param> take_parameters(torch::nn::Module& module, const DeviceMesh& mesh) {
  struct Found {
    at::Tensor tensor;
    std::string fqn;
    std::vector<std::pair<torch::nn::Module*, std::string>> owners;
  };
  std::vector<Found> found;
  for (const auto& named : module.named_modules()) {
    torch::nn::Module& owner = *named.value();
    for (const auto& p : owner.named_parameters(/*recurse=*/false)) {
      const at::Tensor& t = p.value();
      if (!t.defined() || managed().contains(t)) continue;
      const std::string fqn = named.key().empty() ? p.key() : named.key() + "." + p.key();
      TORCH_CHECK_VALUE(nn_detail::has_known_member(owner, p.key()), "fully_shard: parameter '", fqn, "' belongs to ",
                        owner.name(), ", whose forward reads it through a member shardtensor cannot swap. A C++ module has no "
                        "hooks: fully_shard swaps the parameters of torch::nn's own modules (Linear, Embedding, LayerNorm, "
                        "GroupNorm, Conv1d-3d, BatchNorm1d-3d); build the module from those, or leave this one out of the "
                        "module given to fully_shard");
      TORCH_CHECK_VALUE(t.dim() > 0, "fully_shard: parameter '", fqn, "' is a scalar; FSDP shards dim 0 (make it a 1-D "
                        "tensor of one element)");
      auto tied = std::find_if(found.begin(), found.end(), [&](const Found& f) { return f.tensor.is_same(t); });
      if (tied != found.end()) tied->owners.emplace_back(&owner, p.key());
      else found.push_back({t, fqn, {{&owner, p.key()}}});
    }
  }
  std::vector<Param> params;
  params.reserve(found.size());
  for (Found& f : found) params.push_back(make_param(std::move(f.fqn), std::move(f.owners), f.tensor, mesh));
  for (const Param& p : params) {
    for (const auto& [owner, name] : p.owners) nn_detail::set_parameter_slot(*owner, name, p.sharded);
    managed().add(p.sharded);
  }
  return params;
}

std::shared_ptr<FSDPModuleImpl::State> make_state(torch::nn::Module& module, const DeviceMesh& mesh, FullyShardOptions options) {
  TORCH_CHECK_VALUE(mesh.ndim() == 1 || mesh.ndim() == 2, "fully_shard: the mesh must be 1-D (FSDP) or 2-D (HSDP: "
                    "(\"replicate\", \"shard\")), got ", mesh.to_string());
  TORCH_CHECK_VALUE(mesh.includes_this_rank(), "fully_shard: the mesh ", mesh.to_string(), " does not include this rank (",
                    mesh.rank(), "); every rank that calls fully_shard must be on the data-parallel mesh");
  auto state = std::make_shared<FSDPModuleImpl::State>();
  state->options = std::move(options);
  state->params = take_parameters(module, mesh);
  return state;
}

// This rank's unsharded piece of the parameter, in param_dtype, in a storage of its own.
at::Tensor gather_local(const Param& p, const MixedPrecisionPolicy& policy) {
  at::NoGradGuard no_grad;
  at::Tensor sharded = p.sharded.detach();
  if (policy.param_dtype && *policy.param_dtype != sharded.scalar_type()) sharded = sharded.to(*policy.param_dtype);  // half the bytes
  at::Tensor local = to_local(redistribute(sharded, p.mesh, p.gathered_placements));
  const bool own_storage = local.is_contiguous() && local.storage_offset() == 0 &&
                           local.storage().nbytes() == static_cast<size_t>(local.numel()) * local.element_size() &&
                           local.data_ptr() != to_local(p.sharded).data_ptr();  // one data-parallel rank: no copy was made
  return own_storage ? local : local.clone();
}

at::Tensor unsharded_from(const Param& p, const at::Tensor& local) {
  if (!p.unsharded_mesh) return local;
  return from_local(local, *p.unsharded_mesh, p.unsharded_placements, ShardSizing::trusted(p.unsharded_sizes));
}

// Frees the gathered piece's memory; tensors autograd saved of it keep its storage, now empty.
void empty_storage(Gathered& g) {
  c10::StorageImpl* storage = g.local.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(0);
  g.emptied = true;
}

// Gathers the piece again into its emptied storage, so the saved tensors read it.
void refill_storage(Gathered& g, const MixedPrecisionPolicy& policy) {
  if (!g.emptied) return;
  at::Tensor fresh = gather_local(*g.param, policy);
  TORCH_INTERNAL_ASSERT(fresh.storage().nbytes() == g.bytes, "fully_shard: ", g.param->fqn, " gathered again to ",
                        fresh.storage().nbytes(), " bytes, not ", g.bytes);
  c10::StorageImpl* from = fresh.storage().unsafeGetStorageImpl();
  c10::StorageImpl* into = g.local.storage().unsafeGetStorageImpl();
  into->set_data_ptr_noswap(from->set_data_ptr(c10::DataPtr(nullptr, from->device())));
  into->set_nbytes(g.bytes);
  g.emptied = false;
}

// This rank's gradient term of the unsharded parameter, averaged over the data-parallel ranks
// into the sharded layout, in reduce_dtype, then the parameter's dtype.
at::Tensor reduce(const Param& p, const FullyShardOptions& options, at::Tensor grad) {
  at::NoGradGuard no_grad;
  if (is_shard_tensor(grad)) {
    if (p.unsharded_mesh) {
      if (spec(grad).placements() != p.unsharded_placements)  // e.g. Partial over "tp"
        grad = redistribute(grad, *p.unsharded_mesh, p.unsharded_placements, sizes_or_none(p.unsharded_sizes));
    } else {  // a plain weight used on ShardTensor activations (PhysicsNeMo's recipe)
      grad = redistribute(grad, spec(grad).mesh(), Placements(static_cast<size_t>(spec(grad).mesh().ndim()), Replicate()));
    }
    grad = to_local(grad);
  }
  const MixedPrecisionPolicy& policy = options.mp_policy;  // FSDP2's default: reduce in param_dtype
  grad = grad.to(policy.reduce_dtype.value_or(policy.param_dtype.value_or(p.sharded.scalar_type()))).contiguous();
  const at::Tensor terms = from_local(grad, p.mesh, p.grad_placements, ShardSizing::trusted(p.unsharded_sizes));
  return redistribute(terms, p.mesh, p.placements, sizes_or_none(p.sharded_sizes)).to(p.sharded.scalar_type());
}

void put_sharded_back(FSDPModuleImpl::State& state) {
  for (Param& p : state.params)
    for (const auto& [owner, name] : p.owners) nn_detail::set_parameter_slot(*owner, name, p.sharded);
}

at::Tensor cast_floating(const at::Tensor& t, const std::optional<c10::ScalarType>& dtype) {
  return dtype && t.is_floating_point() && t.scalar_type() != *dtype ? t.to(*dtype) : t;
}

// The module an entry of a Sequential calls: itself, or the module inside shardtensor's wrappers.
torch::nn::Module* called_module(torch::nn::AnyModule& entry) {
  torch::nn::Module* m = entry.ptr().get();
  while (true) {
    if (auto* d = dynamic_cast<DistributedModuleImpl*>(m)) m = &d->module();
    else if (auto* f = dynamic_cast<FSDPModuleImpl*>(m)) m = &f->module();
    else return m;
  }
}

}  // namespace

FSDPModuleImpl::FSDPModuleImpl(std::shared_ptr<torch::nn::Module> module, Call call, std::shared_ptr<State> state,
                               bool register_child)
    : module_(std::move(module)), call_(std::move(call)), state_(std::move(state)) {
  if (register_child) register_module("module", module_);
}

void FSDPModuleImpl::set_reshard_after_forward(bool reshard_after_forward) {
  state_->options.reshard_after_forward = reshard_after_forward;
}

at::Tensor FSDPModuleImpl::forward(const at::Tensor& input) {
  State& state = *state_;
  const MixedPrecisionPolicy& policy = state.options.mp_policy;
  const bool grad = at::GradMode::is_enabled();
  auto gathered = std::make_shared<GatheredSet>();
  gathered->reserve(state.params.size());
  for (const Param& p : state.params) {
    at::Tensor local = gather_local(p, policy);
    gathered->push_back({&p, local, local.storage().nbytes()});
    at::Tensor unsharded = unsharded_from(p, local);
    if (grad && p.sharded.requires_grad()) {
      // Weakly: the gathered piece carries this function in its history (a plain parameter's
      // piece is the tensor the module reads), so a strong reference would be a cycle.
      std::weak_ptr<GatheredSet> weak = gathered;
      const size_t i = gathered->size() - 1;
      std::shared_ptr<State> keep = state_;
      unsharded = attach_grad_fn(unsharded, p.sharded, [keep, weak, i, param = &p](const at::Tensor& g) {
        at::Tensor reduced = reduce(*param, keep->options, g);
        if (auto set = weak.lock()) (*set)[i].local = at::Tensor();  // every use of it in this backward has run
        return reduced;
      }, "FSDPAllGatherBackward");
    }
    for (const auto& [owner, name] : p.owners) nn_detail::set_parameter_slot(*owner, name, unsharded);
  }
  at::Tensor output;
  try {
    output = call_(cast_floating(input, policy.param_dtype));
  } catch (...) {
    put_sharded_back(state);
    throw;
  }
  put_sharded_back(state);
  if (grad && output.requires_grad() && state.options.reshard_after_forward) {
    for (Gathered& g : *gathered) empty_storage(g);
    // FSDP2's pre-backward point: the output's gradient arrives before any of the module's own
    // backward runs.
    std::shared_ptr<State> keep = state_;
    output.register_hook([keep, gathered](const at::Tensor&) {
      for (Gathered& g : *gathered)
        if (g.local.defined()) refill_storage(g, keep->options.mp_policy);
    });
  }
  return cast_floating(output, policy.output_dtype);
}

namespace {

FSDPModule wrapped(torch::nn::AnyModule module, std::shared_ptr<FSDPModuleImpl::State> state, bool register_child) {
  std::shared_ptr<torch::nn::Module> ptr = module.ptr();
  auto call = [module = std::move(module)](const at::Tensor& x) mutable { return module.forward(x); };
  return FSDPModule(std::move(ptr), std::move(call), std::move(state), register_child);
}

}  // namespace

FSDPModule fully_shard(torch::nn::AnyModule module, const DeviceMesh& mesh, FullyShardOptions options) {
  TORCH_CHECK_VALUE(!module.is_empty(), "fully_shard: got an empty module");
  auto state = make_state(*module.ptr(), mesh, std::move(options));
  return wrapped(std::move(module), std::move(state), /*register_child=*/true);
}

FSDPModule fully_shard(torch::nn::Sequential module, const DeviceMesh& mesh, FullyShardOptions options) {
  TORCH_CHECK_VALUE(!module.is_empty(), "fully_shard: got an empty module");
  auto state = make_state(*module, mesh, std::move(options));
  auto call = [module](const at::Tensor& x) mutable { return module->forward(x); };
  return FSDPModule(module.ptr(), std::move(call), std::move(state));
}

void fully_shard(torch::nn::Module& root, const DeviceMesh& mesh, const std::string& path, FullyShardOptions options) {
  nn_detail::ResolvedPath resolved = nn_detail::resolve_path(root, path);
  TORCH_CHECK_VALUE(resolved.misses.empty() && !resolved.modules.empty(), "fully_shard: the path '", path, "' names no module of ",
                    root.name(), ": ", join(resolved.misses, "; "));
  for (const auto& [parent, module] : resolved.modules) {
    auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(parent);
    TORCH_CHECK_VALUE(sequential != nullptr, "fully_shard: the path '", path, "' names ", module->name(), " inside ",
                      parent ? parent->name() : std::string("nothing (the root)"), ", not an entry of a Sequential; a C++ ",
                      "forward has no hooks, so fully_shard(root, mesh, path) wraps Sequential entries only. Call "
                      "fully_shard(module, mesh) and call the FSDPModule it returns instead");
    for (auto entry = sequential->begin(); entry != sequential->end(); ++entry) {
      if (called_module(*entry) != module.get()) continue;
      auto state = make_state(*module, mesh, options);
      *entry = torch::nn::AnyModule(wrapped(std::move(*entry), std::move(state), /*register_child=*/false));
    }
  }
}

}  // namespace shardtensor::fsdp
