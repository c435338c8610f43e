// Factories and scatter_tensor. Each rank builds only the piece its spec assigns it; random
// values are a pure function of (seed, global element index), so they do not depend on the
// layout. See include/shardtensor/factories.h.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "shardtensor/factories.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>


#include "api/conversions.h"
#include "comm/agreement.h"
#include "comm/comm.h"
#include "dispatch/shard_tensor_impl.h"
#include "redistribute/executor.h"
#include "shardtensor/shard_tensor.h"
#include "spec/placement_checks.h"
#include "spec/sequence_order.h"
#include "util/counter_random.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

ShardTensorSpec spec_of(const FactoryLayout& layout) {
  const c10::ScalarType dtype = c10::typeMetaToScalarType(layout.options.dtype());
  return ShardTensorSpec(layout.mesh,
                         normalize_placements("factory", layout.mesh, layout.placements, static_cast<int64_t>(layout.shape.size())),
                         layout.shape, dtype, layout.sizes);
}

c10::TensorOptions local_options(const FactoryLayout& layout) {
  return layout.options.requires_grad(false).device(layout.mesh.device());
}

at::Tensor wrap(at::Tensor local, ShardTensorSpec spec, bool requires_grad) {
  at::Tensor out = new_shard_tensor(std::move(local), std::move(spec));
  if (requires_grad) out.set_requires_grad(true);
  return out;
}

at::Tensor filled(const FactoryLayout& layout, std::optional<double> value) {
  ShardTensorSpec spec = spec_of(layout);
  at::Tensor local = at::empty(spec.local_shape(), local_options(layout));
  if (value) local.fill_(*value);
  return wrap(std::move(local), std::move(spec), layout.options.requires_grad());
}

at::Tensor random(const FactoryLayout& layout, std::optional<uint64_t> seed, bool normal) {
  ShardTensorSpec spec = spec_of(layout);
  TORCH_CHECK_VALUE(!has_zigzag(spec), "rand/randn: placements ", to_string(spec.placements()),
                    " split a dim in zigzag order, which random factories do not draw; draw with Shard and zigzag_shard the result.");
  // Drawn outside the mesh too, so that the key stream stays in step (see KernelPlan::random_keys_drawn).
  const uint64_t key = seed ? *seed : next_random_key_on(layout.mesh);
  at::Tensor values = layout.mesh.includes_this_rank()
                          ? counter_draws(spec.local_offsets(), spec.local_shape(), spec.shape(), key, normal).to(local_options(layout))
                          : piece_outside_mesh(spec, local_options(layout));
  return wrap(std::move(values), std::move(spec), layout.options.requires_grad());
}

}  // namespace

at::Tensor empty(const FactoryLayout& layout) { return filled(layout, std::nullopt); }
at::Tensor zeros(const FactoryLayout& layout) { return filled(layout, 0.0); }
at::Tensor ones(const FactoryLayout& layout) { return filled(layout, 1.0); }
at::Tensor full(const FactoryLayout& layout, double value) { return filled(layout, value); }
at::Tensor rand(const FactoryLayout& layout, std::optional<uint64_t> seed) { return random(layout, seed, /*normal=*/false); }
at::Tensor randn(const FactoryLayout& layout, std::optional<uint64_t> seed) { return random(layout, seed, /*normal=*/true); }
void manual_seed(uint64_t seed) { set_random_seed(seed); }
void manual_seed(uint64_t seed, const DeviceMesh& mesh) { seed_checked_over(mesh, seed); }

at::Tensor scatter_tensor(const at::Tensor& tensor_on_src, int64_t src_rank, const DeviceMesh& mesh,
                          const Placements& placements, bool requires_grad, const std::optional<std::vector<int64_t>>& global_shape,
                          std::optional<c10::ScalarType> expected_dtype) {
  const auto& ranks = mesh.ranks();
  const auto src_it = std::find(ranks.begin(), ranks.end(), src_rank);
  TORCH_CHECK_VALUE(src_it != ranks.end(), "scatter_tensor: source rank ", src_rank, " is not in ", mesh, " (ranks [",
                    join(ranks, ", "), "]).");
  const int64_t root = src_it - ranks.begin();
  const bool is_src = mesh.rank() == src_rank;
  Comm& comm = mesh.mesh_comm();
  const c10::TensorOptions meta = at::TensorOptions().dtype(at::kLong).device(mesh.device());
  // The source's header in one broadcast: [defined, ndim, dtype, shape...], the shape inline up
  // to kInlineDims dims (a second broadcast carries a longer one). An undefined source tensor,
  // or a global_shape or dtype that is not the source's, raises on every rank that learns it.
  constexpr int64_t kInlineDims = 8;
  const bool defined = is_src && tensor_on_src.defined();
  std::vector<int64_t> words{defined, defined ? tensor_on_src.dim() : 0,
                             defined ? static_cast<int64_t>(tensor_on_src.scalar_type()) : 0};
  words.resize(3 + kInlineDims, 0);
  for (int64_t d = 0; defined && d < std::min<int64_t>(tensor_on_src.dim(), kInlineDims); ++d) words[3 + d] = tensor_on_src.size(d);
  at::Tensor header = at::tensor(words, at::kLong).to(meta.device());
  comm.broadcast(header, root);
  header = header.cpu().contiguous();
  const int64_t* h = header.data_ptr<int64_t>();
  TORCH_CHECK_VALUE(h[0] == 1, "scatter_tensor: the source rank ", src_rank, " passed an undefined tensor.");
  const int64_t ndim = h[1];
  const auto dtype = static_cast<c10::ScalarType>(h[2]);
  std::vector<int64_t> shape(h + 3, h + 3 + std::min(ndim, kInlineDims));
  if (ndim > kInlineDims) {
    at::Tensor rest = is_src ? at::tensor(tensor_on_src.sizes().slice(kInlineDims).vec(), at::kLong).to(meta.device())
                             : at::empty({ndim - kInlineDims}, meta);
    comm.broadcast(rest, root);
    rest = rest.cpu().contiguous();
    shape.insert(shape.end(), rest.data_ptr<int64_t>(), rest.data_ptr<int64_t>() + rest.numel());
  }
  TORCH_CHECK_VALUE(!global_shape || *global_shape == shape, "scatter_tensor: global_shape=[", join(*global_shape, ", "),
                    "] on rank ", mesh.rank(), ", but the source rank ", src_rank, " holds a tensor of shape [", join(shape, ", "), "].");
  TORCH_CHECK_VALUE(!expected_dtype || *expected_dtype == dtype, "scatter_tensor: dtype=", *expected_dtype, " on rank ",
                    mesh.rank(), ", but the source rank ", src_rank, " holds a tensor of dtype ", dtype, ".");
  const ShardTensorSpec spec(mesh, normalize_placements("scatter_tensor", mesh, placements, ndim), shape, dtype);

  // One scatter: only the source sends, each rank exactly its box.
  const c10::TensorOptions data = at::TensorOptions().dtype(dtype).device(mesh.device());
  const at::Tensor source = is_src ? tensor_on_src.detach().to(data) : at::empty({0}, data);
  at::Tensor received = scatter_boxes(source, mesh.coordinate_of(src_rank), spec);
  return wrap(received, spec, requires_grad);
}

}  // namespace shardtensor
