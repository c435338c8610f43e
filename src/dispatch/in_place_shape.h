// Operators that change a ShardTensor's shape or strides in place: t_, transpose_,
// unsqueeze_, squeeze_ (swapdims_ and swapaxes_ decompose into transpose_).
#pragma once

namespace torch {
class Library;
}

namespace shardtensor {

// Registers each on PrivateUse1, below autograd (which records the in-place op on self as it
// does for a plain tensor): the out-of-place operator's sharding rule gives the new layout, and
// self takes the result's piece, spec and strides. No communication where the out-of-place
// operator needs none.
void register_in_place_shape_ops(torch::Library& whole);

}  // namespace shardtensor
