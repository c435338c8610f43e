// The transport seam (redistribute/transports/part_transport.h) checked below the executor:
// one exchange of uneven parts, some empty, read from a strided source and written into a
// stack slot, moved by each transport in turn, must land the same values and count the same
// bytes on every one.
#include <ATen/ATen.h>

#include <numeric>

#include "comm/comm.h"
#include "dist/dist_fixture.h"
#include "redistribute/transports/part_transport.h"

using namespace shardtensor;
using namespace shardtensor::testing;

namespace {

// Offsets of consecutive pieces of the given sizes.
std::vector<int64_t> offsets_of(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> offsets(sizes.size(), 0);
  std::partial_sum(sizes.begin(), sizes.end() - 1, offsets.begin() + 1);
  return offsets;
}

// Rows held by rank r and columns it wants: uneven, with an empty row block from 2 ranks on.
std::vector<int64_t> row_sizes(int64_t n) {
  std::vector<int64_t> sizes;
  for (int64_t r = 0; r < n; ++r) sizes.push_back(r == 1 ? 0 : 2 + r);
  return sizes;
}
std::vector<int64_t> column_sizes(int64_t n) {
  std::vector<int64_t> sizes;
  for (int64_t r = 0; r < n; ++r) sizes.push_back(3 + (2 * r) % 3);
  return sizes;
}

}  // namespace

TEST(PartTransport, EveryTransportLandsTheSamePartsAndBytes) {
  const DeviceMesh& mesh = test_meshes().front();
  Comm& comm = mesh.comm(0);
  const int64_t n = comm.size(), me = comm.rank();
  const std::vector<int64_t> rows = row_sizes(n), columns = column_sizes(n);
  const std::vector<int64_t> row_at = offsets_of(rows), column_at = offsets_of(columns);
  const int64_t height = std::accumulate(rows.begin(), rows.end(), int64_t{0});
  const int64_t width = std::accumulate(columns.begin(), columns.end(), int64_t{0});
  const at::Tensor global = at::arange(height * width, at::kDouble).view({height, width});
  // Every member holds a row block (column-major, so that no part is contiguous in it) and
  // receives a column block into slot 1 of a stack of 3: boxes with a leading dim the source
  // lacks, as the reduce-scatter's are.
  auto held = [&](int64_t r) { return Box{{1, row_at[r], 0}, {1, rows[r], width}}; };
  auto wanted = [&](int64_t r) { return Box{{1, 0, column_at[r]}, {1, height, columns[r]}}; };
  auto stack = [&](int64_t r) { return Box{{0, 0, column_at[r]}, {3, height, columns[r]}}; };
  const at::Tensor source = global.narrow(0, row_at[me], rows[me]).t().contiguous().t();
  ASSERT_TRUE(n == 1 || rows[me] == 0 || !source.is_contiguous());

  int64_t expected_bytes = 0;
  std::vector<PeerPart> parts;
  for (int64_t p = 0; p < n; ++p) {
    if (p == me) continue;
    parts.push_back({p, me, intersect(held(p), wanted(me)), held(p), stack(me)});
    parts.push_back({me, p, intersect(held(me), wanted(p)), held(me), stack(p)});
    expected_bytes += parts.back().part.numel() * 8;
  }
  const at::Tensor expected = global.narrow(1, column_at[me], columns[me]);

  struct Named {
    const char* name;
    const PartTransport& transport;
  };
  for (const Named& t : {Named{"messages", messages_transport()}, Named{"all_to_all", all_to_all_transport()},
                         Named{"peer memory", peer_memory_transport()}}) {
    SCOPED_TRACE(t.name);
    const bool has_memory = peer_memory_of(comm) != nullptr;  // the same on every member
    if (&t.transport == &peer_memory_transport() && !has_memory) {
      const std::string why = n == 1                  ? "a one-rank group copies from no peer"
                              : !peer_memory_enabled() ? "SHARDTENSOR_PEER_MEMORY=0: peer memory switched off"
                                                       : why_no_peer_memory(comm);
      std::printf("PartTransport: peer memory skipped: %s\n", why.c_str());
      continue;
    }
    const at::Tensor destination = at::full({3, height, columns[me]}, std::nan(""), at::kDouble);
    bool own_part_copied = false;
    PartExchange exchange{parts, source, destination};
    exchange.local_work = [&] {
      own_part_copied = true;
      destination[1].narrow(0, row_at[me], rows[me]).copy_(expected.narrow(0, row_at[me], rows[me]));
    };
    CommDebugMode comms;
    EXPECT_TRUE(t.transport.move(comm, exchange, StepTransport{}));  // messages of the default size
    EXPECT_TRUE(own_part_copied);
    EXPECT_TRUE(at::equal(destination[1], expected));
    EXPECT_TRUE(destination[0].isnan().all().item<bool>() && destination[2].isnan().all().item<bool>()) << "wrote outside its slot";
    EXPECT_EQ(comms.bytes(), expected_bytes) << comms.table();
  }
}
