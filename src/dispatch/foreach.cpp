#include "dispatch/foreach.h"

#include <ATen/core/Tensor.h>

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/StringUtil.h>

#include <mutex>
#include <optional>
#include <unordered_map>

#include "dispatch/op_name.h"

namespace shardtensor {
namespace {

// What a _foreach_ argument becomes for element i: the list's element, or the value itself.
enum class Spread { Same, ListElement, ScalarTensorElement };

struct ElementwisePlan {
  std::vector<Spread> spreads;
  std::optional<c10::OperatorHandle> target;  // the per-tensor operator
  bool copy_back = false;                     // in-place foreach with only a functional target
  bool vector_norm = false;                   // _foreach_norm: linalg_vector_norm's argument order
};

// "Tensor[]" -> "Tensor", "Scalar[]" -> "Scalar", others unchanged: the type element i has.
std::string element_type(const c10::Argument& arg, Spread spread) {
  if (spread == Spread::ScalarTensorElement) return "Scalar";
  std::string type = arg.type()->str();
  if (spread == Spread::ListElement) type = type.substr(0, type.size() - 2);
  return type;
}

Spread spread_of(const c10::Argument& arg) {
  const std::string type = arg.type()->str();
  if (type == "Tensor[]" || type == "Scalar[]") return Spread::ListElement;
  // _foreach_addcmul_.Tensor and friends pass their per-element scalars as one 1-D tensor.
  if (type == "Tensor" && arg.name() == "scalars") return Spread::ScalarTensorElement;
  return Spread::Same;
}

// The overload of `name` that takes the element types positionally, the rest defaulted.
std::optional<c10::OperatorHandle> find_overload(const std::string& name, const std::vector<std::string>& types) {
  for (const c10::OperatorName& candidate : c10::Dispatcher::singleton().getAllOpNames()) {
    if (candidate.name != name) continue;
    auto op = c10::Dispatcher::singleton().findOp(candidate);
    if (!op || !op->hasSchema()) continue;
    const auto& args = op->schema().arguments();
    if (args.size() < types.size()) continue;
    bool fits = true;
    for (size_t j = 0; j < args.size() && fits; ++j)
      fits = j < types.size() ? args[j].type()->str() == types[j] : args[j].default_value().has_value();
    if (fits) return *op;  // findOp gives c10::optional on libtorch 1.13
  }
  return std::nullopt;
}

ElementwisePlan plan_for(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  ElementwisePlan plan;
  std::vector<std::string> types;
  for (const c10::Argument& arg : schema.arguments()) {
    plan.spreads.push_back(spread_of(arg));
    types.push_back(element_type(arg, plan.spreads.back()));
  }
  std::string base = schema.name().substr(std::string("aten::_foreach_").size());
  if (base == "norm") {
    plan.vector_norm = true;
    plan.target = find_overload("aten::linalg_vector_norm", {"Tensor", "Scalar"});
  } else {
    plan.target = find_overload("aten::" + base, types);
    if (!plan.target && base.back() == '_') {  // e.g. _foreach_maximum_: no maximum_ exists
      plan.target = find_overload("aten::" + base.substr(0, base.size() - 1), types);
      plan.copy_back = plan.target.has_value();
    }
  }
  TORCH_CHECK(plan.target, full_op_name(schema.operator_name()),
              ": shardtensor runs _foreach_ operators element by element, but found no per-tensor operator "
              "aten::", base, " taking (", c10::Join(", ", types), ").");
  return plan;
}

const ElementwisePlan& cached_plan(const c10::OperatorHandle& op) {
  static std::mutex mutex;
  static std::unordered_map<const c10::FunctionSchema*, ElementwisePlan> plans;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = plans.find(&op.schema());
  if (it == plans.end()) it = plans.emplace(&op.schema(), plan_for(op)).first;
  return it->second;
}

c10::IValue element_of(const c10::IValue& value, Spread spread, size_t i) {
  switch (spread) {
    case Spread::Same: return value;
    case Spread::ListElement: return value.toListRef()[i];
    case Spread::ScalarTensorElement: return value.toTensor()[static_cast<int64_t>(i)].item();
  }
  return value;
}

}  // namespace

void foreach_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // torch's _foreach_* kernels run below autocast, so their elements' operators never cast.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const ElementwisePlan& plan = cached_plan(op);
  const size_t n = op.schema().arguments().size();
  std::vector<c10::IValue> args(std::make_move_iterator(stack->end() - n), std::make_move_iterator(stack->end()));
  stack->erase(stack->end() - n, stack->end());

  size_t length = 0;
  bool have_list = false;
  for (size_t j = 0; j < n; ++j) {
    if (plan.spreads[j] != Spread::ListElement) continue;
    const size_t size = args[j].toListRef().size();
    TORCH_CHECK(!have_list || size == length, full_op_name(op.operator_name()), ": argument ", j, " has ", size,
                " elements but an earlier list has ", length, "; the lists must have the same length.");
    length = size;
    have_list = true;
  }

  const bool returns_list = !op.schema().returns().empty();
  c10::List<at::Tensor> results;
  for (size_t i = 0; i < length; ++i) {
    torch::jit::Stack element;
    for (size_t j = 0; j < n; ++j) element.push_back(element_of(args[j], plan.spreads[j], i));
    if (plan.vector_norm) {  // (self, ord, dtype) -> (self, ord, dim=None, keepdim=False, dtype)
      c10::IValue dtype = element.size() > 2 ? element[2] : c10::IValue();
      element.resize(2);
      element.insert(element.end(), {c10::IValue(), c10::IValue(false), dtype});
    }
    const auto& target_args = plan.target->schema().arguments();
    for (size_t j = element.size(); j < target_args.size(); ++j) element.push_back(*target_args[j].default_value());
    const at::Tensor self = element.front().isTensor() ? element.front().toTensor() : at::Tensor();
    plan.target->callBoxed(element);
    if (plan.copy_back) {
      at::Tensor(self).copy_(element.front().toTensor());
    } else if (returns_list) {
      results.push_back(element.front().toTensor());
    }
  }
  if (returns_list) stack->push_back(c10::IValue(std::move(results)));
}

}  // namespace shardtensor
