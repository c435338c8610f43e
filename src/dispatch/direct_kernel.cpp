// See direct_kernel.h.
#include "dispatch/direct_kernel.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_unsafe_view_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/clone_ops.h>
#include <ATen/ops/detach_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/expand_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/linear_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/permute_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/select_ops.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/slice_ops.h>
#include <ATen/ops/squeeze_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/t_ops.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/transpose_ops.h>
#include <ATen/ops/unsqueeze_ops.h>
#include <ATen/ops/view_ops.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/MaybeOwned.h>
#include <torch/library.h>

#include <array>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "comm/comm_debug.h"
#include "dispatch/kernel.h"
#include "dispatch/plain_gradients.h"
#include "dispatch/propagation.h"
#include "dispatch/cached_propagation.h"
#include "dispatch/shard_tensor_impl.h"

namespace shardtensor {
namespace {

thread_local uint64_t direct_calls = 0;

// The arguments of one call as IValues, for propagate(). Tensors are borrowed (no reference
// count taken, so no GIL for a tensor Python owns) and handed back unreleased; the caller's
// references keep them alive for the whole call. Other arguments are ordinary IValues, built
// as the dispatcher's boxing builds them, so the cache sees the same keys on both paths.
template <size_t N>
class BorrowedArguments {
 public:
  template <class... Args>
  explicit BorrowedArguments(const Args&... args) : values_{borrow(args)...}, borrowed_{borrows(args)...} {}
  ~BorrowedArguments() {
    for (size_t i = 0; i < N; ++i)
      if (borrowed_[i]) c10::MaybeOwnedTraits<c10::IValue>::destroyBorrow(values_[i]);
  }
  BorrowedArguments(const BorrowedArguments&) = delete;
  BorrowedArguments& operator=(const BorrowedArguments&) = delete;

  c10::ArrayRef<c10::IValue> view() const { return c10::ArrayRef<c10::IValue>(values_.data(), N); }

 private:
  static c10::IValue borrow(const at::Tensor& t) { return c10::IValue(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(t)); }
  static c10::IValue borrow(const c10::optional<at::Tensor>& t) { return t ? borrow(*t) : c10::IValue(); }
  template <class T>
  static c10::IValue borrow(const T& value) {
    return c10::IValue(value);
  }
  static bool borrows(const at::Tensor&) { return true; }
  static bool borrows(const c10::optional<at::Tensor>& t) { return t.has_value(); }
  template <class T>
  static bool borrows(const T&) {
    return false;
  }

  std::array<c10::IValue, N> values_;
  std::array<bool, N> borrowed_;
};

// The local piece of a ShardTensor argument; a plain tensor (a 0-d scalar) and every other
// argument pass through as they are, as in the boxed kernel.
inline const at::Tensor& local_of(const at::Tensor& t) {
  const ShardTensorImpl* impl = shard_tensor_impl(t);
  return impl ? impl->local() : t;
}
inline c10::optional<at::Tensor> local_of(const c10::optional<at::Tensor>& t) {
  return t ? c10::optional<at::Tensor>(local_of(*t)) : c10::nullopt;
}
template <class T>
T&& local_of(T&& value) {
  return std::forward<T>(value);
}

template <class... Args>
constexpr bool first_is_tensor = sizeof...(Args) > 0 && std::is_same_v<std::decay_t<std::tuple_element_t<0, std::tuple<Args...>>>, at::Tensor>;
template <class First, class... Rest>
const First& first_of(const First& first, const Rest&...) {
  return first;
}

template <class Op, class Signature = typename Op::schema>
struct DirectKernel;

// Every ShardTensor input's gradient layout is kept before its piece is used (kernel.h).
inline void keep_leaf_layout(const at::Tensor& t) {
  if (shard_tensor_impl(t)) keep_leaf_layout_of_input(t);
}
inline void keep_leaf_layout(const c10::optional<at::Tensor>& t) {
  if (t) keep_leaf_layout(*t);
}
template <class T>
void keep_leaf_layout(const T&) {}

// Plain inputs that require grad keep plain gradients (plain_gradients.h) on cache hits too.
inline void keep_plain_gradient(const at::Tensor& t) { keep_gradient_plain(t); }
inline void keep_plain_gradient(const c10::optional<at::Tensor>& t) {
  if (t) keep_gradient_plain(*t);
}
template <class T>
void keep_plain_gradient(const T&) {}

template <class Op, class... Args>
struct DirectKernel<Op, at::Tensor(Args...)> {
  static const c10::OperatorHandle& op() {
    static const c10::OperatorHandle handle = c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
    return handle;
  }

  static at::Tensor call(Args... args) {
    c10::impl::ExcludeDispatchKeyGuard on_pieces(kExcludedOnPieces);
    // A cache hit is found from the typed arguments (propagation_key.h); only a miss, a rule
    // kernel run on a stack, or an output whose strides follow the arguments boxes them.
    Propagation* p = propagation_key::find_cached(op().schema(), args...);
    if (p && p->plain_inputs) (keep_plain_gradient(args), ...);  // a miss does it in propagate()
    if (p && p->direct && !needs_boxed_arguments(*p)) return run_direct(*p, {}, args...);
    if (!p || p->direct) {
      const BorrowedArguments<sizeof...(Args)> borrowed(args...);
      if (!p) p = &propagate(op(), borrowed.view());
      if (p->direct) return run_direct(*p, borrowed.view(), args...);
    }
    // The cache entry stays put: entries are owned by pointer, and none is dropped while a
    // run holds one (PropagationRun).
    torch::jit::Stack stack = c10::impl::boxArgs<Args...>(args...);
    run_propagated(op(), &stack, *p);
    return std::move(stack.back()).toTensor();
  }

  // A rule kernel other than a function of the first piece runs on a stack; t, transpose and
  // permute read their dims to give the output its global strides.
  static bool needs_boxed_arguments(const Propagation& p) {
    bool piece_kernel = false;
    if constexpr (first_is_tensor<Args...>) piece_kernel = static_cast<bool>(p.piece_kernel);
    return p.permutes_dims || (p.result.local_kernel && !piece_kernel);
  }

  // The call on the local pieces alone; `boxed` holds the arguments where needs_boxed_arguments.
  static at::Tensor run_direct(Propagation& p, c10::ArrayRef<c10::IValue> boxed, const Args&... args) {
    // Below ADInplaceOrView too: the local piece of a view needs no autograd view record of
    // its own (pieces never require grad; the wrapper's view record, made above this kernel,
    // is the one autograd reads), and making one costs an allocation per call.
    c10::impl::ExcludeDispatchKeyGuard no_view_record(c10::DispatchKey::ADInplaceOrView);
    const PropagationRun running;
    CurrentOperatorScope current(&p.meta.name);
    ++direct_calls;
    (keep_leaf_layout(args), ...);
    if (p.result.local_kernel) {
      if constexpr (first_is_tensor<Args...>)
        if (p.piece_kernel) return wrap_direct_output(p, boxed, p.piece_kernel(local_of(first_of(args...))));
      return run_rule_kernel_direct(op(), p, boxed);
    }
    return wrap_direct_output(p, boxed, Op::call(local_of(args)...));
  }
};

template <class Op>
void register_direct(torch::Library& library) {
  const auto op = c10::Dispatcher::singleton().findOp({Op::name, Op::overload_name});
  if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) return;
  // propagation_key::TypedCall takes every tensor for an input, as no out= argument is one.
  for (size_t i = 0; i < op->schema().arguments().size(); ++i)
    TORCH_INTERNAL_ASSERT(!is_out_argument(op->schema(), i), Op::name, " has an out= argument: no direct kernel for it");
  const std::string name = std::string(Op::name).substr(6) + (*Op::overload_name ? std::string(".") + Op::overload_name : "");
  library.impl(name.c_str(), TORCH_FN(DirectKernel<Op>::call));
}

}  // namespace

uint64_t direct_calls_on_this_thread() { return direct_calls; }

at::Tensor linear_2d_as_one_operator(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  return DirectKernel<at::_ops::linear>::call(input, weight, bias);
}

void register_direct_kernels(torch::Library& library) {
  // Pointwise operators and reductions of a training step.
  register_direct<at::_ops::add_Tensor>(library);
  register_direct<at::_ops::sub_Tensor>(library);
  register_direct<at::_ops::mul_Tensor>(library);
  register_direct<at::_ops::mul_Scalar>(library);
  register_direct<at::_ops::div_Tensor>(library);
  register_direct<at::_ops::neg>(library);
  register_direct<at::_ops::exp>(library);
  register_direct<at::_ops::relu>(library);
  register_direct<at::_ops::gelu>(library);
  register_direct<at::_ops::tanh>(library);
  register_direct<at::_ops::sigmoid>(library);
  register_direct<at::_ops::sum>(library);
  register_direct<at::_ops::sum_dim_IntList>(library);
  register_direct<at::_ops::mean_dim>(library);
  register_direct<at::_ops::clone>(library);
  // Matrix products and the views around them (linear is t + addmm; reshape is view or
  // clone + _unsafe_view). Views with global sizes run the rule's local reshape.
  register_direct<at::_ops::mm>(library);
  register_direct<at::_ops::addmm>(library);
  register_direct<at::_ops::bmm>(library);
  register_direct<at::_ops::view>(library);
  register_direct<at::_ops::t>(library);
  register_direct<at::_ops::transpose_int>(library);
  register_direct<at::_ops::permute>(library);
  register_direct<at::_ops::_unsafe_view>(library);
  register_direct<at::_ops::unsqueeze>(library);
  register_direct<at::_ops::squeeze_dim>(library);
  register_direct<at::_ops::expand>(library);
  register_direct<at::_ops::slice_Tensor>(library);
  register_direct<at::_ops::select_int>(library);
  register_direct<at::_ops::detach>(library);
}

}  // namespace shardtensor
