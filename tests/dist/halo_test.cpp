// Halo exchange pinned: a sharded convolution moves exactly its halo rows (never an
// all-gather of the input) forward and backward, shards thinner than the halo work, and the
// 2-D case (H and W split at once) exchanges corners through the two steps.
#include <ATen/ATen.h>

#include <numeric>

#include "comm/comm.h"
#include "dist/dist_fixture.h"
#include "redistribute/transports/peer_memory/arena.h"
#include "redistribute/transports/peer_memory/copies.h"

using namespace shardtensor;
using namespace shardtensor::testing;

namespace {

// Uneven row sizes, every shard at least `min_rows` rows: 2, 5, 3, 4, 2, ... around `per_rank`.
std::vector<int64_t> uneven_halo_rows(int64_t ranks, int64_t min_rows) {
  std::vector<int64_t> sizes;
  for (int64_t r = 0; r < ranks; ++r) sizes.push_back(min_rows + (r * 3) % 4);
  return sizes;
}

// Shards thinner than a halo: one row on every rank but the last, which holds `last_rows`.
std::vector<int64_t> one_row_each_but_the_last(int64_t ranks, int64_t last_rows) {
  std::vector<int64_t> sizes(ranks, 1);
  sizes.back() = last_rows;
  return sizes;
}

void expect_matches(const at::Tensor& sharded, const at::Tensor& expected, const char* what) {
  EXPECT_TRUE(at::allclose(full_tensor(sharded), expected, 1e-9, 1e-11)) << what;
}

}  // namespace

TEST(Halo, ShardedConvolutionMovesOnlyHaloRows) {
  const int64_t ranks = mesh_1d().size(0), n = 2, c = 3, w = 11;
  const std::vector<int64_t> sizes = uneven_halo_rows(ranks, 2);  // at least the halo (1 row)
  const at::Tensor x = draw_double({n, c, total(sizes), w}, 1), weight = draw_double({4, c, 3, 3}, 2), bias = draw_double({4}, 3);
  const at::Tensor ref_x = x.clone().requires_grad_(), ref_w = weight.clone().requires_grad_();
  const at::Tensor expected = at::conv2d(ref_x, ref_w, bias, 1, 1);
  const at::Tensor grad_out = draw_double(expected.sizes().vec(), 4);
  (expected * grad_out).sum().backward();

  at::Tensor sx = distribute_tensor(x, mesh_1d(), {Shard(2)}, ShardSizes{{2, sizes}}).requires_grad_();
  at::Tensor sw = distribute_tensor(weight, mesh_1d(), {Replicate()}).requires_grad_();
  const at::Tensor sb = distribute_tensor(bias, mesh_1d(), {Replicate()});
  const at::Tensor sg = distribute_tensor(grad_out, mesh_1d(), {Shard(2)}, ShardSizes{{2, sizes}});

  // Each rank sends one row (n * c * w doubles) to each neighbour it has.
  const int64_t r = mesh_1d().coordinate()[0];
  const int64_t halo_bytes = ((r > 0) + (r < ranks - 1)) * n * c * w * 8;
  at::Tensor out;
  {
    CommDebugMode comms;
    out = at::conv2d(sx, sw, sb, 1, 1);
    EXPECT_EQ(comms.count("all_gather"), 0);
    EXPECT_EQ(comms.count("all_to_all"), ranks > 1 ? 1 : 0) << comms.table();
    EXPECT_EQ(comms.bytes(), halo_bytes) << comms.table();
  }
  EXPECT_EQ(spec(out).placements(), (Placements{Shard(2)}));
  EXPECT_EQ(spec(out).sharding_of(2)->sizes, sizes) << "stride 1, same padding: the output keeps the input's rows";
  expect_matches(out, expected.detach(), "forward");
  {
    CommDebugMode comms;
    (out * sg).sum().backward();
    EXPECT_EQ(comms.count("all_gather"), 0) << comms.table();
    // Only the input gradient's halo rows back to their owners: the input window is rebuilt
    // from the rows the forward received.
    EXPECT_EQ(comms.bytes("all_to_all"), halo_bytes) << comms.table();
  }
  expect_matches(sx.grad(), ref_x.grad(), "input gradient");
  expect_matches(sw.grad(), ref_w.grad(), "weight gradient");
}

// The declared moves that explain_operator prints are the ones the kernel makes: a halo
// gather when a window crosses a shard boundary, nothing otherwise, and no collective to find out.
TEST(Halo, ExplainShowsTheKernelsHaloMovesWithoutCommunicating) {
  const int64_t ranks = mesh_1d().size(0);
  const at::Tensor sx = distribute_tensor(draw_double({1, 2, 4 * ranks, 5}, 9), mesh_1d(), {Shard(2)});
  const at::Tensor sw = distribute_tensor(draw_double({3, 2, 3, 3}, 10), mesh_1d(), {Replicate()});
  auto conv_args = [&](const at::Tensor& weight, int64_t padding) {
    return std::vector<c10::IValue>{sx, weight, c10::IValue(), std::vector<int64_t>{1, 1}, std::vector<int64_t>{padding, padding},
                                    std::vector<int64_t>{1, 1}, false, std::vector<int64_t>{0, 0}, int64_t{1}};
  };
  CommDebugMode comms;
  const std::string text = explain_operator("aten::convolution", conv_args(sw, 1));
  EXPECT_EQ(comms.total(), 0) << comms.table();
  EXPECT_NE(text.find("kernel: halo convolution (forward)"), std::string::npos) << text;
  EXPECT_EQ(text.find("HaloGather(mesh_dim=0, tensor_dim=2), by ") != std::string::npos, ranks > 1) << text;
  EXPECT_NE(text.find("input 'weight' [R]: used as it is"), std::string::npos) << text;
  EXPECT_NE(text.find("output 0: [S(2)] dim 2 sizes"), std::string::npos) << text;
  const std::string one_by_one = explain_operator("aten::convolution",
                                                   conv_args(distribute_tensor(draw_double({3, 2, 1, 1}, 11), mesh_1d(), {Replicate()}), 0));
  EXPECT_NE(one_by_one.find("moves nothing between ranks"), std::string::npos) << one_by_one;
  EXPECT_THROW(explain_operator("aten::no_such_op", {}), c10::Error);
}

TEST(Halo, ShardsThinnerThanTheHaloReachPastTheirNeighbours) {
  const int64_t ranks = mesh_1d().size(0);
  const std::vector<int64_t> sizes = one_row_each_but_the_last(ranks, 6);  // kernel 7: a halo of 3 rows
  const at::Tensor x = draw_double({1, 2, total(sizes), 5}, 5), weight = draw_double({3, 2, 7, 3}, 6);
  const at::Tensor ref_x = x.clone().requires_grad_();
  const at::Tensor expected = at::conv2d(ref_x, weight, {}, 1, {3, 1});
  expected.sum().backward();
  at::Tensor sx = distribute_tensor(x, mesh_1d(), {Shard(2)}, ShardSizes{{2, sizes}}).requires_grad_();
  const at::Tensor out = at::conv2d(sx, distribute_tensor(weight, mesh_1d(), {Replicate()}), {}, 1, {3, 1});
  expect_matches(out, expected.detach(), "forward");
  out.sum().backward();
  expect_matches(sx.grad(), ref_x.grad(), "input gradient");
}

// The backward rebuilds the window from the rows the forward kept (kernels/window_cache.h), also
// on a rank whose window holds none of its own rows: an empty shard, and strided, dilated
// windows that start past a rank's rows (found by the op sweep on 3 ranks: [5, 0, 6] rows).
TEST(Halo, KeptRowsRebuildWindowsWithoutOwnRows) {
  const int64_t ranks = mesh_1d().size(0);
  if (ranks < 3) GTEST_SKIP() << "needs an empty shard between two others (3 ranks or more)";
  std::vector<int64_t> sizes(static_cast<size_t>(ranks), 0);
  sizes.front() = 5;
  sizes.back() = 6;
  const at::Tensor x = draw_double({2, 4, total(sizes), 9}, 19), weight = draw_double({6, 4, 3, 3}, 20), bias = draw_double({6}, 21);
  const at::Tensor ref_x = x.clone().requires_grad_(), ref_w = weight.clone().requires_grad_();
  const std::vector<int64_t> two{2, 2}, none{0, 0};  // stride and dilation 2, no padding
  const at::Tensor expected = at::conv2d(ref_x, ref_w, bias, two, none, two);
  expected.square().sum().backward();
  at::Tensor sx = distribute_tensor(x, mesh_1d(), {Shard(2)}, ShardSizes{{2, sizes}}).requires_grad_();
  at::Tensor sw = distribute_tensor(weight, mesh_1d(), {Replicate()}).requires_grad_();
  const at::Tensor out = at::conv2d(sx, sw, distribute_tensor(bias, mesh_1d(), {Replicate()}), two, none, two);
  expect_matches(out, expected.detach(), "forward");
  out.square().sum().backward();
  expect_matches(sx.grad(), ref_x.grad(), "input gradient");
  expect_matches(sw.grad(), ref_w.grad(), "weight gradient");
}

TEST(Halo, TwoDimensionalSplitExchangesCorners) {
  if (world_size() != 4) GTEST_SKIP() << "needs a 2x2 mesh (4 ranks); the sweep covers other meshes";
  const DeviceMesh mesh = DeviceMesh::create({2, 2});
  const at::Tensor x = draw_double({1, 2, 9, 8}, 7), weight = draw_double({2, 2, 3, 3}, 8);
  const at::Tensor ref_x = x.clone().requires_grad_();
  const at::Tensor expected = at::conv2d(ref_x, weight, {}, 1, 1);
  expected.square().sum().backward();
  at::Tensor sx = distribute_tensor(x, mesh, {Shard(2), Shard(3)}, ShardSizes{{2, {3, 6}}, {3, {5, 3}}}).requires_grad_();
  const at::Tensor sweight = distribute_tensor(weight, mesh, {Replicate(), Replicate()});
  CommDebugMode comms;
  const at::Tensor out = at::conv2d(sx, sweight, {}, 1, 1);
  EXPECT_EQ(comms.count("all_gather"), 0);
  EXPECT_EQ(comms.count("all_to_all"), 2) << "one exchange per split dim; the second carries the corners";
  expect_matches(out, expected.detach(), "forward");
  out.square().sum().backward();
  expect_matches(sx.grad(), ref_x.grad(), "input gradient");
}

TEST(Halo, CircularPaddingWrapsAroundThroughTheHalo) {
  const int64_t ranks = mesh_1d().size(0), n = 1, c = 2, h = 5;
  const std::vector<int64_t> sizes = uneven_halo_rows(ranks, 2);
  const at::Tensor x = draw_double({n, c, h, total(sizes)}, 9), weights = draw_double({n, c, h, total(sizes) + 3}, 10);
  const at::Tensor ref_x = x.clone().requires_grad_();
  const at::Tensor expected = at::pad(ref_x, {2, 1, 0, 0}, "circular");
  (expected * weights).sum().backward();
  at::Tensor sx = distribute_tensor(x, mesh_1d(), {Shard(3)}, ShardSizes{{3, sizes}}).requires_grad_();
  CommDebugMode comms;
  const at::Tensor out = at::pad(sx, {2, 1, 0, 0}, "circular");
  EXPECT_EQ(comms.count("all_gather"), 0) << comms.table();
  // Rank 0 sends its first column to the last rank (the pad after the end); the last rank
  // sends its last two columns to rank 0. With one rank the wrap is local.
  const int64_t r = mesh_1d().coordinate()[0];
  const int64_t columns = ranks == 1 ? 0 : (r == 0 ? 1 : 0) + (r == ranks - 1 ? 2 : 0);
  EXPECT_EQ(comms.bytes(), columns * n * c * h * 8) << comms.table();
  expect_matches(out, expected.detach(), "forward");
  (out * distribute_tensor(weights, mesh_1d(), {Replicate()})).sum().backward();
  expect_matches(sx.grad(), ref_x.grad(), "input gradient");
}

// Every transport gives the same windows, forward and backward, and moves the same bytes:
// thin and empty-free uneven shards, a wrap-around (circular) axis, and a halo wider than a
// shard. Peer memory reads its stretches from the neighbours' pieces; the others send them.
TEST(Halo, EveryTransportGivesTheSameWindowsAndBytes) {
  const int64_t ranks = mesh_1d().size(0);
  const std::vector<int64_t> sizes = one_row_each_but_the_last(ranks, 4);  // kernel 5: a halo of 2 rows
  const at::Tensor x = draw_double({2, 3, total(sizes), 6}, 12), weight = draw_double({2, 3, 5, 3}, 13);
  const at::Tensor ref_x = x.clone().requires_grad_();
  const at::Tensor expected = at::conv2d(at::pad(ref_x, {1, 1, 2, 2}, "circular"), weight);
  const at::Tensor grad_out = draw_double(expected.sizes().vec(), 14);
  (expected * grad_out).sum().backward();
  std::vector<int64_t> bytes_by_transport;
  for (UseTransport::Kind kind : {UseTransport::kMemory, UseTransport::kMessages, UseTransport::kCollectives}) {
    SCOPED_TRACE("transport " + std::to_string(kind));
    const UseTransport transport(kind);
    at::Tensor sx = distribute_tensor(x, mesh_1d(), {Shard(2)}, ShardSizes{{2, sizes}}).requires_grad_();
    const at::Tensor sweight = distribute_tensor(weight, mesh_1d(), {Replicate()});
    at::Tensor out;
    int64_t bytes = 0;
    {
      CommDebugMode comms;
      out = at::conv2d(at::pad(sx, {1, 1, 2, 2}, "circular"), sweight);
      EXPECT_EQ(comms.count("all_gather"), 0) << comms.table();
      bytes += comms.bytes();
    }
    const at::Tensor sgrad = distribute_tensor(grad_out, mesh_1d(), {Shard(2)}, ShardSizes{{2, spec(out).sharding_of(2)->sizes}});
    {
      CommDebugMode comms;
      (out * sgrad).sum().backward();
      EXPECT_EQ(comms.count("all_gather"), 0) << comms.table();
      bytes += comms.bytes();
    }
    bytes_by_transport.push_back(bytes);
    expect_matches(out, expected.detach(), "forward");
    expect_matches(sx.grad(), ref_x.grad(), "input gradient");
  }
  EXPECT_EQ(bytes_by_transport[0], bytes_by_transport[1]);
  EXPECT_EQ(bytes_by_transport[0], bytes_by_transport[2]);
}

TEST(Halo, AFailedPeerCopyFallsBackToMessagesOnEveryRank) {
  if (world_size() == 1) GTEST_SKIP() << "one rank copies from no peer";
  if (!peer_memory_enabled()) GTEST_SKIP() << "SHARDTENSOR_PEER_MEMORY=0: peer memory switched off";
  const DeviceMesh mesh = DeviceMesh::create({world_size()});  // its own groups: they stop copying through memory for good
  const UseTransport transport(UseTransport::kMemory);
  if (kernel_forbids_peer_memory(mesh.comm(0))) GTEST_SKIP() << "this machine's kernel forbids reading another rank's memory";
  const at::Tensor x = draw_double({1, 2, 4 * world_size(), 5}, 15), weight = draw_double({2, 2, 3, 3}, 16);
  const at::Tensor expected = at::conv2d(x, weight, {}, 1, 1);
  const at::Tensor sweight = distribute_tensor(weight, mesh, {Replicate()});
  const at::Tensor sx = distribute_tensor(x, mesh, {Shard(2)});
  expect_matches(at::conv2d(sx, sweight, {}, 1, 1), expected, "through memory");
  ASSERT_NE(peer_memory_of(mesh.comm(0)), nullptr) << why_no_peer_memory(mesh.comm(0));
  if (world_rank() == 0) fail_next_peer_copies(1);
  expect_matches(at::conv2d(sx, sweight, {}, 1, 1), expected, "after a failed copy, by messages");
  EXPECT_EQ(peer_memory_of(mesh.comm(0)), nullptr);
  expect_matches(at::conv2d(sx, sweight, {}, 1, 1), expected, "by messages from then on");
}

// A TransportOptionsScope sets the transport of what operators move: under messages no halo,
// mid-op reduction or redistribute copies through memory (a copy failure injected first
// stays unused, and the group keeps its peer memory), explain says so, and the values match.
TEST(Halo, ATransportScopeSetsTheTransportOfOperators) {
  if (world_size() == 1) GTEST_SKIP() << "one rank copies from no peer";
  if (!peer_memory_enabled()) GTEST_SKIP() << "SHARDTENSOR_PEER_MEMORY=0: peer memory switched off";
  const DeviceMesh mesh = DeviceMesh::create({world_size()});  // its own groups: a failed copy would stop them for good
  const UseTransport transport(UseTransport::kMemory);
  if (kernel_forbids_peer_memory(mesh.comm(0))) GTEST_SKIP() << "this machine's kernel forbids reading another rank's memory";
  const at::Tensor x = draw_double({1, 2, 4 * world_size(), 5}, 17), weight = draw_double({2, 2, 3, 3}, 18);
  const at::Tensor sweight = distribute_tensor(weight, mesh, {Replicate()});
  const at::Tensor sx = distribute_tensor(x, mesh, {Shard(2)});
  const ShardTensorSpec by_columns(mesh, {Shard(3)}, x.sizes().vec(), c10::kDouble);
  const std::string outside = explain_redistribute(spec(sx), by_columns);
  ASSERT_NE(peer_memory_of(mesh.comm(0)), nullptr) << why_no_peer_memory(mesh.comm(0));
  if (world_rank() == 0) fail_next_peer_copies(1);
  const TransportOptions outer = TransportOptionsScope::current();  // UseTransport's scope
  {
    const TransportOptionsScope by_messages(TransportOptions{TransportPreference::Messages, std::nullopt, std::nullopt});
    const std::string inside = explain_redistribute(spec(sx), by_columns);
    // Peer memory, or its in-place form where the ranks' arenas are on (SHARDTENSOR_ARENA=1).
    const char* same_host = own_arena().base != 0 ? "shared arena" : "peer memory";
    EXPECT_NE(outside.find(same_host), std::string::npos) << outside;
    EXPECT_EQ(inside.find(same_host), std::string::npos) << inside;
    {
      // An inner scope overrides only what it sets.
      const TransportOptionsScope inner(TransportOptions{std::nullopt, false, std::nullopt});
      EXPECT_EQ(TransportOptionsScope::current().transport, TransportPreference::Messages);
      EXPECT_EQ(TransportOptionsScope::current().peer_memory, false);
    }
    EXPECT_EQ(TransportOptionsScope::current().peer_memory, outer.peer_memory);
    expect_matches(at::conv2d(sx, sweight, {}, 1, 1), at::conv2d(x, weight, {}, 1, 1), "a halo by messages");
    expect_matches(redistribute(sx, {Shard(3)}), x, "a redistribute by messages");
    // Normalised over the split dim: the statistics are reduced over the ranks mid-op.
    const std::vector<int64_t> rows_and_columns{4 * world_size(), 5};
    expect_matches(at::layer_norm(sx, rows_and_columns), at::layer_norm(x, rows_and_columns), "a norm's reduction by messages");
  }
  EXPECT_EQ(TransportOptionsScope::current().transport, outer.transport);
  EXPECT_NE(peer_memory_of(mesh.comm(0)), nullptr) << "something copied through memory under the messages scope";
  if (world_rank() == 0) fail_next_peer_copies(0);
}
