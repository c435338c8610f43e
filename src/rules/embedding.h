// The plan of a lookup along a split dim (DTensor's MaskPartial): embedding (rules/embedding.cpp),
// gather (rules/indexing.cpp) and index_select (rules/views.cpp) declare it, kernels/embedding.cpp
// runs it. Its condition (lookup_split_mesh_dims) is defined in rules/embedding.cpp.
#pragma once

#include "rules/kernel_plan.h"

namespace shardtensor {

// Note [Lookups along a split dim]
// A lookup reads a table (embedding's weight, gather's and index_select's self) at the positions
// an index gives along one tensor dim. Where the table splits that dim over some mesh dims, is
// whole on every other mesh dim, and the index is whole on the splitting ones, each rank answers
// the index entries that fall in its own range [offset, offset + size) of the dim and zeros for
// the others: every entry falls in exactly one rank's range, so the output is a Partial(sum) over
// the splitting mesh dims, with no communication. Which rank answers an entry is read from the
// index's values by the kernel; the rule never sees them. Entries outside the range read local
// position 0 and are zeroed after (masked_fill, not a product, so that an inf or NaN at position 0
// leaks nothing); an empty piece answers zeros without calling the op, whose local position 0
// would not exist. An index outside the whole dim raises on one process but reads as zeros here.
//   [10, 4] table, Shard(0) on mesh(4) with sizes {4, 0, 3, 3} (offsets 0, 4, 4, 7); indices
//   [9, 0, 5]: rank 0 answers 0 (local row 0), rank 2 answers 5 (local row 1), rank 3 answers 9
//   (local row 2), rank 1 (empty) answers nothing; each rank's output is [3, 4], zero elsewhere.

// The mesh dims on which `table` is Shard(tensor_dim), where it is Replicate on every other mesh
// dim and `index` is not split on them (a Partial index is resolved first): there a lookup along
// `tensor_dim` answers locally (see Note [Lookups along a split dim]). Empty for any other layout.
std::vector<int64_t> lookup_split_mesh_dims(const ShardTensorSpec& table, int64_t tensor_dim, const ShardTensorSpec& index);

// Where the output's entries of one index entry lie, so that its mask broadcasts to them.
enum class LookupMask {
  kTrailingDim,  // embedding: output [*index, D]; the mask unsqueezed on the last dim
  kAlongDim,     // index_select: output is the table with tensor_dim replaced by the index's length
  kIndexShape,   // gather: output has the index's shape
};

// The op on this rank's range of `tensor_dim` of the table, zeros for the index entries other
// ranks answer (see Note [Lookups along a split dim]). The output is a Partial(sum) over the mesh
// dims that split the dim.
struct MaskedLookupPlan : KernelPlan {
  ShardTensorSpec table;   // the table as the op runs on it: this rank's range comes from it
  int64_t tensor_dim = 0;  // the looked-up dim of the table, wrapped
  size_t table_arg = 0;    // schema positions of the table and the index
  size_t index_arg = 1;
  LookupMask mask = LookupMask::kTrailingDim;
  std::string op_label;  // "embedding", "gather", "index_select": for name()

  MaskedLookupPlan(ShardTensorSpec t, int64_t d, size_t table_at, size_t index_at, LookupMask m, std::string label)
      : table(std::move(t)), tensor_dim(d), table_arg(table_at), index_arg(index_at), mask(m), op_label(std::move(label)) {}

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override {
    return op_label + " of the local range of dim " + std::to_string(tensor_dim) + " (others zero)";
  }
};

}  // namespace shardtensor
