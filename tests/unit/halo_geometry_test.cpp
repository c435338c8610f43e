// Halo exchanges lowered in one process (spec/halo_geometry.h): for any layout (uneven, empty
// shards, windows reaching past several neighbours, periodic or clipped), what one rank sends
// is what its peer expects, every window position another rank owns arrives exactly once from
// its owner, and the scatter-add returns exactly the positions the gather brought.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "spec/halo_geometry.h"

using namespace shardtensor;

namespace {

Range shifted(Range r, int64_t by) { return {r.begin + by, r.end + by}; }

std::vector<Range> shifted_all(std::vector<Range> ranges, int64_t by) {
  for (Range& r : ranges) r = shifted(r, by);
  return ranges;
}

std::vector<int64_t> sizes_of(const std::vector<Range>& ranges) {
  std::vector<int64_t> sizes;
  for (const Range& r : ranges) sizes.push_back(r.size());
  return sizes;
}

// Every field position in `ranges`, in order.
std::vector<int64_t> positions(const std::vector<Range>& ranges) {
  std::vector<int64_t> all;
  for (const Range& r : ranges)
    for (int64_t p = r.begin; p < r.end; ++p) all.push_back(p);
  return all;
}

// The axis of a sliding window reaching `before` positions before a rank's rows and `after`
// past them, over shards of `sizes`.
HaloAxis sliding(const std::vector<int64_t>& sizes, int64_t before, int64_t after, bool periodic) {
  HaloAxis axis;
  axis.mesh_dim = 0;
  axis.owned = sizes_to_ranges(sizes);
  axis.length = axis.owned.empty() ? 0 : axis.owned.back().end;
  for (const Range& r : axis.owned) axis.window.push_back({r.begin - before, r.end + after});
  axis.periodic = periodic;
  return axis;
}

// Independently of the lowering: per owner, the field positions of `me`'s window that the
// owner holds and `me` does not, in window order.
std::map<int64_t, std::vector<int64_t>> needed_from_owners(const HaloAxis& axis, int64_t me) {
  std::map<int64_t, std::vector<int64_t>> needed;
  for (int64_t p = axis.window[me].begin; p < axis.window[me].end; ++p) {
    int64_t field = p;
    if (axis.periodic) field = ((p % axis.length) + axis.length) % axis.length;
    if (field < 0 || field >= axis.length) continue;
    for (size_t q = 0; q < axis.owned.size(); ++q)
      if (static_cast<int64_t>(q) != me && axis.owned[q].begin <= field && field < axis.owned[q].end) needed[q].push_back(field);
  }
  return needed;
}

void check_axis(const HaloAxis& axis, const std::string& what) {
  const int64_t n = static_cast<int64_t>(axis.owned.size());
  for (int64_t me = 0; me < n; ++me) {
    const HaloExchange gather = gather_exchange(axis, me), scatter = scatter_add_exchange(axis, me);
    const std::map<int64_t, std::vector<int64_t>> needed = needed_from_owners(axis, me);
    for (int64_t q = 0; q < n; ++q) {
      const std::string pair = what + ", rank " + std::to_string(me) + " and rank " + std::to_string(q);
      const HaloExchange peer_gather = gather_exchange(axis, q), peer_scatter = scatter_add_exchange(axis, q);
      // What I send q is what q expects from me, stretch by stretch.
      EXPECT_EQ(sizes_of(gather.sends[q]), sizes_of(peer_gather.receives[me])) << pair;
      EXPECT_EQ(sizes_of(scatter.sends[q]), sizes_of(peer_scatter.receives[me])) << pair;
      // The gather's stretches, seen in field positions on both sides, are the same positions.
      EXPECT_EQ(positions(shifted_all(gather.sends[q], axis.owned[me].begin)), positions(peer_gather.received_fields[me])) << pair;
      // My window's positions q owns arrive once each, in window order, from q.
      const auto it = needed.find(q);
      EXPECT_EQ(positions(gather.received_fields[q]), it == needed.end() ? std::vector<int64_t>{} : it->second) << pair;
      // The scatter-add returns to me exactly the positions of mine that I sent q's window.
      EXPECT_EQ(positions(scatter.received_fields[q]), positions(shifted_all(gather.sends[q], axis.owned[me].begin))) << pair;
      if (q == me) EXPECT_TRUE(gather.sends[q].empty() && gather.receives[q].empty()) << pair;
    }
  }
}

}  // namespace

TEST(HaloExchange, ANeighbourRowEachWayOverThreeUnevenShards) {
  const HaloAxis axis = sliding({4, 3, 3}, 1, 1, false);  // owned [0,4) [4,7) [7,10)
  const HaloExchange x = gather_exchange(axis, 1);        // window [3, 8)
  EXPECT_EQ(x.sends[0], (std::vector<Range>{{0, 1}}));    // field 4: rank 0's window ends at 5
  EXPECT_EQ(x.sends[2], (std::vector<Range>{{2, 3}}));    // field 6: rank 2's window starts at 6
  EXPECT_EQ(x.receives[0], (std::vector<Range>{{3, 4}}));  // rank 0's last row
  EXPECT_EQ(x.received_fields[0], (std::vector<Range>{{3, 4}}));
  EXPECT_EQ(x.receives[2], (std::vector<Range>{{0, 1}}));  // rank 2's first row
  EXPECT_EQ(x.received_fields[2], (std::vector<Range>{{7, 8}}));
  // The adjoint sends window positions (counted from the window's start) back to the owners.
  const HaloExchange back = scatter_add_exchange(axis, 1);
  EXPECT_EQ(back.sends[0], (std::vector<Range>{{0, 1}}));
  EXPECT_EQ(back.sends[2], (std::vector<Range>{{4, 5}}));
  EXPECT_EQ(back.received_fields[0], (std::vector<Range>{{4, 5}}));
}

TEST(HaloExchange, APeriodicWindowWrapsToTheLastRank) {
  const HaloAxis axis = sliding({4, 3, 3}, 1, 0, true);  // rank 0's window [-1, 4): field 9 first
  const HaloExchange x = gather_exchange(axis, 0);
  EXPECT_EQ(x.receives[2], (std::vector<Range>{{2, 3}}));
  EXPECT_EQ(x.received_fields[2], (std::vector<Range>{{9, 10}}));
  EXPECT_TRUE(x.receives[1].empty());
  EXPECT_FALSE(x.moves_nothing());
}

TEST(HaloExchange, NothingMovesWhenNoWindowCrossesAShard) {
  const HaloAxis axis = sliding({4, 3, 3}, 0, 0, false);
  for (int64_t me = 0; me < 3; ++me) {
    EXPECT_TRUE(gather_exchange(axis, me).moves_nothing());
    EXPECT_TRUE(scatter_add_exchange(axis, me).moves_nothing());
  }
}

TEST(HaloExchange, SendersAndReceiversAgreeOnRandomLayouts) {
  std::mt19937 random(14);
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(random() % 5);
    std::vector<int64_t> sizes;
    for (int64_t r = 0; r < n; ++r) sizes.push_back(random() % 3 == 0 ? 0 : static_cast<int64_t>(random() % 6));  // empty shards too
    const int64_t before = random() % 5, after = random() % 5;  // may reach past several thin neighbours
    const bool periodic = random() % 2 == 0;
    int64_t length = 0;
    for (int64_t s : sizes) length += s;
    if (periodic && length == 0) continue;  // a periodic axis wraps a nonempty field
    const HaloAxis axis = sliding(sizes, before, after, periodic);
    std::string what = "sizes [";
    for (int64_t s : sizes) what += std::to_string(s) + " ";
    check_axis(axis, what + "], before " + std::to_string(before) + ", after " + std::to_string(after) + (periodic ? ", periodic" : ""));
  }
}
