#include "dispatch/decompositions.h"

#include <ATen/ATen.h>

#include <vector>

namespace shardtensor {

at::Tensor circular_pad_by_cat(const at::Tensor& self, c10::IntArrayRef pad) {
  TORCH_CHECK(pad.size() % 2 == 0 && static_cast<int64_t>(pad.size()) / 2 <= self.dim(), "circular padding: ", pad.size(),
              " padding values for a ", self.dim(), "-d tensor; give (before, after) pairs from the last dim back");
  at::Tensor out = self;
  for (size_t i = 0; i < pad.size() / 2; ++i) {
    const int64_t dim = self.dim() - 1 - static_cast<int64_t>(i), before = pad[2 * i], after = pad[2 * i + 1];
    const int64_t length = out.size(dim);
    TORCH_CHECK(before >= 0 && after >= 0 && before <= length && after <= length, "circular padding of dim ", dim,
                " (length ", length, ") by (", before, ", ", after, "): each side must be between 0 and the length");
    std::vector<at::Tensor> parts;
    if (before) parts.push_back(out.narrow(dim, length - before, before));
    parts.push_back(out);
    if (after) parts.push_back(out.narrow(dim, 0, after));
    if (parts.size() > 1) out = at::cat(parts, dim);
  }
  return out;
}

}  // namespace shardtensor
