// zigzag_shard and zigzag_unshard (shardtensor/context_parallel.h): the sequence moved between
// contiguous shards and zigzag chunks along one mesh dim, in one exchange of parts, differentiably.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>

#include <algorithm>

#include "api/conversions.h"
#include "autograd/grad_fn.h"
#include "comm/comm.h"
#include "dispatch/relayout.h"
#include "dispatch/shard_tensor_impl.h"
#include "redistribute/boxes.h"
#include "redistribute/transport.h"
#include "redistribute/transports/part_transport.h"
#include "rules/helpers.h"
#include "shardtensor/context_parallel.h"
#include "shardtensor/shard_tensor.h"
#include "spec/sequence_order.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

// One run of positions that moves from rank `peer`'s local order to this rank's, or back.
struct Part {
  int64_t from_start, to_start, size;  // local offsets on the sending and the receiving rank; length
  int64_t at;                          // its first position in the sequence
};

// The parts that rank `sender` sends rank `receiver`, in the order the receiver lays them out:
// each piece of the receiver's new order, met by each piece the sender holds now.
std::vector<Part> parts_between(int64_t sender, int64_t receiver, const std::vector<Pieces>& from, const std::vector<Pieces>& to) {
  std::vector<Part> parts;
  const std::vector<int64_t> to_starts = local_starts(to[receiver]), from_starts = local_starts(from[sender]);
  for (size_t a = 0; a < to[receiver].size(); ++a)
    for (size_t b = 0; b < from[sender].size(); ++b) {
      const Range both = intersect(to[receiver][a], from[sender][b]);
      if (both.size() == 0) continue;
      parts.push_back({from_starts[b] + both.begin - from[sender][b].begin, to_starts[a] + both.begin - to[receiver][a].begin,
                       both.size(), both.begin});
    }
  return parts;
}

// This rank's `local` (its sequence on dim `seq_dim` in the order `from[me]`) rearranged to
// `to[me]`: every rank of the group of `mesh_dim` sends each other the positions they hold and
// the other needs, as one exchange of parts through the transport seam (part_transport.h), so
// a rank running another exchange is caught before any byte lands. `from` and `to` are per
// group rank, the same on every rank.
//
// A rank's pieces are not one stretch of the sequence, so each part gets coordinates of its
// own: the sequence position p sits at `sequence + p`, and each side's tensor is placed so that
// the part lands on its local offset (the shift keeps every offset non-negative).
at::Tensor move_sequence(const at::Tensor& local, int64_t seq_dim, const DeviceMesh& mesh, int64_t mesh_dim,
                         const std::vector<Pieces>& from, const std::vector<Pieces>& to) {
  Comm& comm = mesh.comm(mesh_dim);
  const int64_t n = comm.size(), me = comm.rank();
  std::vector<int64_t> shape = local.sizes().vec();
  shape[seq_dim] = length(to[me]);
  const at::Tensor out = at::empty(shape, local.options());
  for (const Part& p : parts_between(me, me, from, to))
    out.narrow(seq_dim, p.to_start, p.size).copy_(local.narrow(seq_dim, p.from_start, p.size));

  bool any_moves = false;  // decided from `from` and `to` alone: alike on every rank
  for (int64_t a = 0; a < n && !any_moves; ++a)
    for (int64_t b = 0; b < n && !any_moves; ++b) any_moves = a != b && !parts_between(a, b, from, to).empty();
  if (!any_moves) return out;

  int64_t sequence = 0, widest = 0;  // alike on every rank, as above
  for (int64_t r = 0; r < n; ++r) sequence += length(from[r]), widest = std::max(widest, length(to[r]));
  const std::vector<int64_t> local_shape = local.sizes().vec(), out_shape = out.sizes().vec();
  std::vector<PeerPart> parts;
  for (int64_t peer = 0; peer < n; ++peer) {
    if (peer == me) continue;
    for (const Part& p : parts_between(me, peer, from, to)) {
      const Box part = box_along(local_shape, seq_dim, sequence + p.at, p.size);
      parts.push_back({me, peer, part, box_along(local_shape, seq_dim, sequence + p.at - p.from_start, local_shape[seq_dim]), Box{}});
    }
    for (const Part& p : parts_between(peer, me, from, to)) {
      const Box part = box_along(out_shape, seq_dim, sequence + p.at, p.size);
      parts.push_back({peer, me, part, part, box_along(out_shape, seq_dim, sequence + p.at - p.to_start, out_shape[seq_dim])});
    }
  }
  int64_t position_bytes = static_cast<int64_t>(local.element_size());  // alike on the group's ranks
  for (int64_t d = 0; d < local.dim(); ++d)
    if (d != seq_dim) position_bytes *= local.size(d);
  move_parts(comm, exchange_transport(mesh, widest * position_bytes, local.is_cpu(), "zigzag"),
             PartExchange{std::move(parts), local, out, "zigzag"});
  return out;
}

struct Geometry {
  ShardTensorSpec ordered, zigzagged;  // the sequence split along mesh_dim in order, and as zigzag chunks
  std::vector<Pieces> ordered_pieces, zigzag_pieces;
};

// Checks the arguments (alike on every rank: they read specs only) and lays out both orders.
// The in-order split keeps the tensor's sizes where the mesh dim already splits the sequence,
// and takes torch.chunk's otherwise.
Geometry geometry(const char* api, const ShardTensorSpec& s, int64_t mesh_dim, int64_t& seq_dim) {
  const DeviceMesh& mesh = s.mesh();
  TORCH_CHECK_VALUE(mesh_dim >= 0 && mesh_dim < mesh.ndim(), api, ": mesh_dim ", mesh_dim, " is not a dim of ", mesh, " (0 to ",
              mesh.ndim() - 1, ").");
  TORCH_CHECK_VALUE(seq_dim >= -s.ndim() && seq_dim < s.ndim(), api, ": seq_dim ", seq_dim, " is not a dim of the ", s.ndim(),
              "-d tensor ", s, ".");
  if (seq_dim < 0) seq_dim += s.ndim();
  for (int64_t m = 0; m < mesh.ndim(); ++m)
    TORCH_CHECK_VALUE(m == mesh_dim || !s.placements()[m].is_shard(seq_dim), api, ": mesh dim ", m, " also splits the sequence (dim ",
                seq_dim, ") of ", s, "; only mesh dim ", mesh_dim, " may. Redistribute that mesh dim first.");
  const int64_t n = mesh.size(mesh_dim), seq_length = s.shape()[seq_dim];
  Placements ps = s.placements();
  ps[mesh_dim] = Shard(seq_dim);
  const ShardTensorSpec ordered = with_placements(s, ps);
  return {ordered, with_dim_sizes(ordered, seq_dim, zigzag_shard_sizes(seq_length, n)), contiguous_pieces(ordered.sharding_of(seq_dim)->sizes),
          zigzag_pieces(seq_length, n)};
}

at::Tensor moved(const at::Tensor& t, int64_t mesh_dim, int64_t seq_dim, const ShardTensorSpec& target, const std::vector<Pieces>& from,
                 const std::vector<Pieces>& to) {
  const DeviceMesh& mesh = spec(t).mesh();
  const at::Tensor& local = shard_tensor_impl(t)->local();
  if (!mesh.includes_this_rank()) return new_shard_tensor(local, target);  // no piece here, and no part in the batch
  return new_shard_tensor(move_sequence(local, seq_dim, mesh, mesh_dim, from, to), target);
}

// The positions this rank keeps of a sequence it holds whole (replicated along the mesh dim).
at::Tensor cut(const at::Tensor& whole, int64_t seq_dim, const Pieces& pieces) {
  std::vector<at::Tensor> parts;
  for (const Range& p : pieces) parts.push_back(whole.narrow(seq_dim, p.begin, p.size()));
  return at::cat(parts, seq_dim);
}

}  // namespace

at::Tensor zigzag_shard(const at::Tensor& t, int64_t mesh_dim, int64_t seq_dim) {
  const ShardTensorSpec& s = spec(t);
  const Geometry g = geometry("zigzag_shard", s, mesh_dim, seq_dim);
  at::Tensor out;
  if (s.placements()[mesh_dim].is_replicate() && s.mesh().includes_this_rank()) {  // each rank cuts its chunks out: nothing moves
    const int64_t me = s.mesh().coordinate()[mesh_dim];
    out = new_shard_tensor(cut(shard_tensor_impl(t)->local(), seq_dim, g.zigzag_pieces[me]), g.zigzagged);
  } else {
    const at::Tensor ordered = move_to(t.detach(), g.ordered);
    out = moved(ordered, mesh_dim, seq_dim, g.zigzagged, g.ordered_pieces, g.zigzag_pieces);
  }
  const ShardTensorSpec grad_target = gradient_layout(s);
  return attach_grad_fn(
      out, t,
      [g, grad_target, mesh_dim, seq_dim](const at::Tensor& grad) {
        const at::Tensor zz = spec(grad) == g.zigzagged ? grad : move_to(grad, g.zigzagged);
        return move_to(moved(zz, mesh_dim, seq_dim, g.ordered, g.zigzag_pieces, g.ordered_pieces), grad_target);
      },
      "ZigzagShardBackward");
}

at::Tensor zigzag_unshard(const at::Tensor& t, int64_t mesh_dim, int64_t seq_dim) {
  const ShardTensorSpec& s = spec(t);
  Geometry g = geometry("zigzag_unshard", s, mesh_dim, seq_dim);
  TORCH_CHECK_VALUE(s == g.zigzagged, "zigzag_unshard: expects a tensor laid out by zigzag_shard along mesh dim ", mesh_dim,
              " (the sequence, dim ", seq_dim, ", split in the sizes ", join(g.zigzagged.sharding_of(seq_dim)->sizes, ","), "); got ", s,
              ".");
  const int64_t n = s.mesh().size(mesh_dim);
  g.ordered = with_dim_sizes(g.ordered, seq_dim, chunk_sizes(s.shape()[seq_dim], n));
  g.ordered_pieces = contiguous_pieces(g.ordered.sharding_of(seq_dim)->sizes);
  const at::Tensor out = moved(t.detach(), mesh_dim, seq_dim, g.ordered, g.zigzag_pieces, g.ordered_pieces);
  return attach_grad_fn(
      out, t,
      [g, mesh_dim, seq_dim](const at::Tensor& grad) {
        const at::Tensor ordered = spec(grad) == g.ordered ? grad : move_to(grad, g.ordered);
        return moved(ordered, mesh_dim, seq_dim, g.zigzagged, g.ordered_pieces, g.zigzag_pieces);
      },
      "ZigzagUnshardBackward");
}

}  // namespace shardtensor
