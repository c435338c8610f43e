// What the local kernels share: reading the boxed stack they are called with.
//
// src/kernels/ holds the code that runs the plans the built-in rules declare (rules/*.h): one
// file per rule family, each defining its plans' lower(). Kernels may communicate (halo
// windows through domain/, reductions through comm/); rules may not, which is why the two
// live apart.
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>

#include <vector>

namespace c10 {
class OperatorHandle;
}

namespace shardtensor {

// The operator's arguments, popped off the stack.
std::vector<c10::IValue> pop_arguments(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The arguments pushed back, then the operator called on them (its outputs left on the stack).
void call_with(const c10::OperatorHandle& op, torch::jit::Stack* stack, std::vector<c10::IValue> args);

}  // namespace shardtensor
