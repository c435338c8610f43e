#include "spec/halo_geometry.h"

#include <algorithm>
#include <utility>

namespace shardtensor {

Range intersect(Range a, Range b) { return {std::max(a.begin, b.begin), std::max(std::max(a.begin, b.begin), std::min(a.end, b.end))}; }

std::vector<Range> sizes_to_ranges(const std::vector<int64_t>& sizes) {
  std::vector<Range> ranges;
  int64_t offset = 0;
  for (int64_t n : sizes) {
    ranges.push_back({offset, offset + n});
    offset += n;
  }
  return ranges;
}

std::vector<int64_t> range_sizes(const std::vector<Range>& ranges) {
  std::vector<int64_t> sizes;
  for (const Range& r : ranges) sizes.push_back(r.size());
  return sizes;
}

std::vector<Range> shifted_ranges(const std::vector<Range>& owned, int64_t shift, int64_t out_length) {
  std::vector<Range> ranges(owned.size());
  for (size_t r = 0; r < owned.size(); ++r) {
    ranges[r].begin = r == 0 ? 0 : std::min(std::max<int64_t>(owned[r].begin + shift, 0), out_length);
    if (r > 0) ranges[r - 1].end = ranges[r].begin;
  }
  ranges.back().end = out_length;
  return ranges;
}

std::vector<InField> in_field_runs(Range window, int64_t length, bool periodic) {
  std::vector<InField> runs;
  if (!periodic) {
    const Range inside = intersect(window, {0, length});
    if (inside.size()) runs.push_back({inside.begin - window.begin, inside});
    return runs;
  }
  for (int64_t p = window.begin; p < window.end && length > 0;) {
    const int64_t wrap = p >= 0 ? p / length : -((-p + length - 1) / length);
    const int64_t end = std::min(window.end, (wrap + 1) * length);
    runs.push_back({p - window.begin, {p - wrap * length, end - wrap * length}});
    p = end;
  }
  return runs;
}

bool HaloAxis::crosses_shards() const {
  for (size_t q = 0; q < window.size(); ++q)
    for (const InField& run : in_field_runs(window[q], length, periodic))
      for (size_t r = 0; r < owned.size(); ++r)
        if (q != r && intersect(run.field, owned[r]).size()) return true;
  return false;
}

namespace {

Range shifted(Range r, int64_t by) { return {r.begin + by, r.end + by}; }

// Where the field positions `part` of `run` lie in the window that `run` belongs to.
Range in_window(const InField& run, Range part) { return shifted(part, run.offset - run.field.begin); }

// The exchange in which every window's field positions that another rank owns move between
// the window's rank and the owner; `to_owner` says which way. A stretch is listed by its
// sender and its receiver alike: in the order of the window's runs.
HaloExchange window_exchange(const HaloAxis& axis, int64_t me, bool to_owner) {
  const size_t n = axis.owned.size();
  HaloExchange x{std::vector<std::vector<Range>>(n), std::vector<std::vector<Range>>(n), std::vector<std::vector<Range>>(n)};
  const Range mine = axis.owned[me];
  for (size_t q = 0; q < n; ++q) {
    if (static_cast<int64_t>(q) == me) continue;
    // q's window, and the positions of it that this rank owns.
    for (const InField& run : in_field_runs(axis.window[q], axis.length, axis.periodic)) {
      const Range part = intersect(run.field, mine);
      if (!part.size()) continue;
      if (to_owner) {
        x.receives[q].push_back(in_window(run, part));
        x.received_fields[q].push_back(part);
      } else {
        x.sends[q].push_back(shifted(part, -mine.begin));
      }
    }
    // This rank's window, and the positions of it that q owns.
    for (const InField& run : in_field_runs(axis.window[me], axis.length, axis.periodic)) {
      const Range part = intersect(run.field, axis.owned[q]);
      if (!part.size()) continue;
      if (to_owner) {
        x.sends[q].push_back(in_window(run, part));
      } else {
        x.receives[q].push_back(shifted(part, -axis.owned[q].begin));
        x.received_fields[q].push_back(part);
      }
    }
  }
  return x;
}

}  // namespace

bool HaloExchange::moves_nothing() const {
  for (size_t q = 0; q < sends.size(); ++q)
    if (!sends[q].empty() || !receives[q].empty()) return false;
  return true;
}

HaloExchange gather_exchange(const HaloAxis& axis, int64_t me) { return window_exchange(axis, me, false); }
HaloExchange scatter_add_exchange(const HaloAxis& axis, int64_t me) { return window_exchange(axis, me, true); }

std::vector<int64_t> HaloPlan::window_shape(std::vector<int64_t> shape) const {
  for (const HaloAxis& axis : axes) shape[axis.tensor_dim] = axis.window[axis.me(mesh)].size();
  return shape;
}

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

}  // namespace shardtensor
