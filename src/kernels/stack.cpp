// See stack.h.
#include "kernels/stack.h"

#include <ATen/core/dispatch/Dispatcher.h>

namespace shardtensor {

std::vector<c10::IValue> pop_arguments(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  std::vector<c10::IValue> args(std::make_move_iterator(stack->end() - n), std::make_move_iterator(stack->end()));
  stack->erase(stack->end() - n, stack->end());
  return args;
}

OpArguments::OpArguments(const c10::OperatorHandle& op, torch::jit::Stack* stack)
    : schema_(&op.schema()), values_(pop_arguments(op, stack)) {}

bool OpArguments::has(const char* name) const { return schema_->argumentIndexWithName(name).has_value(); }

size_t OpArguments::index_of(const char* name) const {
  const auto index = schema_->argumentIndexWithName(name);
  TORCH_CHECK(index.has_value(), schema_->name(), ": the kernel asked for an argument named '", name,
              "', which the schema (", *schema_, ") does not have. Read it by a name the schema gives.");
  return static_cast<size_t>(*index);
}

const c10::IValue& OpArguments::value(const char* name) const { return values_[index_of(name)]; }

void OpArguments::set(const char* name, c10::IValue v) { values_[index_of(name)] = std::move(v); }

const c10::IValue& OpArguments::value_at(size_t index) const {
  TORCH_INTERNAL_ASSERT(index < values_.size(), schema_->name(), " has ", values_.size(), " arguments; asked for #", index);
  return values_[index];
}

void OpArguments::set_at(size_t index, c10::IValue v) {
  TORCH_INTERNAL_ASSERT(index < values_.size(), schema_->name(), " has ", values_.size(), " arguments; asked to set #", index);
  values_[index] = std::move(v);
}

void OpArguments::push(torch::jit::Stack* stack) && {
  for (c10::IValue& a : values_) stack->push_back(std::move(a));
  values_.clear();
}

void OpArguments::call(const c10::OperatorHandle& op, torch::jit::Stack* stack) && {
  TORCH_INTERNAL_ASSERT_DEBUG_ONLY(&op.schema() == schema_, op.schema().name(), ": called with the arguments of ", schema_->name());
  std::move(*this).push(stack);
  op.callBoxed(stack);
}

}  // namespace shardtensor
