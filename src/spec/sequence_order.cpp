// See spec/sequence_order.h and shardtensor/context_parallel.h.
#include "spec/sequence_order.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>

namespace shardtensor {
namespace {

struct Settings {
  std::mutex mutex;
  std::vector<std::pair<DeviceMesh, int64_t>> zigzag;  // (mesh, mesh dim) pairs set on
  std::atomic<uint64_t> generation{0};
};

Settings& settings() {
  static Settings* s = new Settings;  // never destroyed: read by rules until the process ends
  return *s;
}

}  // namespace

int64_t length(const Pieces& pieces) {
  int64_t n = 0;
  for (const Range& p : pieces) n += p.size();
  return n;
}

std::vector<int64_t> local_starts(const Pieces& pieces) {
  std::vector<int64_t> starts;
  int64_t at = 0;
  for (const Range& p : pieces) {
    starts.push_back(at);
    at += p.size();
  }
  return starts;
}

std::vector<int64_t> zigzag_chunk_lengths(int64_t length, int64_t ranks) {
  TORCH_CHECK(length >= 0 && ranks >= 1, "zigzag_chunk_lengths: needs a length >= 0 and ranks >= 1, got length ", length,
              " and ranks ", ranks, ".");
  const int64_t chunks = 2 * ranks, base = length / chunks, longer = length % chunks;
  std::vector<int64_t> lengths(chunks, base);
  for (int64_t i = 0; i < longer; ++i) ++lengths[i];
  return lengths;
}

std::vector<int64_t> zigzag_shard_sizes(int64_t length, int64_t ranks) {
  const std::vector<int64_t> chunks = zigzag_chunk_lengths(length, ranks);
  std::vector<int64_t> sizes;
  for (int64_t r = 0; r < ranks; ++r) sizes.push_back(chunks[r] + chunks[2 * ranks - 1 - r]);
  return sizes;
}

Pieces zigzag_positions(int64_t length, int64_t ranks, int64_t coordinate) {
  const std::vector<Range> chunks = sizes_to_ranges(zigzag_chunk_lengths(length, ranks));
  return {chunks[coordinate], chunks[2 * ranks - 1 - coordinate]};
}

std::vector<Pieces> contiguous_pieces(const std::vector<int64_t>& sizes) {
  std::vector<Pieces> pieces;
  for (const Range& r : sizes_to_ranges(sizes)) pieces.push_back({r});
  return pieces;
}

std::vector<Pieces> zigzag_pieces(int64_t length, int64_t ranks) {
  std::vector<Pieces> pieces;
  for (int64_t r = 0; r < ranks; ++r) pieces.push_back(zigzag_positions(length, ranks, r));
  return pieces;
}

void set_zigzag_causal(const DeviceMesh& mesh, int64_t mesh_dim, bool on) {
  TORCH_CHECK(mesh_dim >= 0 && mesh_dim < mesh.ndim(), "set_zigzag_causal: mesh_dim ", mesh_dim, " is not a dim of ", mesh,
              " (0 to ", mesh.ndim() - 1, ").");
  Settings& s = settings();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = std::find_if(s.zigzag.begin(), s.zigzag.end(), [&](const auto& e) { return e.second == mesh_dim && e.first == mesh; });
  const bool was = it != s.zigzag.end();
  if (was == on) return;
  if (on)
    s.zigzag.emplace_back(mesh, mesh_dim);
  else
    s.zigzag.erase(it);
  ++s.generation;
}

bool zigzag_causal(const DeviceMesh& mesh, int64_t mesh_dim) {
  Settings& s = settings();
  if (s.generation == 0) return false;  // never set: no lock on the common path
  std::lock_guard<std::mutex> lock(s.mutex);
  return std::any_of(s.zigzag.begin(), s.zigzag.end(), [&](const auto& e) { return e.second == mesh_dim && e.first == mesh; });
}

uint64_t sequence_order_generation() { return settings().generation; }

ZigzagCausal::ZigzagCausal(const DeviceMesh& mesh, int64_t mesh_dim)
    : mesh_(mesh), mesh_dim_(mesh_dim), previous_(zigzag_causal(mesh, mesh_dim)) {
  set_zigzag_causal(mesh_, mesh_dim_, true);
}

ZigzagCausal::~ZigzagCausal() { set_zigzag_causal(mesh_, mesh_dim_, previous_); }

}  // namespace shardtensor
