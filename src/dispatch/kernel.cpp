// The ShardTensor kernel: one boxed function for every operator.
//
// 1. propagate: look up (or build) the propagation of this call: each input's target layout
//    with its plan, each output's layout (see propagation.h);
// 2. unwrap every ShardTensor argument to its local piece, redistributing inputs whose layout
//    differs from the target;
// 3. run the operator (or the rule's local kernel) on the local pieces with the autograd and
//    autocast keys excluded, so local tensors record no second graph and are never cast;
// 4. wrap each output with its spec; arguments the op writes (self of add_, out= tensors)
//    come back as the caller's own wrappers, updated, and written inputs that ran moved
//    (batch norm's running statistics) get the moved copy written back.
#include "dispatch/kernel.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <iostream>
#include <numeric>
#include <tuple>

#include "comm/comm_debug.h"
#include "dispatch/dispatch_state.h"
#include "dispatch/out_variant.h"
#include "dispatch/outside_mesh.h"
#include "dispatch/relayout.h"
#include "dispatch/propagation.h"
#include "dispatch/shard_tensor_impl.h"
#include "rules/helpers.h"
#include "rules/kernel_plan.h"
#include "redistribute/executor.h"
#include "shardtensor/log.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

// The spec of an output: global shape from the local result (sharded dims add up their
// table), dtype from the local result; the local piece must have the size the table promises.
ShardTensorSpec output_spec(const Propagation& p, const OutputLayout& layout, const at::Tensor& local) {
  std::vector<int64_t> global = local.sizes().vec();
  for (const DimShardSizes& table : layout.sizes)
    global[table.tensor_dim] = std::accumulate(table.sizes.begin(), table.sizes.end(), int64_t{0});
  ShardTensorSpec spec(p.meta.mesh(), layout.placements, global, local.scalar_type(), layout.sizes);
  TORCH_INTERNAL_ASSERT(spec.shardings().size() == layout.sizes.size(), p.meta.name,
                        ": the rule shards an output dim without giving its shard sizes: ", spec);
  // A rule that promises another piece than the operator computed is a bug in the rule: wrapping
  // the piece anyway would give a tensor whose layout lies, so the call raises, naming the rule.
  TORCH_CHECK(local.sizes().equals(spec.local_shape()), p.meta.name, ": its sharding rule's output layout ", spec,
              " gives this rank a piece of shape [", join(spec.local_shape(), ", "), "] but the operator computed one of shape [",
              join(local.sizes().vec(), ", "), "]. This is a bug in the rule for ", p.meta.name,
              "; until it is fixed, compute this operator on full_tensor() or to_local() pieces.");
  return spec;
}

// `local` is this rank's piece, or outside the mesh the op's meta result of global shape.
// `global_strides`: the output's, where the op permutes dims (see permuted_global_strides).
at::Tensor wrap_output(Propagation& p, size_t index, const at::Tensor& local, std::vector<int64_t> global_strides = {}) {
  const DeviceMesh& mesh = p.meta.mesh();
  const bool outside = local.is_meta() && !mesh.includes_this_rank();
  if (p.fallback) {
    ShardTensorSpec spec(mesh, Placements(mesh.ndim(), Replicate()), local.sizes().vec(), local.scalar_type());
    at::Tensor piece = outside ? piece_outside_mesh(spec, local.options().device(mesh.device())) : local;
    return make_shard_tensor(std::move(piece), std::move(spec), std::move(global_strides));
  }
  TORCH_INTERNAL_ASSERT(index < p.result.outputs.size(), p.meta.name, ": the rule gave ", p.result.outputs.size(),
                        " output layouts for more tensor outputs");
  if (outside) {
    at::Tensor wrapper = wrap_output_outside_mesh(p, p.result.outputs[index], local);
    if (!global_strides.empty()) shard_tensor_impl(wrapper)->set_global_strides(std::move(global_strides));
    return wrapper;
  }
  std::optional<CachedOutput>& cached = p.output_specs[index];
  if (!cached || cached->spec.dtype() != local.scalar_type() || !local.sizes().equals(cached->local_shape)) {
    ShardTensorSpec spec = output_spec(p, p.result.outputs[index], local);
    cached = CachedOutput{spec, spec.local_shape()};
  }
  return make_shard_tensor(local, cached->spec, std::move(global_strides));
}

// Self of an in-place op ran as `target` (moved from its own layout): bring the result home,
// into self's own local piece, so that self keeps its placements and its views see the new
// values. Where the op resolved a Partial of self, the result is Replicate there; it becomes
// a pending reduction again without communication: every rank keeps the value for avg, max
// and min, and only coordinate 0 does for sum (the others hold zero) and product (one).
void write_back_self(const at::Tensor& self, const ShardTensorSpec& target, const at::Tensor& result) {
  ShardTensorImpl* impl = shard_tensor_impl(self);
  const ShardTensorSpec& home = impl->spec();
  Placements reachable = home.placements();  // home, with the Partials the op resolved Replicate
  for (size_t m = 0; m < reachable.size(); ++m)
    if (reachable[m].is_partial() && !target.placements()[m].is_partial()) reachable[m] = Replicate();
  const ShardTensorSpec resolved_home = with_placements(home, reachable);
  at::Tensor moved = execute_redistribute(result, target, *plan_redistribute(target, resolved_home));
  at::Tensor local = impl->local();
  local.copy_(moved);
  for (size_t m = 0; m < reachable.size(); ++m) {
    const Placement& p = home.placements()[m];
    if (!p.is_partial() || reachable[m].is_partial() || home.mesh().coordinate()[m] == 0) continue;
    if (p.reduce_op == ReduceOp::Sum || p.reduce_op == ReduceOp::Norm) local.zero_();
    if (p.reduce_op == ReduceOp::Product) local.fill_(1);
  }
}

// An input the op wrote (not self, not out=) ran as `target`, moved from `home`: the copy it
// wrote goes back into the caller's tensor, a ShardTensor (as self does) or a plain tensor
// standing for Replicate, so that the write is not lost with the copy.
void write_back_input(const at::Tensor& caller, const ShardTensorSpec& home, const ShardTensorSpec& target,
                      const at::Tensor& written) {
  if (shard_tensor_impl(caller)) return write_back_self(caller, target, written);
  at::Tensor destination = caller;
  destination.copy_(execute_redistribute(written, target, *plan_redistribute(target, home)));
}

void log_call(const Propagation& p) {
  std::ostringstream os;
  os << p.meta.name << (p.fallback ? " (fallback)" : "") << ":";
  for (size_t k = 0; k < p.meta.inputs.size(); ++k) {
    os << " " << to_string(p.meta.inputs[k].spec.placements()) << "[" << join(p.meta.inputs[k].spec.shape(), ",") << "]";
    if (p.plans[k]) os << "->" << to_string(p.result.input_targets[k].placements());
  }
  os << " =>";
  for (const OutputLayout& out : p.result.outputs) os << " " << to_string(out.placements);
  log_line(LogLevel::Info, os.str());
}

// t, transpose and permute report their input's global strides permuted, as a plain tensor
// would: autograd's mm backward reads them to lay out a weight gradient like the weight (a
// linear layer's weight reaches mm through t()), so the optimizer never mixes layouts. The
// strides derive from global shapes and the op alone, so every rank agrees.
// Called only for those three ops (Propagation::permutes_dims).
std::vector<int64_t> permuted_global_strides(const std::string& name, c10::ArrayRef<c10::IValue> args) {
  if (!args[0].isTensor()) return {};
  const at::Tensor& input = args[0].toTensor();
  if (!shard_tensor_impl(input)) return {};
  std::vector<int64_t> strides = input.strides().vec();
  const int64_t ndim = static_cast<int64_t>(strides.size());
  if (name == "aten::t") {
    if (ndim == 2) std::swap(strides[0], strides[1]);
  } else if (name == "aten::transpose.int") {
    std::swap(strides[c10::maybe_wrap_dim(args[1].toInt(), ndim)], strides[c10::maybe_wrap_dim(args[2].toInt(), ndim)]);
  } else {
    const std::vector<int64_t> dims = args[1].toIntVector();
    std::vector<int64_t> permuted;
    for (int64_t d : dims) permuted.push_back(strides[c10::maybe_wrap_dim(d, ndim)]);
    strides = std::move(permuted);
  }
  return strides;
}

// Meta pieces (a module built on the meta device) hold no values: a kernel that moves data
// between ranks mid-op (a halo gather, a norm's sums) cannot run on them. Every rank holds
// meta pieces alike (distribute_tensor checks it), so every rank raises here, before moving.
void check_kernel_can_run_on_meta(const Propagation& p) {
  if (!p.result.kernel_plan) return;
  const std::vector<MoveStep> moves = p.result.kernel_plan->moves();
  TORCH_CHECK(moves.empty(), p.meta.name, ": its pieces are on the meta device and hold no values, but its kernel (",
              p.result.kernel_plan->name(), ") moves data between ranks (", to_string(moves.front()),
              "). Materialise the tensors first (Module.to_empty(device=...), or empty_like(x, device=...)), then "
              "initialise them.");
}

}  // namespace

// Called for every ShardTensor input before its local piece is used (both paths).
void keep_leaf_layout_of_input(const at::Tensor& input) {
  if (input.requires_grad() && input.is_leaf()) keep_leaf_gradient_layout(input);
}

at::Tensor run_rule_kernel_direct(const c10::OperatorHandle& op, Propagation& p, c10::ArrayRef<c10::IValue> args) {
  torch::jit::Stack stack;
  stack.reserve(args.size());
  for (const c10::IValue& arg : args) {
    const ShardTensorImpl* impl = arg.isTensor() ? shard_tensor_impl(arg.toTensor()) : nullptr;
    stack.push_back(impl ? c10::IValue(impl->local()) : arg);
  }
  p.result.local_kernel(op, &stack);
  return wrap_direct_output(p, args, stack.back().toTensor());
}

at::Tensor wrap_direct_output(Propagation& p, c10::ArrayRef<c10::IValue> args, const at::Tensor& local) {
  return wrap_output(p, 0, local, p.permutes_dims ? permuted_global_strides(p.meta.name, args) : std::vector<int64_t>{});
}

void shard_tensor_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t num_args = op.schema().arguments().size();
  c10::impl::ExcludeDispatchKeyGuard on_pieces(kExcludedOnPieces);
  if (const c10::OperatorHandle* functional = functional_overload_of(op)) return run_out_variant(op, *functional, stack);
  run_propagated(op, stack, propagate(op, c10::ArrayRef<c10::IValue>(stack->data() + stack->size() - num_args, num_args)));
}

void run_propagated(const c10::OperatorHandle& op, torch::jit::Stack* stack, Propagation& p) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t args_begin = stack->size() - num_args;
  const PropagationRun running;
  CurrentOperatorScope current(&p.meta.name);
  if (log_enabled()) log_call(p);

  const std::vector<int64_t> output_strides =
      p.permutes_dims ? permuted_global_strides(p.meta.name, c10::ArrayRef<c10::IValue>(stack->data() + args_begin, num_args))
                      : std::vector<int64_t>{};

  // A rank outside the mesh runs the op on meta stand-ins for global shapes (outside_mesh.h).
  const bool outside_mesh = !p.meta.mesh().includes_this_rank();

  // Written arguments come back as the caller's wrappers.
  const bool inplace = p.meta.is_inplace();
  at::Tensor self_wrapper = inplace ? (*stack)[args_begin].toTensor() : at::Tensor();
  std::vector<std::pair<size_t, at::Tensor>> out_wrappers;

  size_t k = 0;
  bool meta_pieces = false;  // deferred initialisation: see check_kernel_can_run_on_meta
  auto unwrap_input = [&](const at::Tensor& t) -> at::Tensor {
    const size_t input = k++;
    ShardTensorImpl* impl = shard_tensor_impl(t);
    if (impl) keep_leaf_layout_of_input(t);
    if (outside_mesh) return meta_stand_in(t);
    const at::Tensor& local = impl ? impl->local() : t;
    meta_pieces = meta_pieces || local.is_meta();
    if (!p.plans[input]) return local;
    // A Partial input resolved to Replicate: its resolved form is reused while its local piece
    // is unchanged (see ShardTensorImpl::cached_resolution); the input keeps its placements.
    // Not where the op could write into the resolved form or return a view of it.
    const ShardTensorSpec& target = p.result.input_targets[input];
    const bool resolves = impl && impl->spec().has_partial() && target == without_partial(impl->spec()) &&
                          schema.arguments()[p.meta.inputs[input].arg_index].alias_info() == nullptr;
    if (resolves)
      if (const at::Tensor* cached = impl->cached_resolution(target)) return *cached;
    at::Tensor moved = execute_redistribute(local, p.meta.inputs[input].spec, *p.plans[input]);
    if (resolves) impl->cache_resolution(target, moved);
    return moved;
  };
  // Written inputs the op ran on moved copies of: (the caller's tensor, its input index, the copy).
  std::vector<std::tuple<at::Tensor, size_t, at::Tensor>> written_copies;
  auto unwrap_argument = [&](const at::Tensor& t, bool written) -> at::Tensor {
    const size_t input = k;
    at::Tensor local = unwrap_input(t);
    if (written && p.plans[input] && !outside_mesh) written_copies.emplace_back(t, input, local);
    return local;
  };
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& arg = (*stack)[args_begin + i];
    const bool written = is_written_input(schema, i);
    if (is_out_argument(schema, i)) {
      if (arg.isTensor() && shard_tensor_impl(arg.toTensor())) {
        out_wrappers.emplace_back(i, arg.toTensor());
        arg = outside_mesh ? meta_stand_in(arg.toTensor()) : shard_tensor_impl(arg.toTensor())->local();
      }
      continue;
    }
    if (arg.isTensor()) {
      if (arg.toTensor().defined()) arg = unwrap_argument(arg.toTensor(), written);
    } else if (arg.isTensorList()) {
      std::vector<at::Tensor> locals;
      for (const at::Tensor& t : arg.toTensorVector()) locals.push_back(t.defined() ? unwrap_argument(t, written) : t);
      arg = locals;
    } else if (arg.isList()) {
      c10::List<c10::IValue> list = arg.toList();
      for (size_t j = 0; j < list.size(); ++j) {
        c10::IValue e = list.get(j);
        if (e.isTensor() && e.toTensor().defined()) list.set(j, unwrap_argument(e.toTensor(), written));
      }
    }
  }

  if (outside_mesh) {
    run_outside_mesh(op, stack, p);
  } else if (p.result.local_kernel) {
    if (meta_pieces) check_kernel_can_run_on_meta(p);
    p.result.local_kernel(op, stack);
  } else {
    op.callBoxed(stack);
  }

  for (const auto& [caller, input, copy] : written_copies)
    write_back_input(caller, p.meta.inputs[input].spec, p.result.input_targets[input], copy);

  const size_t num_returns = schema.returns().size();
  const size_t returns_begin = stack->size() - num_returns;
  size_t next_output = 0;
  size_t next_out_wrapper = 0;
  for (size_t j = 0; j < num_returns; ++j) {
    c10::IValue& ret = (*stack)[returns_begin + j];
    const c10::AliasInfo* alias = schema.returns()[j].alias_info();
    const bool written = alias && alias->isWrite();
    if (written && inplace && j == 0) {
      if (p.plans[0] && !outside_mesh) write_back_self(self_wrapper, p.result.input_targets[0], ret.toTensor());
      ret = self_wrapper;
      ++next_output;
    } else if (written && next_out_wrapper < out_wrappers.size()) {
      const at::Tensor& wrapper = out_wrappers[next_out_wrapper++].second;
      at::Tensor fresh = wrap_output(p, next_output++, ret.toTensor());
      shard_tensor_impl(wrapper)->replace(shard_tensor_impl(fresh)->local(), shard_tensor_impl(fresh)->spec());
      ret = wrapper;
    } else if (ret.isTensor()) {
      if (ret.toTensor().defined()) ret = wrap_output(p, next_output, ret.toTensor(), output_strides);
      ++next_output;
    } else if (ret.isTensorList()) {
      std::vector<at::Tensor> wrapped;
      for (const at::Tensor& t : ret.toTensorVector()) wrapped.push_back(wrap_output(p, next_output++, t));
      ret = wrapped;
    }
  }
}

}  // namespace shardtensor
