// from_local: building a ShardTensor from each rank's piece, in the three sizing modes.
//
// Chunk and Given work out the layout from their arguments alone, so every rank reaches the
// same spec without talking. Infer (and run_check) exchange local shapes with one all-gather
// over the mesh; every rank then holds every shape and makes the same decision, so a bad shape
// raises the same error everywhere instead of leaving some ranks waiting.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>

#include "api/conversions.h"
#include "autograd/grad_fn.h"
#include "comm/mesh_collectives.h"
#include "dispatch/shard_tensor_impl.h"
#include "shardtensor/shard_tensor.h"
#include "spec/placement_checks.h"
#include "util/strings.h"

namespace shardtensor {

ShardSizing ShardSizing::chunk() { return ShardSizing(Mode::Chunk); }
ShardSizing ShardSizing::chunk(std::vector<int64_t> global_shape) {
  ShardSizing s(Mode::Chunk);
  s.global_shape_ = std::move(global_shape);
  return s;
}
ShardSizing ShardSizing::infer() { return ShardSizing(Mode::Infer); }
ShardSizing ShardSizing::given(ShardSizes sizes) {
  ShardSizing s(Mode::Given);
  s.sizes_ = std::move(sizes);
  return s;
}

namespace {

// Every rank's local shape, gathered over the mesh, in row-major mesh order.
struct GatheredShapes {
  std::vector<std::vector<int64_t>> shapes;
};

// Two all-gathers: first (ndim, dtype, device type), which must agree before shapes of one
// length can be exchanged, then the shapes themselves.
GatheredShapes gather_local_shapes(const DeviceMesh& mesh, const at::Tensor& local) {
  const auto meta_options = local.options().dtype(at::kLong);
  at::Tensor header = at::tensor(std::vector<int64_t>{local.dim(), static_cast<int64_t>(local.scalar_type()),
                                                      static_cast<int64_t>(local.device().type())},
                                 at::kLong)
                          .to(meta_options.device());
  at::Tensor headers = all_gather_over_mesh(mesh, header).cpu();
  for (int64_t r = 1; r < mesh.size(); ++r) {
    auto field = [&](int64_t rank_index, int64_t i) { return headers[rank_index][i].item<int64_t>(); };
    TORCH_CHECK(field(r, 0) == field(0, 0), "from_local: local tensors have different numbers of dims: global rank ",
                mesh.ranks()[0], " has ", field(0, 0), " and global rank ", mesh.ranks()[r], " has ", field(r, 0),
                "; every rank must pass a piece of the same-rank tensor.");
    TORCH_CHECK(field(r, 1) == field(0, 1), "from_local: local tensors have different dtypes: global rank ",
                mesh.ranks()[0], " has ", c10::toString(static_cast<c10::ScalarType>(field(0, 1))), " and global rank ",
                mesh.ranks()[r], " has ", c10::toString(static_cast<c10::ScalarType>(field(r, 1))), ".");
    TORCH_CHECK(field(r, 2) == field(0, 2), "from_local: local tensors are on different device types: global rank ",
                mesh.ranks()[0], " has ", static_cast<c10::DeviceType>(field(0, 2)), " and global rank ",
                mesh.ranks()[r], " has ", static_cast<c10::DeviceType>(field(r, 2)), ".");
  }
  GatheredShapes out;
  if (local.dim() == 0) {
    out.shapes.assign(mesh.size(), {});
    return out;
  }
  at::Tensor shape = at::tensor(local.sizes().vec(), at::kLong).to(meta_options.device());
  at::Tensor shapes = all_gather_over_mesh(mesh, shape).cpu().contiguous();
  const int64_t* p = shapes.data_ptr<int64_t>();
  for (int64_t r = 0; r < mesh.size(); ++r) out.shapes.emplace_back(p + r * local.dim(), p + (r + 1) * local.dim());
  return out;
}

struct InferredLayout {
  std::vector<int64_t> global_shape;
  ShardSizes sizes;
};

// Rebuilds the shard-size tables from every rank's shape. Ranks that hold the same piece
// (replicas along mesh dims that do not shard this tensor dim) must agree on its size, and an
// unsharded dim must have one size everywhere; otherwise the pieces do not concatenate.
InferredLayout infer_layout(const DeviceMesh& mesh, const Placements& placements, const GatheredShapes& gathered) {
  const int64_t ndim = static_cast<int64_t>(gathered.shapes.front().size());
  InferredLayout out;
  out.global_shape.resize(ndim);
  for (int64_t d = 0; d < ndim; ++d) {
    DimSharding sharding;
    sharding.tensor_dim = d;
    int64_t pieces = 1;
    for (int64_t m = 0; m < mesh.ndim(); ++m) {
      if (placements[m].is_shard(d)) {
        sharding.mesh_dims.push_back(m);
        pieces *= mesh.size(m);
      }
    }
    std::vector<int64_t> table(pieces, -1);
    std::vector<int64_t> first_row(pieces, -1);  // mesh position of the first rank seen holding the piece
    for (int64_t r = 0; r < mesh.size(); ++r) {
      const int64_t global_rank = mesh.ranks()[r];
      const int64_t piece = sharding.piece_index(mesh.shape(), mesh.coordinate_of(global_rank));
      const int64_t size = gathered.shapes[r][d];
      if (table[piece] < 0) {
        table[piece] = size;
        first_row[piece] = r;
        continue;
      }
      TORCH_CHECK(table[piece] == size, "from_local: local shapes do not concatenate to one tensor under ",
                  to_string(placements), " on ", mesh, ": tensor dim ", d,
                  (sharding.mesh_dims.empty() ? " is not sharded, so every rank must have the same size there"
                                              : " must have the same size on ranks that hold the same shard"),
                  ", but global rank ", mesh.ranks()[first_row[piece]], " has [", join(gathered.shapes[first_row[piece]], ", "),
                  "] and global rank ", global_rank, " has [", join(gathered.shapes[r], ", "), "].");
    }
    int64_t total = 0;
    for (int64_t s : table) total += s;
    out.global_shape[d] = total;
    if (!sharding.mesh_dims.empty()) out.sizes.push_back({d, table});
  }
  return out;
}

// The spec the arguments describe, without communication.
ShardTensorSpec spec_from_arguments(const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                                    const ShardSizing& sizing) {
  std::vector<int64_t> global = local.sizes().vec();
  switch (sizing.mode()) {
    case ShardSizing::Mode::Chunk:
      if (sizing.global_shape()) {
        global = *sizing.global_shape();
        TORCH_CHECK(global.size() == static_cast<size_t>(local.dim()), "from_local: global shape [", join(global, ", "),
                    "] has ", global.size(), " dims but the local tensor has ", local.dim(), ".");
      } else {
        for (int64_t m = 0; m < mesh.ndim(); ++m)
          if (placements[m].is_shard()) global[placements[m].tensor_dim] *= mesh.size(m);
      }
      return ShardTensorSpec(mesh, placements, global, local.scalar_type());
    case ShardSizing::Mode::Given:
      for (const DimShardSizes& dim_sizes : sizing.sizes()) {
        TORCH_CHECK(dim_sizes.tensor_dim >= 0 && dim_sizes.tensor_dim < local.dim(), "from_local: shard sizes given for tensor dim ",
                    dim_sizes.tensor_dim, ", which a ", local.dim(), "-d tensor does not have.");
        int64_t total = 0;
        for (int64_t s : dim_sizes.sizes) total += s;
        global[dim_sizes.tensor_dim] = total;
      }
      return ShardTensorSpec(mesh, placements, global, local.scalar_type(), sizing.sizes());
    case ShardSizing::Mode::Infer:
      break;
  }
  TORCH_INTERNAL_ASSERT(false, "spec_from_arguments does not handle Infer");
}

void check_local_matches(const ShardTensorSpec& spec, const at::Tensor& local) {
  const std::vector<int64_t> expected = spec.local_shape();
  TORCH_CHECK(local.sizes().vec() == expected, "from_local: global rank ", spec.mesh().rank(), " at mesh coordinate (",
              join(spec.mesh().coordinate(), ", "), ") passed a local tensor of shape [", join(local.sizes(), ", "),
              "] but ", spec, " gives it shape [", join(expected, ", "), "]. Pass matching shard sizes, or use ",
              "ShardSizing::infer() to take the sizes from the local tensors.");
}

// The ShardTensor over `local`; the gradient comes back in the forward layout (Partial as
// Replicate) and leaves as this rank's local piece.
at::Tensor wrap_differentiably(const at::Tensor& local, ShardTensorSpec spec) {
  const ShardTensorSpec grad_layout = gradient_layout(spec);
  return attach_grad_fn(make_shard_tensor(local, std::move(spec)), local,
                        [grad_layout](const at::Tensor& grad) { return to_local(move_to(grad, grad_layout)); },
                        "FromLocalBackward");
}

}  // namespace

void check_on_mesh_device(const char* api, const at::Tensor& t, const DeviceMesh& mesh) {
  TORCH_CHECK(t.device() == mesh.device(), api, ": the tensor is on ", t.device(), " but this rank's pieces of ", mesh,
              " (a '", mesh.device_type(), "' mesh) live on ", mesh.device(), "; move the tensor there (.to(",
              mesh.device(), ")) or build the mesh with that device type.");
}

at::Tensor from_local(const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                      const ShardSizing& sizing, bool run_check) {
  TORCH_CHECK(local.defined(), "from_local: the local tensor is undefined.");
  TORCH_CHECK(!is_shard_tensor(local), "from_local: expects this rank's plain local tensor, got a ShardTensor (",
              spec(local), "); use redistribute to change its layout.");
  check_on_mesh_device("from_local", local, mesh);
  const Placements normalized = normalize_placements("from_local", mesh, placements, local.dim());

  if (sizing.mode() == ShardSizing::Mode::Infer) {
    InferredLayout layout = infer_layout(mesh, normalized, gather_local_shapes(mesh, local));
    return wrap_differentiably(local, ShardTensorSpec(mesh, normalized, layout.global_shape, local.scalar_type(), layout.sizes));
  }

  ShardTensorSpec spec = spec_from_arguments(local, mesh, normalized, sizing);
  if (run_check) {
    // Compare every rank's shape with the layout, on every rank, before anyone raises.
    GatheredShapes gathered = gather_local_shapes(mesh, local);
    for (int64_t r = 0; r < mesh.size(); ++r) {
      const std::vector<int64_t> coord = mesh.coordinate_of(mesh.ranks()[r]);
      TORCH_CHECK(gathered.shapes[r] == spec.local_shape(coord), "from_local(run_check): global rank ", mesh.ranks()[r],
                  " at mesh coordinate (", join(coord, ", "), ") passed a local tensor of shape [",
                  join(gathered.shapes[r], ", "), "] but ", spec, " gives it shape [", join(spec.local_shape(coord), ", "),
                  "].");
    }
  } else {
    check_local_matches(spec, local);
  }
  return wrap_differentiably(local, std::move(spec));
}

}  // namespace shardtensor
