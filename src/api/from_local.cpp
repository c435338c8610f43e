// from_local: building a ShardTensor from each rank's piece, in the three sizing modes.
//
// Chunk and Given work out the layout from each rank's arguments alone; a user's mistake can make
// ranks work out different layouts (pieces that are not chunk-shaped, sizes that differ between
// ranks). So every rank then gathers what the others read, one small all-gather over the mesh
// (comm/agreement.h), and all raise the same error, or none does. Infer gathers the local
// shapes too and builds the layout from them. SHARDTENSOR_CHECK_AGREEMENT=0 skips the gather
// for Chunk and Given (without run_check): each rank then checks only its own piece.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include "api/conversions.h"
#include "autograd/grad_fn.h"
#include "comm/agreement.h"
#include "dispatch/library.h"
#include "dispatch/shard_tensor_impl.h"
#include "redistribute/executor.h"
#include "shardtensor/shard_tensor.h"
#include "spec/placement_checks.h"
#include "util/hash.h"
#include "util/strings.h"

#include <algorithm>
#include <optional>

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
ShardSizing ShardSizing::trusted(ShardSizes sizes) {
  ShardSizing s = given(std::move(sizes));
  s.trusted_ = true;
  return s;
}

namespace {

// What each rank read from its arguments, as one row of the agreement gather (comm/agreement.h).
// Every rank reads alone, the rows are compared on every rank, and all raise together or none.
enum Column : size_t { kFailed, kNdim, kDtype, kDeviceType, kLayout, kRequiresGrad, kStrideOrder, kColumns };

// The order of the local tensor's dims in memory, outermost first, as a number (dims in base
// ndim; a hash past 15 dims, where that would overflow): compared by run_check and read back by
// dim_order_of. -1 where a rank's strides say nothing about it (an empty piece, or a dim of
// size 1, whose stride is arbitrary).
constexpr int64_t kMostDimsEncoded = 15;

int64_t stride_order_code(const at::Tensor& local) {
  if (local.numel() == 0) return -1;
  for (int64_t d = 0; d < local.dim(); ++d)
    if (local.size(d) == 1) return -1;
  std::vector<int64_t> dims(local.dim());
  for (int64_t d = 0; d < local.dim(); ++d) dims[d] = d;
  std::stable_sort(dims.begin(), dims.end(), [&](int64_t a, int64_t b) { return local.stride(a) > local.stride(b); });
  if (local.dim() > kMostDimsEncoded) return static_cast<int64_t>(stable_hash(join(dims, ",")) >> 1);
  int64_t code = 0;
  for (int64_t d : dims) code = code * local.dim() + d;
  return code;
}

std::vector<int64_t> dim_order_of(int64_t code, int64_t ndim) {
  std::vector<int64_t> dims(ndim);
  for (int64_t k = ndim - 1; k >= 0; --k) {
    dims[k] = code % ndim;
    code /= ndim;
  }
  return dims;
}

std::vector<int64_t> row_of(const at::Tensor& local, const std::optional<ShardTensorSpec>& spec, const std::exception_ptr& failure) {
  std::vector<int64_t> row(kColumns, 0);
  row[kFailed] = failure_code(failure);
  if (failure) return row;
  row[kNdim] = local.dim();
  row[kDtype] = static_cast<int64_t>(local.scalar_type());
  row[kDeviceType] = static_cast<int64_t>(local.device().type());
  row[kLayout] = spec ? static_cast<int64_t>(stable_hash(spec->to_string()) >> 1) : 0;
  row[kRequiresGrad] = local.requires_grad();
  row[kStrideOrder] = stride_order_code(local);
  return row;
}

// ndim, dtype and device type must agree before shapes of one length can be exchanged.
void check_same_kind_of_tensor(const DeviceMesh& mesh, const AgreementRows& rows) {
  const auto& ranks = mesh.ranks();
  if (const auto r = first_row_differing(rows, kNdim)) {
    TORCH_CHECK_VALUE(false, "from_local: local tensors have different numbers of dims: global rank ", ranks[0], " has ",
                rows[0][kNdim], " and global rank ", ranks[*r], " has ", rows[*r][kNdim],
                "; every rank must pass a piece of the same-rank tensor.");
  }
  if (const auto r = first_row_differing(rows, kDtype)) {
    TORCH_CHECK_VALUE(false, "from_local: local tensors have different dtypes: global rank ", ranks[0], " has ",
                c10::toString(static_cast<c10::ScalarType>(rows[0][kDtype])), " and global rank ", ranks[*r], " has ",
                c10::toString(static_cast<c10::ScalarType>(rows[*r][kDtype])), ".");
  }
  if (const auto r = first_row_differing(rows, kDeviceType)) {
    TORCH_CHECK_VALUE(false, "from_local: local tensors are on different device types: global rank ", ranks[0], " has ",
                static_cast<c10::DeviceType>(rows[0][kDeviceType]), " and global rank ", ranks[*r], " has ",
                static_cast<c10::DeviceType>(rows[*r][kDeviceType]), ".");
  }
}

// run_check: besides the shapes, requires_grad and the order of the dims in memory.
void check_same_tensor_properties(const DeviceMesh& mesh, const AgreementRows& rows) {
  const auto& ranks = mesh.ranks();
  if (const auto r = first_row_differing(rows, kRequiresGrad)) {
    TORCH_CHECK_VALUE(false, "from_local(run_check): local tensors differ in requires_grad: global rank ", ranks[0], " has ",
                rows[0][kRequiresGrad] ? "True" : "False", " and global rank ", ranks[*r], " has ",
                rows[*r][kRequiresGrad] ? "True" : "False", ".");
  }
  int64_t first = -1;
  for (size_t r = 0; r < rows.size(); ++r) {
    if (rows[r][kStrideOrder] < 0) continue;  // no say
    if (first < 0) {
      first = static_cast<int64_t>(r);
    } else {
      TORCH_CHECK_VALUE(rows[r][kStrideOrder] == rows[first][kStrideOrder], "from_local(run_check): local tensors lay their dims ",
                  "out in different orders in memory (strides): global rank ", ranks[first], " and global rank ", ranks[r],
                  " differ; call .contiguous() on every rank, or permute every piece alike.");
    }
  }
}

// Every rank's local shape, gathered over the mesh, in row-major mesh order.
struct GatheredShapes {
  std::vector<std::vector<int64_t>> shapes;
};

// Local shapes of up to this many dims ride in the agreement row (one all-gather for infer, not
// two); longer ones are gathered apart.
constexpr size_t kShapeColumns = 8;

std::vector<int64_t> with_local_shape(std::vector<int64_t> row, const at::Tensor& local) {
  row.resize(kColumns + kShapeColumns, -1);
  if (local.defined() && static_cast<size_t>(local.dim()) <= kShapeColumns)
    std::copy(local.sizes().begin(), local.sizes().end(), row.begin() + kColumns);
  return row;
}

// Every rank's local shape: from the agreement rows, which hold it where it fits (the ranks'
// ndims are equal by now, so every rank takes the same branch).
GatheredShapes local_shapes(const DeviceMesh& mesh, const at::Tensor& local, const AgreementRows& rows) {
  GatheredShapes out;
  if (local.dim() == 0) {
    out.shapes.assign(mesh.size(), {});
    return out;
  }
  if (static_cast<size_t>(local.dim()) > kShapeColumns) {
    out.shapes = gather_rows(mesh, local.sizes().vec());
    return out;
  }
  for (const std::vector<int64_t>& row : rows) out.shapes.emplace_back(row.begin() + kColumns, row.begin() + kColumns + local.dim());
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
      TORCH_CHECK_VALUE(table[piece] == size, "from_local: local shapes do not concatenate to one tensor under ",
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
        TORCH_CHECK_VALUE(global.size() == static_cast<size_t>(local.dim()), "from_local: global shape [", join(global, ", "),
                    "] has ", global.size(), " dims but the local tensor has ", local.dim(), ".");
      } else {
        for (int64_t m = 0; m < mesh.ndim(); ++m)
          if (placements[m].is_shard()) global[placements[m].tensor_dim] *= mesh.size(m);
      }
      return ShardTensorSpec(mesh, placements, global, local.scalar_type());
    case ShardSizing::Mode::Given:
      for (const DimShardSizes& dim_sizes : sizing.sizes()) {
        TORCH_CHECK_VALUE(dim_sizes.tensor_dim >= 0 && dim_sizes.tensor_dim < local.dim(), "from_local: shard sizes given for tensor dim ",
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
  TORCH_CHECK_VALUE(local.sizes().vec() == expected, "from_local: global rank ", spec.mesh().rank(), " at mesh coordinate (",
              join(spec.mesh().coordinate(), ", "), ") passed a local tensor of shape [", join(local.sizes(), ", "),
              "] but ", spec, " gives it shape [", join(expected, ", "), "]. Pass matching shard sizes, or use ",
              "ShardSizing::infer() to take the sizes from the local tensors.");
}

// The ShardTensor over `local`; the gradient comes back in the forward layout (Partial as
// Replicate) and leaves as this rank's local piece.
at::Tensor wrap_differentiably(const at::Tensor& local, ShardTensorSpec spec) {
  const ShardTensorSpec grad_layout = gradient_layout(spec);
  return attach_grad_fn(new_shard_tensor(local, std::move(spec)), local,
                        [grad_layout](const at::Tensor& grad) { return to_local(move_to(grad, grad_layout)); },
                        "FromLocalBackward");
}

// The global strides of a tensor whose pieces every rank lays out in one order of dims that is
// not the identity (a permuted local tensor): the contiguous strides of the global shape in that
// order, as a plain tensor of that layout reports. Empty: contiguous, or no order every rank
// with a say agrees on.
std::vector<int64_t> agreed_global_strides(const AgreementRows& rows, const std::vector<int64_t>& global_shape) {
  const int64_t ndim = static_cast<int64_t>(global_shape.size());
  if (ndim < 2 || ndim > kMostDimsEncoded) return {};
  std::optional<int64_t> code;
  for (const std::vector<int64_t>& row : rows) {
    if (row[kStrideOrder] < 0) continue;
    if (code && *code != row[kStrideOrder]) return {};
    code = row[kStrideOrder];
  }
  if (!code) return {};
  const std::vector<int64_t> order = dim_order_of(*code, ndim);
  if (std::is_sorted(order.begin(), order.end())) return {};
  std::vector<int64_t> strides(ndim);
  int64_t next = 1;
  for (int64_t k = ndim - 1; k >= 0; --k) {
    strides[order[k]] = next;
    next *= std::max<int64_t>(global_shape[order[k]], 1);
  }
  return strides;
}

at::Tensor with_global_strides(at::Tensor wrapper, const AgreementRows& rows) {
  const std::vector<int64_t> strides = agreed_global_strides(rows, wrapper.sizes().vec());
  if (!strides.empty()) shard_tensor_impl(wrapper)->set_global_strides(strides);
  return wrapper;
}

// A rank outside the mesh passes no piece (DTensor's non-participating ranks): it checks only
// its own arguments and takes no part in the agreement gather. Its result has the global shape
// its arguments describe, "infer" read as "chunk" (it cannot see the members' pieces), over the
// empty piece; its local tensor gets a zero gradient.
at::Tensor from_local_outside_mesh(const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                                   const ShardSizing& sizing) {
  TORCH_CHECK_VALUE(local.defined(), "from_local: the local tensor is undefined.");
  const Placements normalized = normalize_placements("from_local", mesh, placements, local.dim());
  ShardTensorSpec spec = spec_from_arguments(local, mesh, normalized,
                                             sizing.mode() == ShardSizing::Mode::Infer ? ShardSizing::chunk() : sizing);
  const std::vector<int64_t> local_shape = local.sizes().vec();
  at::Tensor piece = piece_outside_mesh(spec, local.options().requires_grad(false));
  return attach_grad_fn(new_shard_tensor(std::move(piece), std::move(spec)), local,
                        [local_shape](const at::Tensor& grad) { return at::zeros(local_shape, grad.options()); },
                        "FromLocalBackward");
}

}  // namespace

at::Tensor new_shard_tensor(at::Tensor local, ShardTensorSpec spec) {
  ensure_dispatch_registered();
  return make_shard_tensor(std::move(local), std::move(spec));
}

void check_on_mesh_device(const char* api, const at::Tensor& t, const DeviceMesh& mesh) {
  TORCH_CHECK_VALUE(t.device() == mesh.device(), api, ": the tensor is on ", t.device(), " but this rank's pieces of ", mesh,
              " (a '", mesh.device_type(), "' mesh) live on ", mesh.device(), "; move the tensor there (.to(",
              mesh.device(), ")) or build the mesh with that device type.");
}

at::Tensor from_local(const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                      const ShardSizing& sizing, bool run_check) {
  if (!mesh.includes_this_rank()) return from_local_outside_mesh(local, mesh, placements, sizing);
  const bool infer = sizing.mode() == ShardSizing::Mode::Infer;
  Placements normalized;
  std::optional<ShardTensorSpec> spec;
  const std::exception_ptr failure = failure_of([&] {
    TORCH_CHECK_VALUE(local.defined(), "from_local: the local tensor is undefined.");
    TORCH_CHECK_VALUE(!is_shard_tensor(local), "from_local: expects this rank's plain local tensor, got a ShardTensor (",
                shardtensor::spec(local), "); use redistribute to change its layout.");
    // A meta piece is deferred initialisation (a model built on the meta device, then
    // to_empty): its pieces move to the mesh's device when they are materialised.
    if (!local.is_meta()) check_on_mesh_device("from_local", local, mesh);
    normalized = normalize_placements("from_local", mesh, placements, local.dim());
    if (!infer) {
      spec = spec_from_arguments(local, mesh, normalized, sizing);
      check_local_matches(*spec, local);
    }
  });
  if (!infer && !run_check && (!agreement_checks_enabled() || sizing.is_trusted())) {  // the caller vouches that the ranks agree
    if (failure) std::rethrow_exception(failure);
    return wrap_differentiably(local, std::move(*spec));
  }

  std::vector<int64_t> row = row_of(local, spec, failure);
  const AgreementRows rows = gather_rows(mesh, infer ? with_local_shape(std::move(row), local) : row);
  raise_where_any_rank_failed(mesh, rows, kFailed, failure);
  check_same_kind_of_tensor(mesh, rows);
  if (run_check) check_same_tensor_properties(mesh, rows);
  if (infer) {
    InferredLayout layout = infer_layout(mesh, normalized, local_shapes(mesh, local, rows));
    return with_global_strides(
        wrap_differentiably(local, ShardTensorSpec(mesh, normalized, layout.global_shape, local.scalar_type(), layout.sizes)), rows);
  }
  // Each rank checked its own piece against its layout; equal layouts make that a check of all.
  check_rows_agree(mesh, rows, kLayout, "from_local: the ranks read their arguments as different layouts",
                   [&] { return spec->to_string(); },
                   "Every rank must describe the same global tensor: pass the same shard sizes or global shape on every "
                   "rank, or use ShardSizing::infer() (\"infer\" in Python) to take the sizes from the local tensors.");
  return with_global_strides(wrap_differentiably(local, std::move(*spec)), rows);
}

}  // namespace shardtensor
