// Combining the pieces of a pending reduction: what a reduce-scatter does once the other
// members' copies of its target are at hand, whichever transport brought them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "shardtensor/spec.h"

namespace shardtensor {

// An exchange whose receiver wants its parts only to combine them (a reduce-scatter): each part
// it receives fills one slot of the destination's leading dim (n - 1 slots, one per other
// member), and the exchange's result is out = own op slot_0 op ... (divided by `members` for
// Avg). A transport that reads parts in place combines them straight from their holders' memory
// and never fills those slots.
struct PartReduction {
  ReduceOp op = ReduceOp::Sum;
  at::Tensor own;  // this member's copy of its target, read in place
  at::Tensor out;  // contiguous
  int64_t members = 1;
};

// out = own op pieces[0] op pieces[1] ... (divided by `members` for Avg); every piece has out's
// shape. Contiguous operands are combined block by block, each block of `out` staying in cache
// while every piece is added into it: memory sees each piece read once and `out` written once,
// as in one summing pass.
void reduce_pieces_into(const at::Tensor& out, const at::Tensor& own, const std::vector<at::Tensor>& pieces, ReduceOp op, int64_t members);

// The pieces of `reduction` from a destination whose slots hold them.
void combine_slots(const PartReduction& reduction, const at::Tensor& destination);

}  // namespace shardtensor
