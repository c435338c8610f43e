// Collective: steps run as native c10d collectives. Exchanges of parts go as one all_to_all
// with split sizes (part_transport.h: all_to_all_transport); plan steps whose pieces are equal
// over their group as one all_gather or reduce_scatter each (transport.h: Collective), and
// all-reduces as c10d's own. The gathered or scattered dim need not be the outermost: the
// pieces then go through a stack of size() blocks, one copy, as DTensor does.
#pragma once

#include <cstdint>

#include "shardtensor/placement.h"

namespace at {
class Tensor;
}

namespace shardtensor {

class Comm;

// AllGather: every member holds a piece of `tensor_dim` of one shape; returns the pieces of
// the group joined along it, in group-rank order.
at::Tensor gather_equal_pieces(Comm& comm, const at::Tensor& local, int64_t tensor_dim);

// ReduceScatter: every member holds the same box, Partial over the group, whose `tensor_dim`
// the group cuts into size() equal pieces; returns this member's piece reduced by `op`.
at::Tensor reduce_scatter_equal_pieces(Comm& comm, const at::Tensor& local, int64_t tensor_dim, ReduceOp op);

}  // namespace shardtensor
