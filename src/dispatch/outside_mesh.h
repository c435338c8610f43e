// Ops on a rank outside the mesh (DeviceMesh::includes_this_rank is false; a mesh over some of
// the world's ranks). Such a rank holds an empty piece of every tensor on the mesh, and an op
// on it must still return what the members' op returns, in global terms: the same global
// shapes, dtypes and placements, so that the program goes on alike on every rank (DTensor's
// non-participating ranks do the same). It runs nothing and moves nothing: the operator runs
// on meta tensors of the inputs' global shapes, which gives the global output shapes (the
// oracle is the single-device op, so they are the members' global shapes too), and each
// output gets the empty piece.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>

#include "dispatch/propagation.h"

namespace shardtensor {

// The stand-in for argument `t` of an op run outside the mesh: a meta tensor of a
// ShardTensor's global shape, dtype and strides, or a plain tensor's meta twin.
at::Tensor meta_stand_in(const at::Tensor& t);

// Runs `op` on the meta stand-ins on `stack` (arguments replaced by meta_stand_in), leaving its
// meta results there, and draws the random keys the members' kernel draws. Raises, naming the
// operator and the mesh, where the op returns a value that needs data (item(), equal) or has
// no meta kernel.
void run_outside_mesh(const c10::OperatorHandle& op, torch::jit::Stack* stack, const Propagation& p);

// An output laid out as `layout` (the rule's), from its meta result `global`: a ShardTensor
// with the empty piece. (A fallback's Replicate outputs are wrapped in kernel.cpp.)
at::Tensor wrap_output_outside_mesh(const Propagation& p, const OutputLayout& layout, const at::Tensor& global);

}  // namespace shardtensor
