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

Range shifted(Range r, int64_t by) { return {r.begin + by, r.end + by}; }

// Where the field positions `part` of `run` lie in the window that `run` belongs to.
Range in_window(const InField& run, Range part) { return shifted(part, run.offset - run.field.begin); }

// The stretches of positions an exchange moves along the axis's tensor dim, each counted from
// the start of the tensor that holds it.
using Stretches = std::vector<Range>;

// The box of a tensor shaped like `like` that covers `along` on `dim` and all of the other dims:
// the coordinates in which a holder offers a stretch and its receiver asks for it.
Box box_along(const at::Tensor& like, int64_t dim, Range along) {
  Box box{std::vector<int64_t>(like.dim(), 0), like.sizes().vec()};
  box.offsets[dim] = along.begin;
  box.shape[dim] = along.size();
  return box;
}

// One exchange on the axis's group: every other group rank q gets the stretches sends(q) of
// `source` (in order), and this rank gets the stretches receives(q) of q's source. Returns
// what arrived from each q, in order, each shaped like `source` but along the dim. Through
// peer memory where the mesh's transport options choose it, else one all-to-all with split
// sizes (redistribute/transports/part_transport.h).
template <typename Sends, typename Receives>
std::vector<std::vector<at::Tensor>> exchange(const at::Tensor& source, const HaloAxis& axis, const DeviceMesh& mesh,
                                              Sends sends_to, Receives receives_from) {
  const int64_t dim = axis.tensor_dim, me = axis.me(mesh), peers = static_cast<int64_t>(axis.owned.size());
  std::vector<Stretches> receives(peers);
  std::vector<std::vector<int64_t>> landing(peers);  // where each received stretch lands along dim
  std::vector<PeerPart> parts;
  const Box holds = box_along(source, dim, {0, source.size(dim)});
  int64_t arrived = 0;
  for (int64_t q = 0; q < peers; ++q) {
    if (q == me) continue;
    for (const Range& r : sends_to(q)) parts.push_back({me, q, box_along(source, dim, r), holds, {}});
    receives[q] = receives_from(q);
    for (const Range& r : receives[q]) {
      landing[q].push_back(arrived);
      arrived += r.size();
    }
  }
  const at::Tensor into = at::empty(with_dim(source, dim, arrived), source.options());
  for (int64_t q = 0; q < peers; ++q)
    for (size_t k = 0; k < receives[q].size(); ++k) {
      // `into` seen in the holder's coordinates: it holds this stretch at landing[q][k].
      const Range r = receives[q][k];
      const Box part = box_along(into, dim, r);
      parts.push_back({q, me, part, part, box_along(into, dim, {r.begin - landing[q][k], r.begin - landing[q][k] + into.size(dim)})});
    }
  // Equal on every member: the widest window's bytes (the layout's, not this rank's).
  int64_t widest = 0;
  for (const Range& w : axis.window) widest = std::max(widest, w.size());
  const int64_t bytes = slab_elements(source, dim) * widest * static_cast<int64_t>(source.element_size());
  const bool through_memory = source.is_cpu() && uses_peer_memory(mesh, bytes);
  move_parts(mesh.comm(axis.mesh_dim), {through_memory ? Transport::PeerMemory : Transport::Collective, "all_to_all", "all_to_all"},
             PartExchange{std::move(parts), source, into});
  std::vector<std::vector<at::Tensor>> arrived_from(peers);
  for (int64_t q = 0; q < peers; ++q)
    for (size_t k = 0; k < receives[q].size(); ++k) arrived_from[q].push_back(into.narrow(dim, landing[q][k], receives[q][k].size()));
  return arrived_from;
}

}  // namespace




at::Tensor gather_window(const at::Tensor& owned_piece, const HaloAxis& axis, const DeviceMesh& mesh, double fill) {
  const int64_t dim = axis.tensor_dim, me = axis.me(mesh);
  const Range mine = axis.owned[me], want = axis.window[me];
  TORCH_INTERNAL_ASSERT(owned_piece.size(dim) == mine.size(), "gather_window: the local piece has ", owned_piece.size(dim),
                        " positions along dim ", dim, ", the layout says ", mine.size());
  const std::vector<InField> runs = in_field_runs(want, axis.length, axis.periodic);
  std::vector<std::vector<at::Tensor>> received;
  if (axis.mesh_dim >= 0 && axis.crosses_shards()) {
    received = exchange(
        owned_piece, axis, mesh,
        [&](int64_t q) {  // what q's window needs from my rows
          Stretches stretches;
          for (const InField& run : in_field_runs(axis.window[q], axis.length, axis.periodic))
            if (intersect(run.field, mine).size()) stretches.push_back(shifted(intersect(run.field, mine), -mine.begin));
          return stretches;
        },
        [&](int64_t q) {  // what my window needs from q's rows
          Stretches stretches;
          for (const InField& run : runs)
            if (intersect(run.field, axis.owned[q]).size())
              stretches.push_back(shifted(intersect(run.field, axis.owned[q]), -axis.owned[q].begin));
          return stretches;
        });
  }

  std::vector<at::Tensor> parts;
  std::vector<size_t> next(axis.owned.size(), 0);
  int64_t filled = 0;  // window positions assembled so far
  auto pad_to = [&](int64_t offset) {
    if (offset > filled) parts.push_back(at::full(with_dim(owned_piece, dim, offset - filled), fill, owned_piece.options()));
    filled = std::max(filled, offset);
  };
  for (const InField& run : runs) {
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

at::Tensor scatter_add_window(const at::Tensor& window_piece, const HaloAxis& axis, const DeviceMesh& mesh) {
  const int64_t dim = axis.tensor_dim, me = axis.me(mesh);
  const Range mine = axis.owned[me], have = axis.window[me];
  TORCH_INTERNAL_ASSERT(window_piece.size(dim) == have.size(), "scatter_add_window: the window has ", window_piece.size(dim),
                        " positions along dim ", dim, ", the plan says ", have.size());
  at::Tensor result = at::zeros(with_dim(window_piece, dim, mine.size()), window_piece.options());
  // The window piece's values at the field positions `part` of `run`.
  auto values_at = [&](const InField& run, Range part) {
    const Range stretch = in_window(run, part);
    return window_piece.narrow(dim, stretch.begin, stretch.size());
  };
  const std::vector<InField> runs = in_field_runs(have, axis.length, axis.periodic);
  for (const InField& run : runs) {
    const Range own = intersect(run.field, mine);
    if (own.size()) slab(result, dim, mine, own).add_(values_at(run, own));
  }
  if (axis.mesh_dim >= 0 && axis.crosses_shards()) {
    const std::vector<std::vector<at::Tensor>> received = exchange(
        window_piece, axis, mesh,
        [&](int64_t q) {  // my window's values that q owns
          Stretches stretches;
          for (const InField& run : runs)
            if (intersect(run.field, axis.owned[q]).size()) stretches.push_back(in_window(run, intersect(run.field, axis.owned[q])));
          return stretches;
        },
        [&](int64_t q) {  // q's window values that I own
          Stretches stretches;
          for (const InField& run : in_field_runs(axis.window[q], axis.length, axis.periodic))
            if (intersect(run.field, mine).size()) stretches.push_back(in_window(run, intersect(run.field, mine)));
          return stretches;
        });
    for (size_t q = 0; q < received.size(); ++q) {
      if (static_cast<int64_t>(q) == me) continue;
      size_t k = 0;
      for (const InField& run : in_field_runs(axis.window[q], axis.length, axis.periodic))
        if (intersect(run.field, mine).size()) slab(result, dim, mine, intersect(run.field, mine)).add_(received[q][k++]);
    }
  }
  return result;
}

at::Tensor gather_windows(const HaloPlan& plan, at::Tensor owned, double fill) {
  for (const HaloAxis& axis : plan.axes) owned = gather_window(owned, axis, plan.mesh, fill);
  return owned;
}

at::Tensor scatter_add_windows(const HaloPlan& plan, at::Tensor window) {
  for (auto it = plan.axes.rbegin(); it != plan.axes.rend(); ++it) window = scatter_add_window(window, *it, plan.mesh);
  return window;
}

}  // namespace shardtensor
