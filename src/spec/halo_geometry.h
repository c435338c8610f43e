// The geometry of a halo exchange, as pure metadata: which positions of one tensor dim every
// rank owns and which window of them it needs. Rules compute it from specs (rules/spatial.h);
// domain/kernel_moves.h moves the bytes it describes. Nothing here touches tensors or communicates,
// so a rule's halo plan can be checked in one process.
#pragma once

#include <cstdint>
#include <vector>

#include "shardtensor/device_mesh.h"

namespace shardtensor {

// A half-open range [begin, end) of positions along one dim, in global coordinates.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end > begin ? end - begin : 0; }
  bool operator==(const Range& o) const { return begin == o.begin && end == o.end; }
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

// A run of window positions that lies in the field: window positions [offset, offset + n)
// hold the field positions `field` (n = field.size()).
struct InField {
  int64_t offset;
  Range field;
};

// The in-field runs of `window`, in window order: one (clipped) run, or on a periodic axis
// one run per wrap.
std::vector<InField> in_field_runs(Range window, int64_t length, bool periodic);

// One exchange along a halo axis as group rank `me` runs it. For every group rank q: the
// stretches of this rank's tensor that q gets, and the stretches of q's tensor that this rank
// gets, in the order both sides list them, each counted in positions from the start of the
// tensor that holds it; with the field positions each received stretch holds. Pure metadata:
// a kernel lowers its axes once, when its propagation is cached (domain/kernel_moves.h), so a call
// only moves bytes; and a test can check in one process that what one rank sends is what its
// peer expects (tests/unit/halo_geometry_test.cpp).
struct HaloExchange {
  std::vector<std::vector<Range>> sends;            // per group rank q: of this rank's tensor
  std::vector<std::vector<Range>> receives;         // per group rank q: of q's tensor
  std::vector<std::vector<Range>> received_fields;  // per group rank q: the field positions of each received stretch

  bool moves_nothing() const;
};

// The gather: every position of a window that another rank owns, sent by its owner from its
// owned piece, received into the window.
HaloExchange gather_exchange(const HaloAxis& axis, int64_t me);
// Its adjoint: every position of a window that another rank owns, sent from the window back to
// the owner, which adds it into its owned piece.
HaloExchange scatter_add_exchange(const HaloAxis& axis, int64_t me);

// A halo axis lowered for this rank: both of its exchanges, computed once, when the kernel that
// uses it is lowered (its propagation cached), so that a call only chooses the transport and
// moves bytes. The halo steps a kernel runs hold it (redistribute/lowered_step.h).
struct LoweredHaloAxis {
  // A rank outside the mesh has no place in the axis (me = -1) and exchanges nothing.
  LoweredHaloAxis(HaloAxis axis, const DeviceMesh& mesh);

  HaloAxis axis;
  int64_t me;                        // this rank's index in axis.owned and axis.window (-1 outside the mesh)
  bool exchanges;                    // a window crosses shards on a split dim (else nothing moves)
  int64_t widest_window;             // over all ranks: the same on every member (sizes the transport)
  HaloExchange gather, scatter_add;  // as this rank runs them
};

// The halo axes of one op, in exchange order (gathers run first to last, their adjoint
// scatter-adds last to first), and the mesh they exchange on.
struct HaloPlan {
  DeviceMesh mesh;
  std::vector<HaloAxis> axes;

  // The local shape of this rank's window of a piece of `owned_shape`.
  std::vector<int64_t> window_shape(std::vector<int64_t> owned_shape) const;
};

}  // namespace shardtensor
