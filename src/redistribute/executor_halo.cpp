// The halo steps' part of LoweredStep::apply (lowered_step.h): a window gathered from this
// rank's owned piece and its neighbours' stretches, and its adjoint, which sends window pieces
// back to their owners and adds them. Which stretches move was lowered with the axis
// (spec/halo_geometry.h: LoweredHaloAxis); a call assembles and moves bytes only, through the
// one transport seam (transports/part_transport.h).
#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "comm/comm.h"
#include "redistribute/boxes.h"
#include "redistribute/lowered_step.h"
#include "redistribute/transport.h"
#include "redistribute/transports/part_transport.h"

namespace shardtensor {
namespace {

std::vector<int64_t> with_dim(const at::Tensor& t, int64_t dim, int64_t size) {
  std::vector<int64_t> shape = t.sizes().vec();
  shape[dim] = size;
  return shape;
}

// Elements in one position of `dim` (the product of the other dims).
int64_t slab_elements(const at::Tensor& t, int64_t dim) {
  int64_t n = 1;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (d != dim) n *= t.size(d);
  return n;
}

// The part of `t` (covering `covers` along `dim`) at the global positions `part`.
at::Tensor slab(const at::Tensor& t, int64_t dim, Range covers, Range part) {
  return t.narrow(dim, part.begin - covers.begin, part.size());
}

// The box of a tensor shaped like `like` that covers `along` on `dim` and all of the other dims:
// the coordinates in which a holder offers a stretch and its receiver asks for it.
Box box_along(const at::Tensor& like, int64_t dim, Range along) {
  return shardtensor::box_along(like.sizes().vec(), dim, along.begin, along.size());
}

}  // namespace

int64_t LoweredStep::bytes_per_member(const at::Tensor& piece) const {
  TORCH_INTERNAL_ASSERT(halo_, to_string(step_), " is not a halo step");
  // The widest window's (the layout's, not this rank's): equal on every member.
  const int64_t dim = halo_->axis.tensor_dim;
  return slab_elements(piece, dim) * halo_->widest_window * static_cast<int64_t>(piece.element_size());
}

// One lowered exchange on the axis's group: every other group rank q gets the stretches
// x.sends[q] of `source`, and this rank gets x.receives[q] of q's source. Returns what arrived
// from each q, in order, each shaped like `source` but along the dim.
std::vector<std::vector<at::Tensor>> LoweredStep::exchange_stretches(const at::Tensor& source, const HaloExchange& x,
                                                                     const DeviceMesh& mesh, const StepTransport& how) const {
  const int64_t dim = halo_->axis.tensor_dim, me = halo_->me, peers = static_cast<int64_t>(x.sends.size());
  std::vector<PeerPart> parts;
  const Box holds = box_along(source, dim, {0, source.size(dim)});
  int64_t arrived = 0;
  for (int64_t q = 0; q < peers; ++q) {
    for (const Range& r : x.sends[q]) parts.push_back({me, q, box_along(source, dim, r), holds, {}});
    for (const Range& r : x.receives[q]) arrived += r.size();
  }
  const at::Tensor into = at::empty(with_dim(source, dim, arrived), source.options());
  std::vector<std::vector<at::Tensor>> arrived_from(peers);
  int64_t landing = 0;  // where the next received stretch lands along dim
  for (int64_t q = 0; q < peers; ++q)
    for (const Range& r : x.receives[q]) {
      // `into` seen in the holder's coordinates: it holds this stretch at `landing`.
      const Box part = box_along(into, dim, r);
      parts.push_back({q, me, part, part, box_along(into, dim, {r.begin - landing, r.begin - landing + into.size(dim)})});
      arrived_from[q].push_back(into.narrow(dim, landing, r.size()));
      landing += r.size();
    }
  move_parts(mesh.comm(halo_->axis.mesh_dim), how, PartExchange{std::move(parts), source, into, how.counted_as});
  return arrived_from;
}

at::Tensor LoweredStep::gather_window(const at::Tensor& owned_piece, const DeviceMesh& mesh, const StepTransport& how) const {
  const HaloAxis& axis = halo_->axis;
  const int64_t dim = axis.tensor_dim, me = halo_->me;
  const Range mine = axis.owned[me], want = axis.window[me];
  TORCH_INTERNAL_ASSERT(owned_piece.size(dim) == mine.size(), "gather_window: the local piece has ", owned_piece.size(dim),
                        " positions along dim ", dim, ", the layout says ", mine.size());
  std::vector<std::vector<at::Tensor>> received;
  if (halo_->exchanges) received = exchange_stretches(owned_piece, halo_->gather, mesh, how);

  // The window in order: fill, this rank's own positions, and what arrived (listed by the
  // exchange in the window's order).
  std::vector<at::Tensor> parts;
  std::vector<size_t> next(axis.owned.size(), 0);
  int64_t filled = 0;  // window positions assembled so far
  auto pad_to = [&](int64_t offset) {
    if (offset > filled) parts.push_back(at::full(with_dim(owned_piece, dim, offset - filled), fill_, owned_piece.options()));
    filled = std::max(filled, offset);
  };
  for (const InField& run : in_field_runs(want, axis.length, axis.periodic)) {
    pad_to(run.offset);
    for (size_t q = 0; q < axis.owned.size(); ++q) {
      const Range part = intersect(run.field, axis.owned[q]);
      if (!part.size()) continue;
      parts.push_back(static_cast<int64_t>(q) == me ? slab(owned_piece, dim, mine, part) : received[q][next[q]++]);
    }
    filled += run.field.size();
  }
  pad_to(want.size());
  if (parts.empty()) return at::empty(with_dim(owned_piece, dim, 0), owned_piece.options());
  return parts.size() == 1 ? parts[0] : at::cat(parts, dim);
}

at::Tensor LoweredStep::scatter_add_window(const at::Tensor& window_piece, const DeviceMesh& mesh, const StepTransport& how) const {
  const HaloAxis& axis = halo_->axis;
  const int64_t dim = axis.tensor_dim;
  const Range mine = axis.owned[halo_->me], have = axis.window[halo_->me];
  TORCH_INTERNAL_ASSERT(window_piece.size(dim) == have.size(), "scatter_add_window: the window has ", window_piece.size(dim),
                        " positions along dim ", dim, ", the plan says ", have.size());
  at::Tensor result = at::zeros(with_dim(window_piece, dim, mine.size()), window_piece.options());
  for (const InField& run : in_field_runs(have, axis.length, axis.periodic)) {
    const Range own = intersect(run.field, mine);
    if (own.size()) slab(result, dim, mine, own).add_(window_piece.narrow(dim, run.offset + own.begin - run.field.begin, own.size()));
  }
  if (halo_->exchanges) {
    const std::vector<std::vector<at::Tensor>> received = exchange_stretches(window_piece, halo_->scatter_add, mesh, how);
    for (size_t q = 0; q < received.size(); ++q)
      for (size_t k = 0; k < received[q].size(); ++k)
        slab(result, dim, mine, halo_->scatter_add.received_fields[q][k]).add_(received[q][k]);
  }
  return result;
}

}  // namespace shardtensor
