#include "domain/halo.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "comm/comm.h"

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

// One all-to-all on the axis's group: to every other group rank q, the part of `mine` (which
// covers `my_cover`) at send_range(q); from q, the positions recv_range(q), as tensors shaped
// like `mine` with the dim resized (empty parts come back undefined).
template <typename SendRange, typename RecvRange>
std::vector<at::Tensor> exchange(const at::Tensor& mine, Range my_cover, const HaloAxis& axis, const DeviceMesh& mesh,
                                 SendRange send_range, RecvRange recv_range) {
  const int64_t dim = axis.tensor_dim, me = axis.me(mesh), peers = static_cast<int64_t>(axis.owned.size());
  const int64_t slab_size = slab_elements(mine, dim);
  std::vector<int64_t> send_splits(peers, 0), recv_splits(peers, 0);
  std::vector<at::Tensor> to_send;
  for (int64_t q = 0; q < peers; ++q) {
    if (q == me) continue;
    const Range part = send_range(q);
    send_splits[q] = part.size() * slab_size;
    if (part.size()) to_send.push_back(slab(mine, dim, my_cover, part).reshape({-1}));
    recv_splits[q] = recv_range(q).size() * slab_size;
  }
  int64_t recv_total = 0;
  for (int64_t n : recv_splits) recv_total += n;
  const at::Tensor send = to_send.empty() ? at::empty({0}, mine.options()) : at::cat(to_send);
  const at::Tensor recv = at::empty({recv_total}, mine.options());
  mesh.comm(axis.mesh_dim).all_to_all(recv, send, recv_splits, send_splits);
  std::vector<at::Tensor> parts(peers);
  int64_t offset = 0;
  for (int64_t q = 0; q < peers; ++q) {
    if (q == me || !recv_range(q).size()) continue;  // (a part may hold 0 elements when another dim is empty)
    parts[q] = recv.narrow(0, offset, recv_splits[q]).view(with_dim(mine, dim, recv_range(q).size()));
    offset += recv_splits[q];
  }
  return parts;
}

}  // namespace

Range intersect(Range a, Range b) { return {std::max(a.begin, b.begin), std::max(std::max(a.begin, b.begin), std::min(a.end, b.end))}; }

bool HaloAxis::crosses_shards() const {
  for (size_t q = 0; q < window.size(); ++q)
    for (size_t r = 0; r < owned.size(); ++r)
      if (q != r && intersect(window[q], owned[r]).size()) return true;
  return false;
}

at::Tensor gather_window(const at::Tensor& owned_piece, const HaloAxis& axis, const DeviceMesh& mesh, double fill) {
  const int64_t dim = axis.tensor_dim, me = axis.me(mesh);
  const Range mine = axis.owned[me], want = axis.window[me];
  TORCH_INTERNAL_ASSERT(owned_piece.size(dim) == mine.size(), "gather_window: the local piece has ", owned_piece.size(dim),
                        " positions along dim ", dim, ", the layout says ", mine.size());
  std::vector<at::Tensor> received;
  if (axis.mesh_dim >= 0 && axis.crosses_shards())
    received = exchange(owned_piece, mine, axis, mesh, [&](int64_t q) { return intersect(mine, axis.window[q]); },
                        [&](int64_t q) { return intersect(axis.owned[q], want); });

  std::vector<at::Tensor> parts;
  const int64_t below = std::max<int64_t>(0, std::min<int64_t>(want.end, 0) - want.begin);
  const int64_t above = std::max<int64_t>(0, want.end - std::max(want.begin, axis.length));
  if (below) parts.push_back(at::full(with_dim(owned_piece, dim, below), fill, owned_piece.options()));
  for (size_t q = 0; q < axis.owned.size(); ++q) {
    const Range part = intersect(axis.owned[q], want);
    if (!part.size()) continue;
    parts.push_back(static_cast<int64_t>(q) == me ? slab(owned_piece, dim, mine, part) : received[q]);
  }
  if (above) parts.push_back(at::full(with_dim(owned_piece, dim, above), fill, owned_piece.options()));
  if (parts.empty()) return at::empty(with_dim(owned_piece, dim, 0), owned_piece.options());
  return parts.size() == 1 ? parts[0] : at::cat(parts, dim);
}

at::Tensor scatter_add_window(const at::Tensor& window_piece, const HaloAxis& axis, const DeviceMesh& mesh) {
  const int64_t dim = axis.tensor_dim, me = axis.me(mesh);
  const Range mine = axis.owned[me], have = axis.window[me];
  TORCH_INTERNAL_ASSERT(window_piece.size(dim) == have.size(), "scatter_add_window: the window has ", window_piece.size(dim),
                        " positions along dim ", dim, ", the plan says ", have.size());
  at::Tensor result = at::zeros(with_dim(window_piece, dim, mine.size()), window_piece.options());
  const Range own_part = intersect(have, mine);
  if (own_part.size()) slab(result, dim, mine, own_part).add_(slab(window_piece, dim, have, own_part));
  if (axis.mesh_dim >= 0 && axis.crosses_shards()) {
    const std::vector<at::Tensor> received =
        exchange(window_piece, have, axis, mesh, [&](int64_t q) { return intersect(have, axis.owned[q]); },
                 [&](int64_t q) { return intersect(axis.window[q], mine); });
    for (size_t q = 0; q < received.size(); ++q)
      if (received[q].defined()) slab(result, dim, mine, intersect(axis.window[q], mine)).add_(received[q]);
  }
  return result;
}

}  // namespace shardtensor
