// Halo rows a convolution's forward received, kept for its backward.
//
// convolution_backward needs the window of the same input the forward computed on; gathering it
// again would move every halo row a second time (in the demo's U-Net, a third of the bytes of a
// training step). So the forward keeps the rows it received (not the window: a few rows per
// neighbour, not a copy of the activation), and the backward rebuilds the window from them and
// the input piece with no message. An entry is keyed by the input piece (held weakly, with its
// version, so an in-place change makes it stale) and by the window's geometry, and is used once.
//
// Whether a backward finds its entry must be the same on every rank of the exchange, or one rank
// would gather and its neighbour not: it depends only on the order of calls and on when pieces
// die, which SPMD programs share. Only windows along one split axis are kept (the common H or W
// split); others gather again.
#pragma once

#include <ATen/core/Tensor.h>

#include "domain/kernel_moves.h"

namespace shardtensor {

// After a forward gathered `window` of `piece` by the halo of `moves`: keeps what arrived, when
// autograd may ask for it (grad mode on) and the halo has a single exchanging axis.
void keep_received_rows(const KernelMoves& moves, const at::Tensor& piece, const at::Tensor& window);

// The window of `piece` under the halo of `moves` rebuilt from the rows a forward kept, with no
// message; or an undefined tensor when there are none (then gather it).
at::Tensor window_from_kept_rows(const KernelMoves& moves, const at::Tensor& piece);

}  // namespace shardtensor
