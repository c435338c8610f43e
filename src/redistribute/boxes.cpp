// See boxes.h.
#include "redistribute/boxes.h"

#include <algorithm>

#include "spec/sequence_order.h"

namespace shardtensor {

int64_t Box::numel() const {
  if (nothing) return 0;
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Box box_of(const ShardTensorSpec& spec, const std::vector<int64_t>& coordinate) {
  return Box{spec.local_offsets(coordinate), spec.local_shape(coordinate)};
}

Box box_in_piece_order(const ShardTensorSpec& spec, const std::vector<int64_t>& coordinate) {
  Box box{std::vector<int64_t>(spec.ndim(), 0), spec.local_shape(coordinate)};
  for (const DimSharding& s : spec.shardings()) box.offsets[s.tensor_dim] = s.offsets[s.piece_index(spec.mesh().shape(), coordinate)];
  return box;
}

std::vector<Stretch> stretches_of(const ShardTensorSpec& spec, const std::vector<int64_t>& coordinate) {
  const int64_t ndim = spec.ndim();
  std::vector<Stretch> out{{Box{std::vector<int64_t>(ndim, 0), spec.shape()}, std::vector<int64_t>(ndim, 0)}};
  for (const DimSharding& s : spec.shardings()) {
    const Pieces pieces = stretches_held(spec, s, coordinate);
    const std::vector<int64_t> starts = local_starts(pieces);
    std::vector<Stretch> cut;
    for (const Stretch& whole : out)
      for (size_t k = 0; k < pieces.size(); ++k) {
        Stretch piece = whole;
        piece.global.offsets[s.tensor_dim] = pieces[k].begin;
        piece.global.shape[s.tensor_dim] = pieces[k].size();
        piece.local_start[s.tensor_dim] = starts[k];
        cut.push_back(std::move(piece));
      }
    out = std::move(cut);
  }
  return out;
}

Box box_along(const std::vector<int64_t>& shape, int64_t dim, int64_t begin, int64_t size) {
  Box box{std::vector<int64_t>(shape.size(), 0), shape};
  box.offsets[dim] = begin;
  box.shape[dim] = size;
  return box;
}

Box intersect(const Box& a, const Box& b) {
  Box out;
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const int64_t hi = std::min(a.offsets[d] + a.shape[d], b.offsets[d] + b.shape[d]);
    out.offsets.push_back(lo);
    out.shape.push_back(std::max<int64_t>(hi - lo, 0));
  }
  return out;
}

bool feeds(const ShardTensorSpec& source, const std::vector<int64_t>& sender, const std::vector<int64_t>& receiver) {
  const Placements& ps = source.placements();
  for (size_t m = 0; m < ps.size(); ++m)
    if (!ps[m].is_shard() && sender[m] != receiver[m]) return false;
  return true;
}

std::vector<std::vector<int64_t>> members_along(const DeviceMesh& mesh, int64_t mesh_dim) {
  std::vector<std::vector<int64_t>> members;
  if (mesh_dim < 0) {
    for (int64_t rank : mesh.ranks()) members.push_back(mesh.coordinate_of(rank));
    return members;
  }
  std::vector<int64_t> member = mesh.coordinate();
  for (int64_t i = 0; i < mesh.size(mesh_dim); ++i) {
    member[mesh_dim] = i;
    members.push_back(member);
  }
  return members;
}

}  // namespace shardtensor
