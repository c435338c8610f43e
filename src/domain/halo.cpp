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

// One all-to-all on the axis's group: to every other group rank q the tensors send(q) (shaped
// like `like` but for `dim`), concatenated; from q, parts of the lengths recv(q), in order.
template <typename Send, typename Recv>
std::vector<std::vector<at::Tensor>> exchange(const at::Tensor& like, const HaloAxis& axis, const DeviceMesh& mesh, Send send,
                                              Recv recv) {
  const int64_t dim = axis.tensor_dim, me = axis.me(mesh), peers = static_cast<int64_t>(axis.owned.size());
  const int64_t slab_size = slab_elements(like, dim);
  std::vector<int64_t> send_splits(peers, 0), recv_splits(peers, 0);
  std::vector<std::vector<int64_t>> recv_lengths(peers);
  std::vector<at::Tensor> to_send;
  for (int64_t q = 0; q < peers; ++q) {
    if (q == me) continue;
    for (const at::Tensor& part : send(q)) {
      send_splits[q] += part.numel();
      to_send.push_back(part.reshape({-1}));
    }
    recv_lengths[q] = recv(q);
    for (int64_t n : recv_lengths[q]) recv_splits[q] += n * slab_size;
  }
  int64_t recv_total = 0;
  for (int64_t n : recv_splits) recv_total += n;
  const at::Tensor sent = to_send.empty() ? at::empty({0}, like.options()) : at::cat(to_send);
  const at::Tensor received = at::empty({recv_total}, like.options());
  mesh.comm(axis.mesh_dim).all_to_all(received, sent, recv_splits, send_splits);
  std::vector<std::vector<at::Tensor>> parts(peers);
  int64_t offset = 0;
  for (int64_t q = 0; q < peers; ++q)
    for (int64_t n : recv_lengths[q]) {  // (a part may hold 0 elements when another dim is empty)
      parts[q].push_back(received.narrow(0, offset, n * slab_size).view(with_dim(like, dim, n)));
      offset += n * slab_size;
    }
  return parts;
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
          std::vector<at::Tensor> parts;
          for (const InField& run : in_field_runs(axis.window[q], axis.length, axis.periodic))
            if (intersect(run.field, mine).size()) parts.push_back(slab(owned_piece, dim, mine, intersect(run.field, mine)));
          return parts;
        },
        [&](int64_t q) {  // what my window needs from q's rows
          std::vector<int64_t> lengths;
          for (const InField& run : runs)
            if (intersect(run.field, axis.owned[q]).size()) lengths.push_back(intersect(run.field, axis.owned[q]).size());
          return lengths;
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
    return window_piece.narrow(dim, run.offset + part.begin - run.field.begin, part.size());
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
          std::vector<at::Tensor> parts;
          for (const InField& run : runs)
            if (intersect(run.field, axis.owned[q]).size()) parts.push_back(values_at(run, intersect(run.field, axis.owned[q])));
          return parts;
        },
        [&](int64_t q) {  // q's window values that I own
          std::vector<int64_t> lengths;
          for (const InField& run : in_field_runs(axis.window[q], axis.length, axis.periodic))
            if (intersect(run.field, mine).size()) lengths.push_back(intersect(run.field, mine).size());
          return lengths;
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
