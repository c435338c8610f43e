// The kernel of MaskedLookupPlan (rules/embedding.h): embedding, gather or index_select on this
// rank's range of a dim split over ranks, zeros for the index entries other ranks answer. The
// ranks' outputs add up to the lookup in the whole table, since every entry falls in exactly one
// rank's range (see Note [Lookups along a split dim]).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "kernels/stack.h"
#include "rules/embedding.h"

namespace shardtensor {
namespace {

// The output's shape where this rank's piece of the table is empty (the op is not called).
std::vector<int64_t> empty_piece_output_shape(const at::Tensor& piece, const at::Tensor& index, int64_t tensor_dim, LookupMask mask) {
  if (mask == LookupMask::kTrailingDim) {  // [*index, the table's other dims]
    std::vector<int64_t> shape = index.sizes().vec();
    for (int64_t d = 0; d < piece.dim(); ++d)
      if (d != tensor_dim) shape.push_back(piece.size(d));
    return shape;
  }
  if (mask == LookupMask::kAlongDim) {  // the table with tensor_dim as long as the index
    std::vector<int64_t> shape = piece.sizes().vec();
    shape[tensor_dim] = index.numel();
    return shape;
  }
  return index.sizes().vec();  // kIndexShape
}

// `elsewhere` (the index's shape) shaped to broadcast against an output of `out_ndim` dims.
at::Tensor output_mask(const at::Tensor& elsewhere, int64_t out_ndim, int64_t tensor_dim, LookupMask mask) {
  if (mask == LookupMask::kTrailingDim) return elsewhere.unsqueeze(-1);
  if (mask == LookupMask::kAlongDim) {  // [k] -> [1, .., k, .., 1], k at tensor_dim
    std::vector<int64_t> shape(out_ndim, 1);
    shape[tensor_dim] = elsewhere.numel();
    return elsewhere.reshape(shape);
  }
  return elsewhere;  // kIndexShape
}

}  // namespace

LocalKernel MaskedLookupPlan::lower(const KernelMoves& moves) const {
  return [table = table, tensor_dim = tensor_dim, table_arg = table_arg, index_arg = index_arg, mask = mask](
             const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    // By position: the rule found them by name in whichever lookup this is (embedding's weight
    // and indices, gather's and index_select's self and index).
    OpArguments args(op, stack);
    const at::Tensor piece = args.value_at(table_arg).toTensor(), index = args.value_at(index_arg).toTensor();
    const int64_t first = table.local_offsets()[tensor_dim], size = piece.size(tensor_dim);
    if (size == 0) {
      // An empty piece holds nothing to look up (not even a stand-in for the masked entries).
      stack->push_back(at::zeros(empty_piece_output_shape(piece, index, tensor_dim, mask), piece.options()));
      return;
    }
    // Global position i is local position i - first; entries of other ranks' ranges read local
    // position 0 and are zeroed after (masked_fill, not a product, so that an inf there leaves
    // no NaN).
    const at::Tensor local = index - first;
    const at::Tensor elsewhere = at::logical_or(local < 0, local >= size);
    args.set_at(index_arg, local.masked_fill(elsewhere, 0));
    std::move(args).call(op, stack);
    at::Tensor out = stack->back().toTensor();
    out.masked_fill_(output_mask(elsewhere, out.dim(), tensor_dim, mask), 0);
  };
}

}  // namespace shardtensor
