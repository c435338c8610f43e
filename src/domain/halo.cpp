#include "domain/halo.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "comm/comm.h"
#include "redistribute/boxes.h"
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

// Runs one lowered exchange on the axis's group: every other group rank q gets the
// stretches x.sends[q] of `source`, and this rank gets x.receives[q] of q's source. Returns what
// arrived from each q, in order, each shaped like `source` but along the dim, by the transport
// the options in force choose (redistribute/transport.h: exchange_transport).
std::vector<std::vector<at::Tensor>> exchange(const at::Tensor& source, const LoweredHaloAxis& lowered, const HaloExchange& x,
                                              const DeviceMesh& mesh) {
  const int64_t dim = lowered.axis.tensor_dim, me = lowered.me, peers = static_cast<int64_t>(x.sends.size());
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
  // Equal on every member: the widest window's bytes (the layout's, not this rank's).
  const int64_t bytes = slab_elements(source, dim) * lowered.widest_window * static_cast<int64_t>(source.element_size());
  move_parts(mesh.comm(lowered.axis.mesh_dim), exchange_transport(mesh, bytes, source.is_cpu(), "all_to_all"),
             PartExchange{std::move(parts), source, into});
  return arrived_from;
}

}  // namespace




// Every rank lowers the kernels of the ops it runs, a rank outside the mesh too (which then
// runs none, dispatch/kernel.cpp): it has no place in the axis, and nothing to lower.
LoweredHaloAxis::LoweredHaloAxis(HaloAxis halo_axis, const DeviceMesh& mesh)
    : axis(std::move(halo_axis)),
      me(mesh.includes_this_rank() ? axis.me(mesh) : -1),
      exchanges(me >= 0 && axis.mesh_dim >= 0 && axis.crosses_shards()),
      widest_window(0) {
  for (const Range& w : axis.window) widest_window = std::max(widest_window, w.size());
  if (!exchanges) return;
  gather = gather_exchange(axis, me);
  scatter_add = scatter_add_exchange(axis, me);
}

LoweredHalo::LoweredHalo(const HaloPlan& plan) : mesh(plan.mesh) {
  for (const HaloAxis& axis : plan.axes) axes.emplace_back(axis, mesh);
}

at::Tensor gather_window(const at::Tensor& owned_piece, const LoweredHaloAxis& lowered, const DeviceMesh& mesh, double fill) {
  const HaloAxis& axis = lowered.axis;
  const int64_t dim = axis.tensor_dim, me = lowered.me;
  const Range mine = axis.owned[me], want = axis.window[me];
  TORCH_INTERNAL_ASSERT(owned_piece.size(dim) == mine.size(), "gather_window: the local piece has ", owned_piece.size(dim),
                        " positions along dim ", dim, ", the layout says ", mine.size());
  std::vector<std::vector<at::Tensor>> received;
  if (lowered.exchanges) received = exchange(owned_piece, lowered, lowered.gather, mesh);

  // The window in order: fill, this rank's own positions, and what arrived (listed by the
  // exchange in the window's order).
  std::vector<at::Tensor> parts;
  std::vector<size_t> next(axis.owned.size(), 0);
  int64_t filled = 0;  // window positions assembled so far
  auto pad_to = [&](int64_t offset) {
    if (offset > filled) parts.push_back(at::full(with_dim(owned_piece, dim, offset - filled), fill, owned_piece.options()));
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

at::Tensor scatter_add_window(const at::Tensor& window_piece, const LoweredHaloAxis& lowered, const DeviceMesh& mesh) {
  const HaloAxis& axis = lowered.axis;
  const int64_t dim = axis.tensor_dim;
  const Range mine = axis.owned[lowered.me], have = axis.window[lowered.me];
  TORCH_INTERNAL_ASSERT(window_piece.size(dim) == have.size(), "scatter_add_window: the window has ", window_piece.size(dim),
                        " positions along dim ", dim, ", the plan says ", have.size());
  at::Tensor result = at::zeros(with_dim(window_piece, dim, mine.size()), window_piece.options());
  for (const InField& run : in_field_runs(have, axis.length, axis.periodic)) {
    const Range own = intersect(run.field, mine);
    if (own.size()) slab(result, dim, mine, own).add_(window_piece.narrow(dim, run.offset + own.begin - run.field.begin, own.size()));
  }
  if (lowered.exchanges) {
    const std::vector<std::vector<at::Tensor>> received = exchange(window_piece, lowered, lowered.scatter_add, mesh);
    for (size_t q = 0; q < received.size(); ++q)
      for (size_t k = 0; k < received[q].size(); ++k)
        slab(result, dim, mine, lowered.scatter_add.received_fields[q][k]).add_(received[q][k]);
  }
  return result;
}

at::Tensor gather_windows(const LoweredHalo& halo, at::Tensor owned, double fill) {
  for (const LoweredHaloAxis& axis : halo.axes) owned = gather_window(owned, axis, halo.mesh, fill);
  return owned;
}

at::Tensor scatter_add_windows(const LoweredHalo& halo, at::Tensor window) {
  for (auto it = halo.axes.rbegin(); it != halo.axes.rend(); ++it) window = scatter_add_window(window, *it, halo.mesh);
  return window;
}

}  // namespace shardtensor
