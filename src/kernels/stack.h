// What the local kernels share: reading the boxed stack they are called with.
//
// src/kernels/ holds the code that runs the plans the built-in rules declare (rules/*.h): one
// file per rule family, each defining its plans' lower(). Kernels may communicate (halo
// windows, reductions and ring passes, through the KernelMoves dispatch hands them:
// domain/kernel_moves.h); rules may not, which is why the two live apart.
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>

#include <vector>

namespace c10 {
class OperatorHandle;
struct FunctionSchema;
}  // namespace c10

namespace shardtensor {

// The operator's arguments, popped off the stack.
std::vector<c10::IValue> pop_arguments(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// An operator's arguments, popped off the boxed stack and read or replaced by their schema
// names, as functorch's batch rules get typed parameters: a kernel never depends on where an
// argument sits, and a name the schema lacks raises at once, naming the operator. Names are
// those of native_functions.yaml; a kernel serving several operators must use a name each
// of them has.
//
// Points at the operator's schema, which the dispatcher owns: use it within the kernel call.
class OpArguments {
 public:
  OpArguments(const c10::OperatorHandle& op, torch::jit::Stack* stack);

  // Whether the schema has an argument `name` (for operators that differ in what they take).
  bool has(const char* name) const;
  // The argument `name`; raises if the schema has none.
  const c10::IValue& value(const char* name) const;
  bool is_none(const char* name) const { return value(name).isNone(); }

  const at::Tensor& tensor(const char* name) const { return value(name).toTensor(); }
  c10::optional<at::Tensor> optional_tensor(const char* name) const { return value(name).toOptional<at::Tensor>(); }
  double to_double(const char* name) const { return value(name).toDouble(); }
  int64_t to_int(const char* name) const { return value(name).toInt(); }
  bool to_bool(const char* name) const { return value(name).toBool(); }
  std::vector<int64_t> int_list(const char* name) const { return value(name).toIntVector(); }
  c10::List<bool> bool_list(const char* name) const { return value(name).toBoolList(); }
  c10::Scalar scalar(const char* name) const { return value(name).toScalar(); }

  // Replaces argument `name` for the call.
  void set(const char* name, c10::IValue v);

  // By schema position, where a rule computed it (MaskedLookupPlan's table_arg).
  const c10::IValue& value_at(size_t index) const;
  void set_at(size_t index, c10::IValue v);

  // Every argument pushed back onto `stack`, in schema order.
  void push(torch::jit::Stack* stack) &&;
  // push(), then `op` (the operator these came from) called: its outputs left on the stack.
  void call(const c10::OperatorHandle& op, torch::jit::Stack* stack) &&;

 private:
  size_t index_of(const char* name) const;

  const c10::FunctionSchema* schema_;
  std::vector<c10::IValue> values_;
};

}  // namespace shardtensor
