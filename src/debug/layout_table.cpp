// layout_table(): a readable table of which rank owns which index ranges. Metadata only, so
// one rank can print the whole layout without communicating.
#include <iomanip>
#include <sstream>

#include "shardtensor/shard_tensor.h"
#include "util/strings.h"

namespace shardtensor {

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
    const std::vector<int64_t> offsets = spec.local_offsets(coord);
    std::vector<std::string> row = {std::to_string(rank), "(" + join(coord, ",") + ")"};
    for (int64_t d = 0; d < spec.ndim(); ++d) {
      row.push_back(shape[d] == 0 ? std::string("(empty)")
                                  : std::to_string(offsets[d]) + ":" + std::to_string(offsets[d] + shape[d]));
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
