// See reduction.h.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "redistribute/transports/reduction.h"

#include <ATen/ops/add.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/mul.h>

#include <algorithm>

namespace shardtensor {
namespace {

// A block of `out` small enough to stay in a core's L2 cache while every piece is added into it,
// large enough that ATen's per-call cost is noise (about 1 µs against 20-40 µs of work).
constexpr int64_t kBlockBytes = int64_t{256} << 10;

// out = a op b, elementwise; `out` may be `a`.
void combine(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: at::add_out(out, a, b); return;
    case ReduceOp::Max: at::maximum_out(out, a, b); return;
    case ReduceOp::Min: at::minimum_out(out, a, b); return;
    case ReduceOp::Product: at::mul_out(out, a, b); return;
    case ReduceOp::Norm: break;  // reduced as a sum of powers (as_sum_of_powers)
  }
  TORCH_INTERNAL_ASSERT(false, "combine: ReduceOp ", to_string(op), " reaches the transports only as a sum");
}

void reduce_whole(at::Tensor out, const at::Tensor& own, const std::vector<at::Tensor>& pieces, ReduceOp op, int64_t members) {
  if (pieces.empty()) out.copy_(own);
  for (size_t i = 0; i < pieces.size(); ++i) combine(out, i == 0 ? own : out, pieces[i], op);
  if (op == ReduceOp::Avg) out.div_(members);
}

}  // namespace

void reduce_pieces_into(const at::Tensor& out, const at::Tensor& own, const std::vector<at::Tensor>& pieces, ReduceOp op, int64_t members) {
  const bool flat = out.is_contiguous() && own.is_contiguous() &&
                    std::all_of(pieces.begin(), pieces.end(), [](const at::Tensor& p) { return p.is_contiguous(); });
  const int64_t n = out.numel(), block = std::max<int64_t>(1, kBlockBytes / static_cast<int64_t>(out.element_size()));
  if (!flat || n <= block) return reduce_whole(out, own, pieces, op, members);
  const at::Tensor out_flat = out.view({-1}), own_flat = own.view({-1});
  std::vector<at::Tensor> pieces_flat;
  for (const at::Tensor& p : pieces) pieces_flat.push_back(p.view({-1}));
  std::vector<at::Tensor> block_pieces(pieces.size());
  for (int64_t begin = 0; begin < n; begin += block) {
    const int64_t length = std::min(block, n - begin);
    for (size_t i = 0; i < pieces.size(); ++i) block_pieces[i] = pieces_flat[i].narrow(0, begin, length);
    reduce_whole(out_flat.narrow(0, begin, length), own_flat.narrow(0, begin, length), block_pieces, op, members);
  }
}

void combine_slots(const PartReduction& reduction, const at::Tensor& destination) {
  std::vector<at::Tensor> pieces;
  for (int64_t i = 0; i < destination.size(0); ++i) pieces.push_back(destination[i]);
  reduce_pieces_into(reduction.out, reduction.own, pieces, reduction.op, reduction.members);
}

}  // namespace shardtensor
