// Halo exchange: the data movement of domain parallelism.
//
// A spatial op (convolution, pooling, resampling, padding) computes the outputs a rank owns
// from a *window* of its input that reaches past its own shard. Along one tensor dim split
// over the group of one mesh dim, every rank knows, for every group rank, the range it owns
// and the window it needs (pure functions of the layout, computed by the rules), so each
// rank can send exactly the intersections others need: one all-to-all with split sizes, no
// padding to the largest shard, any shard size (a window may span several neighbours, so
// shards smaller than the halo work), and no collective at all when no window crosses a
// boundary. The adjoint, scatter_add_window, sends window pieces back to their owners and
// adds them: the backward of a gather, and the forward of a transposed convolution.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "shardtensor/device_mesh.h"

namespace shardtensor {

// A half-open range [begin, end) of positions along one dim, in global coordinates.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end > begin ? end - begin : 0; }
};

Range intersect(Range a, Range b);

// Conversions between a shard-size table and the ranges it gives each rank, in order.
std::vector<Range> sizes_to_ranges(const std::vector<int64_t>& sizes);
std::vector<int64_t> range_sizes(const std::vector<Range>& ranges);

// Output ranges of a shift by `shift` positions (padding before the field) into an output of
// `out_length`: rank r owns the outputs opposite its rows; the first rank starts at 0, the
// last ends at out_length.
std::vector<Range> shifted_ranges(const std::vector<Range>& owned, int64_t shift, int64_t out_length);

// One tensor dim as a halo exchange sees it.
struct HaloAxis {
  int64_t tensor_dim = 0;
  int64_t mesh_dim = -1;       // the mesh dim splitting it; -1: whole on every rank
  int64_t length = 0;          // global length of the owned side
  std::vector<Range> owned;    // per group rank (mesh coordinate): a partition of [0, length)
  std::vector<Range> window;   // per group rank: what it needs; may reach outside [0, length)
  bool periodic = false;       // outside [0, length) wraps around (circular padding) instead of filling

  // Whether some rank needs a position another rank owns (else no collective is issued).
  bool crosses_shards() const;
  // This rank's index in `owned` and `window`.
  int64_t me(const DeviceMesh& mesh) const { return mesh_dim < 0 ? 0 : mesh.coordinate()[mesh_dim]; }
};

// This rank's window of `owned_piece` along axis.tensor_dim: the neighbours' pieces arrive by
// one all-to-all on the axis's mesh-dim group; positions outside [0, length) are `fill`, or,
// on a periodic axis, the positions they wrap around to.
at::Tensor gather_window(const at::Tensor& owned_piece, const HaloAxis& axis, const DeviceMesh& mesh, double fill);

// The adjoint: `window_piece` covers this rank's window; every position is added to the rank
// that owns it (positions outside [0, length) are dropped, or wrap around on a periodic axis).
// Returns this rank's owned piece.
at::Tensor scatter_add_window(const at::Tensor& window_piece, const HaloAxis& axis, const DeviceMesh& mesh);

}  // namespace shardtensor
