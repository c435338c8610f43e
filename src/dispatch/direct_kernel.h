// Unboxed kernels for the operators a training step calls most (add, mul, sum, mm, view, t, ...).
//
// The boxed kernel (kernel.h) costs two things on every call that these skip. The dispatcher
// copies each argument onto a stack of IValues, and in torch 2.x the first C++ copy of a
// tensor that Python owns takes the GIL to incref its Python object (and the kernel's
// overwrite of that stack entry takes it again to decref it); then the local operator is
// boxed and unboxed once more. An unboxed kernel looks its cached propagation up from the
// typed arguments (propagation_key.h; on a miss it borrows them as IValues for propagate()),
// and where that propagation is direct (propagation.h: nothing to move, nothing written, no
// rule kernel but one that moves nothing) calls the operator (or that kernel) on the local
// pieces itself. Every other call goes on to the boxed kernel with the
// propagation it looked up, so the two paths cannot disagree on anything but the cost.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>

namespace torch {
class Library;
}

namespace shardtensor {

// Registers the direct kernels on `library` (aten, PrivateUse1); operators that are composite
// on this torch line are left to decompose.
void register_direct_kernels(torch::Library& library);

// linear(input, weight, bias) on 2-D ShardTensors as one operator, for a call autograd does not
// record: one propagation (rules/matmul.cpp lays it out as libtorch's decomposition, t then
// addmm, would) and one local linear, where the decomposition pays two of each.
at::Tensor linear_2d_as_one_operator(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias);

// How many calls on this thread ran the direct path (tests check that it is taken).
uint64_t direct_calls_on_this_thread();

}  // namespace shardtensor
