// layout_table(): a readable table of which rank owns which index ranges. Metadata only, so
// one rank can print the whole layout without communicating.
#include <iomanip>
#include <sstream>

#include "shardtensor/shard_tensor.h"
#include "spec/sequence_order.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

// The stretches of dim `d` the coordinate holds: its piece's (two under zigzag), or the whole
// dim where no mesh dim splits it.
Pieces stretches_of_dim(const ShardTensorSpec& spec, const std::vector<int64_t>& coordinate, int64_t d) {
  const DimSharding* s = spec.sharding_of(d);
  return s ? stretches_held(spec, *s, coordinate) : Pieces{Range{0, spec.shape()[d]}};
}

}  // namespace

std::string layout_table(const ShardTensorSpec& spec) {
  const DeviceMesh& mesh = spec.mesh();
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {"rank", "coord"};
  for (int64_t d = 0; d < spec.ndim(); ++d) header.push_back("dim " + std::to_string(d));
  header.push_back("local shape");
  rows.push_back(header);
  for (int64_t rank : mesh.ranks()) {
    const std::vector<int64_t> coord = mesh.coordinate_of(rank);
    const std::vector<int64_t> shape = spec.local_shape(coord);
    std::vector<std::string> row = {std::to_string(rank), "(" + join(coord, ",") + ")"};
    for (int64_t d = 0; d < spec.ndim(); ++d) {
      std::string held;
      for (const Range& r : stretches_of_dim(spec, coord, d))
        if (r.size() > 0) held += (held.empty() ? "" : "+") + std::to_string(r.begin) + ":" + std::to_string(r.end);
      row.push_back(held.empty() ? std::string("(empty)") : held);
    }
    row.push_back("[" + join(shape, ", ") + "]");
    rows.push_back(row);
  }
  std::vector<size_t> widths(header.size(), 0);
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  std::ostringstream os;
  os << spec << "\n";
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t c = 0; c < rows[r].size(); ++c) os << (c ? "  " : "  ") << std::left << std::setw(static_cast<int>(widths[c])) << rows[r][c];
    os << "\n";
  }
  return os.str();
}

}  // namespace shardtensor

namespace shardtensor {

std::string visualize_sharding(const ShardTensorSpec& spec) {
  constexpr int64_t kMaxExtent = 64;
  const int64_t rows = spec.ndim() == 2 ? spec.shape()[0] : 1;
  const int64_t cols = spec.ndim() == 0 ? 1 : spec.shape().back();
  if (spec.ndim() > 2 || rows > kMaxExtent || cols > kMaxExtent) return layout_table(spec);

  // owners[r][c]: the ranks holding element (r, c), joined with '/'.
  std::vector<std::vector<std::string>> owners(rows, std::vector<std::string>(cols));
  const DeviceMesh& mesh = spec.mesh();
  for (int64_t rank : mesh.ranks()) {
    const std::vector<int64_t> coord = mesh.coordinate_of(rank);
    std::vector<Pieces> held;
    for (int64_t d = 0; d < spec.ndim(); ++d) held.push_back(stretches_of_dim(spec, coord, d));
    held.insert(held.begin(), 2 - std::min<int64_t>(spec.ndim(), 2), Pieces{Range{0, 1}});  // a 0-d or 1-d tensor as one row
    for (const Range& rs : held[0])
      for (const Range& cs : held[1])
        for (int64_t r = rs.begin; r < rs.end; ++r)
          for (int64_t c = cs.begin; c < cs.end; ++c) owners[r][c] += (owners[r][c].empty() ? "" : "/") + std::to_string(rank);
  }
  size_t width = 1;
  for (const auto& row : owners)
    for (const auto& cell : row) width = std::max(width, cell.size());
  std::ostringstream os;
  os << "  owner of every element of " << spec.to_string() << " (rank numbers" << (spec.is_replicated() || spec.has_partial() ? "; a/b: held by both" : "")
     << "; | marks a boundary):\n";
  for (int64_t r = 0; r < rows; ++r) {
    os << "  " << std::right << std::setw(3) << r << " |";
    for (int64_t c = 0; c < cols; ++c) {
      // A bar marks a shard boundary between neighbouring columns.
      const bool boundary = c > 0 && owners[r][c] != owners[r][c - 1];
      os << (boundary ? "|" : " ") << std::setw(static_cast<int>(width)) << owners[r][c];
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace shardtensor
