// Our own decompositions of CompositeImplicitAutograd operators whose libtorch decomposition
// cannot run on ShardTensors (it writes into views of a fresh tensor). They are built from
// differentiable operators that have sharding rules, and library.cpp registers them on
// AutogradPrivateUse1, so autograd records their pieces as usual.
#pragma once

#include <ATen/core/Tensor.h>

namespace shardtensor {

// _pad_circular(self, pad): wrap-around padding as a cat of the far slices, dim by dim.
at::Tensor circular_pad_by_cat(const at::Tensor& self, c10::IntArrayRef pad);

}  // namespace shardtensor
