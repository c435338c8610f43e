// out= overloads (add.out, sum.IntList_out, max.dim_max, mm.out, ...) on ShardTensors.
//
// No rule is written per out= overload: each runs as its functional overload (the one with the
// same name and the same arguments less the out= tensors), through the kernel and that
// overload's rule, and each result is then written into its out= tensor:
//  - an out= tensor of the result's global shape keeps its own layout and storage, as a plain
//    out= tensor keeps its storage: the result is redistributed to the out tensor's placements
//    and shard sizes and copied into its local piece, so views of it see the values;
//  - an out= tensor of another shape is resized, as torch resizes it: it takes the result's
//    layout (DTensor's behaviour for every out= call).
// Either way the result is cast to the out= tensor's dtype, where torch would allow it.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace shardtensor {

// The functional overload that `op` is the out= form of, or nullptr (not an out= overload, or
// none matches). Looked up once per operator.
const c10::OperatorHandle* functional_overload_of(const c10::OperatorHandle& op);

// Runs out= operator `op` as `functional`, then writes each result into its out= tensor.
void run_out_variant(const c10::OperatorHandle& op, const c10::OperatorHandle& functional, torch::jit::Stack* stack);

}  // namespace shardtensor
