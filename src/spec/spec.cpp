// ShardTensorSpec: validation, the shard-size tables, local shapes and offsets. Pure metadata:
// no tensors, no communication. See the worked examples in include/shardtensor/spec.h.
#include "shardtensor/spec.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <numeric>
#include <ostream>
#include <sstream>

#include "spec/placement_checks.h"
#include "spec/sequence_order.h"
#include "util/hash.h"
#include "util/strings.h"

namespace shardtensor {

std::vector<int64_t> chunk_sizes(int64_t size, int64_t num_shards) {
  TORCH_CHECK_VALUE(num_shards >= 1, "chunk_sizes: cannot split into ", num_shards, " shards.");
  TORCH_CHECK_VALUE(size >= 0, "chunk_sizes: cannot split a dim of size ", size, ".");
  const int64_t piece = (size + num_shards - 1) / num_shards;
  std::vector<int64_t> sizes(num_shards);
  int64_t left = size;
  for (int64_t i = 0; i < num_shards; ++i) {
    sizes[i] = std::min(piece, left);
    left -= sizes[i];
  }
  return sizes;
}

int64_t DimSharding::piece_index(const std::vector<int64_t>& mesh_shape, const std::vector<int64_t>& coordinate) const {
  int64_t index = 0;
  for (int64_t m : mesh_dims) index = index * mesh_shape[m] + coordinate[m];
  return index;
}

struct ShardTensorSpec::Data {
  DeviceMesh mesh;
  Placements placements;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  c10::ScalarType dtype;
  std::vector<DimSharding> shardings;
  bool even = true;
  size_t hash = 0;
};

namespace {

std::string describe(const DeviceMesh& mesh, const Placements& ps, const std::vector<int64_t>& shape) {
  return to_string(ps) + " on " + mesh.to_string() + " for global shape [" + join(shape, ", ") + "]";
}

// Default table for a tensor dim split by `mesh_dims` in order: chunk the whole dim over the
// outer mesh dim, then chunk every piece over the next one, and so on.
std::vector<int64_t> default_table(int64_t size, const std::vector<int64_t>& mesh_dims, const std::vector<int64_t>& mesh_shape) {
  std::vector<int64_t> table = {size};
  for (int64_t m : mesh_dims) {
    std::vector<int64_t> next;
    for (int64_t piece : table)
      for (int64_t s : chunk_sizes(piece, mesh_shape[m])) next.push_back(s);
    table = std::move(next);
  }
  return table;
}

// `context()` describes the spec for error messages; it is only called when a check fails.
template <class Context>
void check_explicit_table(const DimShardSizes& given, const DimSharding& sharding, int64_t global_size,
                          int64_t expected_entries, const Context& context) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(given.sizes.size()) == expected_entries, "ShardTensorSpec: ",
              given.sizes.size(), " shard sizes [", join(given.sizes, ", "), "] given for tensor dim ",
              given.tensor_dim, ", which is split by mesh dims (", join(sharding.mesh_dims, ", "), ") into ",
              expected_entries, " pieces; give one size per piece (", context(), ").");
  int64_t total = 0;
  for (int64_t s : given.sizes) total += s;
  TORCH_CHECK_VALUE(total == global_size, "ShardTensorSpec: shard sizes [", join(given.sizes, ", "),
              "] for tensor dim ", given.tensor_dim, " add up to ", total, " but the dim has global size ",
              global_size, " (", context(), ").");
}

}  // namespace

Placements normalize_placements(const std::string& api, const DeviceMesh& mesh, Placements placements, int64_t ndim) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(placements.size()) == mesh.ndim(), api, ": ", placements.size(), " placements ",
              to_string(placements), " given for the ", mesh.ndim(), "-d ", mesh.to_string(),
              "; give exactly one placement per mesh dim.");
  for (Placement& p : placements) {
    if (!p.is_shard()) continue;
    const int64_t d = p.tensor_dim;
    TORCH_CHECK_VALUE(d >= -ndim && d < ndim, api, ": Shard(", d, ") in ", to_string(placements), " is out of range for a ",
                ndim, "-d tensor; valid tensor dims are [", -ndim, ", ", ndim, ").");
    if (d < 0) p.tensor_dim = d + ndim;
  }
  return placements;
}

ShardTensorSpec::ShardTensorSpec(DeviceMesh mesh, Placements placements, std::vector<int64_t> global_shape,
                                 c10::ScalarType dtype, const ShardSizes& sizes) {
  const int64_t ndim = static_cast<int64_t>(global_shape.size());
  placements = normalize_placements("ShardTensorSpec", mesh, std::move(placements), ndim);
  // Spelled out only when a check fails: building it on every spec would dominate planning.
  std::shared_ptr<Data> data;  // once built, it owns what `context` describes
  const auto context = [&] {
    return data ? describe(data->mesh, data->placements, data->shape) : describe(mesh, placements, global_shape);
  };
  // Negative shard sizes first: from_local derives the global shape from them.
  for (const DimShardSizes& given : sizes)
    for (int64_t s : given.sizes)
      TORCH_CHECK_VALUE(s >= 0, "ShardTensorSpec: shard sizes [", join(given.sizes, ", "), "] for tensor dim ",
                  given.tensor_dim, " contain the negative size ", s, "; sizes must be >= 0 (", context(), ").");
  for (int64_t s : global_shape)
    TORCH_CHECK_VALUE(s >= 0, "ShardTensorSpec: global shape [", join(global_shape, ", "), "] has a negative size.");

  data = std::make_shared<Data>(Data{std::move(mesh), std::move(placements), std::move(global_shape), {}, dtype, {}, true, 0});
  data->stride.assign(ndim, 1);
  for (int64_t d = ndim - 2; d >= 0; --d) data->stride[d] = data->stride[d + 1] * std::max<int64_t>(data->shape[d + 1], 1);

  // Group mesh dims by the tensor dim they shard; ascending mesh-dim order is the nesting order.
  for (int64_t d = 0; d < ndim; ++d) {
    DimSharding sharding;
    sharding.tensor_dim = d;
    for (int64_t m = 0; m < data->mesh.ndim(); ++m) {
      if (!data->placements[m].is_shard(d)) continue;
      sharding.mesh_dims.push_back(m);
      if (!data->placements[m].is_zigzag()) continue;
      sharding.zigzag = true;
      sharding.zigzag_unit = data->placements[m].zigzag_unit;
    }
    TORCH_CHECK_VALUE(!sharding.zigzag || sharding.mesh_dims.size() == 1, "ShardTensorSpec: tensor dim ", d,
                      " is split by mesh dims (", join(sharding.mesh_dims, ", "), ") and one of them splits it in zigzag order (",
                      context(), "); a zigzag dim is split by its one mesh dim only. Redistribute the others off it first.");
    if (!sharding.mesh_dims.empty()) data->shardings.push_back(std::move(sharding));
  }

  for (const DimShardSizes& given : sizes) {
    TORCH_CHECK_VALUE(std::count_if(sizes.begin(), sizes.end(), [&](const DimShardSizes& o) { return o.tensor_dim == given.tensor_dim; }) == 1,
                "ShardTensorSpec: shard sizes for tensor dim ", given.tensor_dim, " are given more than once (", context(), ").");
    auto it = std::find_if(data->shardings.begin(), data->shardings.end(),
                           [&](const DimSharding& s) { return s.tensor_dim == given.tensor_dim; });
    TORCH_CHECK_VALUE(it != data->shardings.end(), "ShardTensorSpec: shard sizes [", join(given.sizes, ", "),
                "] given for tensor dim ", given.tensor_dim, ", which no placement shards (", context(),
                "); give sizes only for sharded tensor dims.");
  }

  for (DimSharding& sharding : data->shardings) {
    int64_t entries = 1;
    for (int64_t m : sharding.mesh_dims) entries *= data->mesh.size(m);
    const int64_t global_size = data->shape[sharding.tensor_dim];
    auto given = std::find_if(sizes.begin(), sizes.end(), [&](const DimShardSizes& s) { return s.tensor_dim == sharding.tensor_dim; });
    if (given != sizes.end()) {
      check_explicit_table(*given, sharding, global_size, entries, context);
      sharding.sizes = given->sizes;
    } else {
      TORCH_CHECK_VALUE(!sharding.zigzag || global_size % sharding.zigzag_unit == 0, "ShardTensorSpec: tensor dim ", sharding.tensor_dim,
                        " of size ", global_size, " is split in zigzag order in units of ", sharding.zigzag_unit,
                        " positions, which do not divide it (", context(), ").");
      sharding.sizes = sharding.zigzag ? zigzag_sizes_in_units(global_size, entries, sharding.zigzag_unit)
                                       : default_table(global_size, sharding.mesh_dims, data->mesh.shape());
    }
    TORCH_CHECK_VALUE(!sharding.zigzag || (global_size % sharding.zigzag_unit == 0 &&
                                           sharding.sizes == zigzag_sizes_in_units(global_size, entries, sharding.zigzag_unit)),
                      "ShardTensorSpec: shard sizes [", join(sharding.sizes, ", "), "] given for tensor dim ", sharding.tensor_dim,
                      ", which is split in zigzag order (", context(), "); zigzag pieces of ", global_size, " over ", entries,
                      " ranks have the sizes zigzag_shard_sizes gives only.");
    sharding.offsets.resize(sharding.sizes.size());
    std::exclusive_scan(sharding.sizes.begin(), sharding.sizes.end(), sharding.offsets.begin(), int64_t{0});
    data->even = data->even && std::all_of(sharding.sizes.begin(), sharding.sizes.end(),
                                           [&](int64_t s) { return s == sharding.sizes.front(); });
  }

  size_t h = data->mesh.hash();
  for (const Placement& p : data->placements) h = hash_combine(h, p.hash());
  for (int64_t s : data->shape) h = hash_combine(h, static_cast<size_t>(s));
  h = hash_combine(h, static_cast<size_t>(dtype));
  for (const DimSharding& s : data->shardings)
    for (int64_t v : s.sizes) h = hash_combine(h, static_cast<size_t>(v));
  data->hash = h;
  data_ = std::move(data);
}

const DeviceMesh& ShardTensorSpec::mesh() const { return data_->mesh; }
const Placements& ShardTensorSpec::placements() const { return data_->placements; }
const std::vector<int64_t>& ShardTensorSpec::shape() const { return data_->shape; }
const std::vector<int64_t>& ShardTensorSpec::stride() const { return data_->stride; }
c10::ScalarType ShardTensorSpec::dtype() const { return data_->dtype; }
int64_t ShardTensorSpec::ndim() const { return static_cast<int64_t>(data_->shape.size()); }
const std::vector<DimSharding>& ShardTensorSpec::shardings() const { return data_->shardings; }
bool ShardTensorSpec::is_even() const { return data_->even; }
size_t ShardTensorSpec::hash() const { return data_->hash; }

const DimSharding* ShardTensorSpec::sharding_of(int64_t tensor_dim) const {
  for (const DimSharding& s : data_->shardings)
    if (s.tensor_dim == tensor_dim) return &s;
  return nullptr;
}

ShardSizes ShardTensorSpec::shard_sizes() const {
  ShardSizes out;
  for (const DimSharding& s : data_->shardings) out.push_back({s.tensor_dim, s.sizes});
  return out;
}

bool ShardTensorSpec::is_replicated() const {
  return std::all_of(data_->placements.begin(), data_->placements.end(), [](const Placement& p) { return p.is_replicate(); });
}

bool ShardTensorSpec::has_partial() const {
  return std::any_of(data_->placements.begin(), data_->placements.end(), [](const Placement& p) { return p.is_partial(); });
}

namespace {
void check_coordinate(const DeviceMesh& mesh, const std::vector<int64_t>& coordinate) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(coordinate.size()) == mesh.ndim(), "ShardTensorSpec: coordinate (",
              join(coordinate, ", "), ") does not match the ", mesh.ndim(), "-d ", mesh.to_string(), ".");
  for (int64_t d = 0; d < mesh.ndim(); ++d)
    TORCH_CHECK_VALUE(coordinate[d] >= 0 && coordinate[d] < mesh.shape()[d], "ShardTensorSpec: coordinate (",
                join(coordinate, ", "), ") is outside ", mesh.to_string(), ".");
}
}  // namespace

std::vector<int64_t> ShardTensorSpec::local_shape(const std::vector<int64_t>& coordinate) const {
  check_coordinate(data_->mesh, coordinate);
  std::vector<int64_t> shape = data_->shape;
  for (const DimSharding& s : data_->shardings)
    shape[s.tensor_dim] = s.sizes[s.piece_index(data_->mesh.shape(), coordinate)];
  return shape;
}

std::vector<int64_t> ShardTensorSpec::local_offsets(const std::vector<int64_t>& coordinate) const {
  check_coordinate(data_->mesh, coordinate);
  std::vector<int64_t> offsets(data_->shape.size(), 0);
  for (const DimSharding& s : data_->shardings) {
    TORCH_CHECK_VALUE(!s.zigzag, "ShardTensorSpec: tensor dim ", s.tensor_dim, " of ", to_string(),
                      " is split in zigzag order, so each piece is two stretches of it with no single offset; "
                      "zigzag_unshard it (or redistribute it to Shard) for an in-order layout.");
    offsets[s.tensor_dim] = s.offsets[s.piece_index(data_->mesh.shape(), coordinate)];
  }
  return offsets;
}

// A rank outside the mesh holds the empty piece: zero in every dim (a 0-d tensor's piece is
// 0-d, as DTensor's); see DeviceMesh::includes_this_rank.
std::vector<int64_t> ShardTensorSpec::local_shape() const {
  if (!data_->mesh.includes_this_rank()) return std::vector<int64_t>(data_->shape.size(), 0);
  return local_shape(data_->mesh.coordinate());
}

std::vector<int64_t> ShardTensorSpec::local_offsets() const {
  if (!data_->mesh.includes_this_rank()) return std::vector<int64_t>(data_->shape.size(), 0);
  return local_offsets(data_->mesh.coordinate());
}

bool ShardTensorSpec::operator==(const ShardTensorSpec& other) const {
  if (data_ == other.data_) return true;
  if (data_->hash != other.data_->hash) return false;
  if (data_->mesh != other.data_->mesh || data_->placements != other.data_->placements ||
      data_->shape != other.data_->shape || data_->dtype != other.data_->dtype)
    return false;
  for (size_t i = 0; i < data_->shardings.size(); ++i)
    if (data_->shardings[i].sizes != other.data_->shardings[i].sizes) return false;
  return true;
}

std::string ShardTensorSpec::to_string() const {
  std::ostringstream os;
  os << "ShardTensorSpec(" << shardtensor::to_string(data_->placements) << " on " << data_->mesh << ", shape ["
     << join(data_->shape, ", ") << "], " << c10::toString(data_->dtype);
  for (const DimSharding& s : data_->shardings) os << ", dim " << s.tensor_dim << " sizes [" << join(s.sizes, ", ") << "]";
  return os.str() + ")";
}

std::ostream& operator<<(std::ostream& os, const ShardTensorSpec& spec) { return os << spec.to_string(); }

}  // namespace shardtensor
