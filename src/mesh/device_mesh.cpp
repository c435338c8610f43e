// DeviceMesh topology: shapes, coordinates, slices, equality. Communicators are created in
// src/comm (mesh_setup.cpp) and only stored here.
#include "shardtensor/device_mesh.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <ostream>
#include <sstream>

#include "mesh/mesh_impl.h"
#include "util/hash.h"
#include "util/strings.h"

namespace shardtensor {

std::chrono::milliseconds MeshOptions::default_timeout() {
  if (const char* s = std::getenv("SHARDTENSOR_TIMEOUT_S")) {
    char* end = nullptr;
    double seconds = std::strtod(s, &end);
    TORCH_CHECK(end != s && seconds > 0, "SHARDTENSOR_TIMEOUT_S='", s, "' must be a positive number of seconds.");
    return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  }
  return std::chrono::minutes(5);
}

namespace {
// Meshes are equal when shape and rank layout are (and device type, compared separately).
size_t layout_hash(const std::vector<int64_t>& shape, const std::vector<int64_t>& ranks) {
  size_t h = shape.size();
  for (int64_t s : shape) h = hash_combine(h, static_cast<size_t>(s));
  for (int64_t r : ranks) h = hash_combine(h, static_cast<size_t>(r));
  return h;
}
}  // namespace

std::shared_ptr<DeviceMesh::Impl> make_mesh_topology(std::vector<int64_t> shape, std::vector<int64_t> ranks,
                                                     std::vector<std::string> dim_names, int64_t my_rank,
                                                     int64_t world_size) {
  TORCH_CHECK_VALUE(!shape.empty(), "DeviceMesh: the mesh shape is empty; give at least one mesh dim, e.g. {",
              world_size, "}.");
  int64_t total = 1;
  for (int64_t s : shape) {
    TORCH_CHECK_VALUE(s >= 1, "DeviceMesh: mesh shape ", join(shape, "x"), " has a dim of size ", s,
                "; every mesh dim needs at least one rank.");
    total *= s;
  }
  TORCH_CHECK_VALUE(static_cast<int64_t>(ranks.size()) == total, "DeviceMesh: ", ranks.size(),
              " ranks were listed for mesh shape ", join(shape, "x"), ", which needs ", total, ".");
  // A mesh may span a subset of the world (DTensor's DeviceMesh("cpu", [0, 2])); the ranks
  // outside it hold no shard of its tensors (see DeviceMesh::includes_this_rank).
  for (int64_t r : ranks)
    TORCH_CHECK_VALUE(r >= 0 && r < world_size, "DeviceMesh: the rank layout [", join(ranks, ", "), "] names rank ", r,
                ", which is not in the world of ", world_size, " ranks (0..", world_size - 1, ").");
  std::vector<int64_t> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  const auto repeated = std::adjacent_find(sorted.begin(), sorted.end());
  TORCH_CHECK_VALUE(repeated == sorted.end(), "DeviceMesh: the rank layout [", join(ranks, ", "), "] lists rank ",
              *repeated, " more than once; every rank may hold one coordinate only.");
  TORCH_CHECK_VALUE(dim_names.empty() || dim_names.size() == shape.size(), "DeviceMesh: ", dim_names.size(),
              " dim names [", join(dim_names, ", "), "] given for a ", shape.size(), "-d mesh; give none or one per dim.");
  for (size_t i = 0; i < dim_names.size(); ++i)
    for (size_t j = i + 1; j < dim_names.size(); ++j)
      TORCH_CHECK_VALUE(dim_names[i] != dim_names[j], "DeviceMesh: dim name '", dim_names[i], "' is used twice.");

  auto impl = std::make_shared<DeviceMesh::Impl>();
  impl->shape = std::move(shape);
  impl->ranks = std::move(ranks);
  impl->dim_names = std::move(dim_names);
  impl->rank = my_rank;
  const auto mine = std::find(impl->ranks.begin(), impl->ranks.end(), my_rank);
  if (mine != impl->ranks.end()) impl->coordinate = coordinate_at(impl->shape, mine - impl->ranks.begin());
  impl->hash = layout_hash(impl->shape, impl->ranks);
  return impl;
}

std::vector<int64_t> coordinate_at(const std::vector<int64_t>& shape, int64_t position) {
  std::vector<int64_t> coordinate(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    coordinate[d] = position % shape[d];
    position /= shape[d];
  }
  return coordinate;
}

std::vector<int64_t> ranks_along(const DeviceMesh::Impl& mesh, int64_t mesh_dim, const std::vector<int64_t>& coordinate) {
  std::vector<int64_t> out;
  std::vector<int64_t> c = coordinate;
  for (int64_t i = 0; i < mesh.shape[mesh_dim]; ++i) {
    c[mesh_dim] = i;
    int64_t flat = 0;
    for (size_t d = 0; d < c.size(); ++d) flat = flat * mesh.shape[d] + c[d];
    out.push_back(mesh.ranks[flat]);
  }
  return out;
}

DeviceMesh::DeviceMesh(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {
  TORCH_INTERNAL_ASSERT(impl_);
}

DeviceMesh DeviceMesh::without_comms(std::vector<int64_t> shape, int64_t my_rank, std::vector<std::string> dim_names,
                                     const std::string& device_type) {
  TORCH_CHECK(device_type == "cpu" || device_type == "cuda", "DeviceMesh::without_comms: device type '", device_type,
              "' is not 'cpu' or 'cuda'.");
  int64_t total = 1;
  for (int64_t s : shape) total *= s;
  std::vector<int64_t> ranks(static_cast<size_t>(std::max<int64_t>(total, 0)));
  for (int64_t i = 0; i < total; ++i) ranks[i] = i;
  TORCH_CHECK(my_rank >= 0 && my_rank < std::max<int64_t>(total, 1), "DeviceMesh::without_comms: rank ", my_rank,
              " is not in a mesh of shape ", join(shape, "x"), ".");
  auto impl = make_mesh_topology(std::move(shape), std::move(ranks), std::move(dim_names), my_rank, total);
  impl->device_type = device_type;
  impl->device = c10::Device(device_type == "cuda" ? c10::kCUDA : c10::kCPU);
  return DeviceMesh(std::move(impl));
}

int64_t DeviceMesh::ndim() const { return static_cast<int64_t>(impl_->shape.size()); }
const std::vector<int64_t>& DeviceMesh::shape() const { return impl_->shape; }
int64_t DeviceMesh::size() const { return static_cast<int64_t>(impl_->ranks.size()); }
const std::vector<std::string>& DeviceMesh::dim_names() const { return impl_->dim_names; }
int64_t DeviceMesh::rank() const { return impl_->rank; }
// A mesh has at least one dim, so only a rank outside it has no coordinate.
bool DeviceMesh::includes_this_rank() const { return !impl_->coordinate.empty(); }

const std::vector<int64_t>& DeviceMesh::coordinate() const {
  check_includes_this_rank("has no coordinate in it");
  return impl_->coordinate;
}

void DeviceMesh::check_includes_this_rank(const char* consequence) const {
  TORCH_CHECK(includes_this_rank(), "DeviceMesh: global rank ", impl_->rank, " is not one of the ranks [",
              join(impl_->ranks, ", "), "] of ", to_string(), ", so it ", consequence,
              ". Ranks outside a mesh hold no shard of its tensors; their ops are no-ops that keep global shapes. "
              "Run this on the mesh's ranks only (DeviceMesh.get_coordinate() is None elsewhere).");
}
const std::vector<int64_t>& DeviceMesh::ranks() const { return impl_->ranks; }
const std::string& DeviceMesh::device_type() const { return impl_->device_type; }
c10::Device DeviceMesh::device() const { return impl_->device; }
std::chrono::milliseconds DeviceMesh::timeout() const { return impl_->timeout; }
bool DeviceMesh::has_comms() const { return !impl_->comms.empty(); }
size_t DeviceMesh::hash() const { return impl_->hash; }

int64_t DeviceMesh::size(int64_t mesh_dim) const {
  TORCH_CHECK_VALUE(mesh_dim >= 0 && mesh_dim < ndim(), "DeviceMesh::size: mesh dim ", mesh_dim,
              " is out of range for ", to_string(), "; valid mesh dims are [0, ", ndim(), ").");
  return impl_->shape[mesh_dim];
}

int64_t DeviceMesh::mesh_dim(const std::string& name) const {
  auto it = std::find(impl_->dim_names.begin(), impl_->dim_names.end(), name);
  TORCH_CHECK_VALUE(it != impl_->dim_names.end(), "DeviceMesh: no mesh dim is named '", name, "' in ", to_string(),
              "; the names are [", join(impl_->dim_names, ", "), "].");
  return it - impl_->dim_names.begin();
}

std::vector<int64_t> DeviceMesh::coordinate_of(int64_t global_rank) const {
  auto it = std::find(impl_->ranks.begin(), impl_->ranks.end(), global_rank);
  TORCH_CHECK_VALUE(it != impl_->ranks.end(), "DeviceMesh: rank ", global_rank, " is not in ", to_string(), ".");
  return coordinate_at(impl_->shape, it - impl_->ranks.begin());
}

int64_t DeviceMesh::rank_at(const std::vector<int64_t>& coordinate) const {
  TORCH_CHECK_VALUE(static_cast<int64_t>(coordinate.size()) == ndim(), "DeviceMesh::rank_at: coordinate (",
              join(coordinate, ", "), ") has ", coordinate.size(), " entries for ", to_string(), ".");
  int64_t flat = 0;
  for (int64_t d = 0; d < ndim(); ++d) {
    TORCH_CHECK_VALUE(coordinate[d] >= 0 && coordinate[d] < impl_->shape[d], "DeviceMesh::rank_at: coordinate (",
                join(coordinate, ", "), ") is outside ", to_string(), ".");
    flat = flat * impl_->shape[d] + coordinate[d];
  }
  return impl_->ranks[flat];
}

DeviceMesh DeviceMesh::submesh(int64_t mesh_dim) const {
  size(mesh_dim);  // range check
  check_includes_this_rank("has no slice of it to take");
  auto sub = std::make_shared<Impl>();
  sub->shape = {impl_->shape[mesh_dim]};
  if (!impl_->dim_names.empty()) sub->dim_names = {impl_->dim_names[mesh_dim]};
  sub->ranks = ranks_along(*impl_, mesh_dim, impl_->coordinate);
  sub->rank = impl_->rank;
  sub->coordinate = {impl_->coordinate[mesh_dim]};
  if (has_comms()) {
    sub->comms = {impl_->comms[mesh_dim]};
    sub->mesh_comm = impl_->comms[mesh_dim];  // a 1-D mesh's whole group is its one dim's group
  }
  sub->device_type = impl_->device_type;
  sub->device = impl_->device;
  sub->timeout = impl_->timeout;
  sub->hash = layout_hash(sub->shape, sub->ranks);
  sub->parent = impl_;
  sub->parent_dim = mesh_dim;
  return DeviceMesh(std::move(sub));
}

DeviceMesh DeviceMesh::submesh(const std::string& dim_name) const { return submesh(mesh_dim(dim_name)); }

std::optional<std::pair<DeviceMesh, int64_t>> DeviceMesh::parent() const {
  if (!impl_->parent) return std::nullopt;
  return std::make_pair(DeviceMesh(impl_->parent), impl_->parent_dim);
}


namespace {
CommHandOut comm_hand_out = nullptr;  // set_comm_hand_out

Comm& handed_out(Comm& group_comm) { return comm_hand_out ? comm_hand_out(group_comm) : group_comm; }
}  // namespace

void set_comm_hand_out(CommHandOut hand_out) { comm_hand_out = hand_out; }

Comm& DeviceMesh::comm(int64_t mesh_dim) const {
  check_includes_this_rank("cannot communicate on it");
  TORCH_CHECK(has_comms(), "DeviceMesh: ", to_string(),
              " was built without communicators (DeviceMesh::without_comms) and cannot run collectives.");
  size(mesh_dim);
  return handed_out(*impl_->comms[mesh_dim]);
}

Comm& DeviceMesh::mesh_comm() const {
  check_includes_this_rank("cannot communicate on it");
  TORCH_CHECK(has_comms(), "DeviceMesh: ", to_string(),
              " was built without communicators (DeviceMesh::without_comms) and cannot run collectives.");
  TORCH_CHECK(impl_->mesh_comm, "DeviceMesh: ", to_string(), " has no mesh-wide group; it was built with ",
              "from_process_groups without `mesh_group`. Pass a group over all its ranks to move data across mesh dims.");
  return handed_out(*impl_->mesh_comm);
}

bool DeviceMesh::operator==(const DeviceMesh& other) const {
  if (impl_ == other.impl_) return true;
  return impl_->hash == other.impl_->hash && impl_->shape == other.impl_->shape &&
         impl_->ranks == other.impl_->ranks && impl_->device_type == other.impl_->device_type;
}

bool DeviceMesh::same_groups(const DeviceMesh& other) const {
  if (impl_ == other.impl_) return true;
  return *this == other && impl_->comms == other.impl_->comms && impl_->mesh_comm == other.impl_->mesh_comm;
}

std::string DeviceMesh::to_string() const {
  std::ostringstream os;
  os << "mesh(";
  for (int64_t d = 0; d < ndim(); ++d) {
    if (d > 0) os << (impl_->dim_names.empty() ? "x" : " x ");
    if (!impl_->dim_names.empty()) os << impl_->dim_names[d] << "=";
    os << impl_->shape[d];
  }
  return os.str() + ")";
}

std::ostream& operator<<(std::ostream& os, const DeviceMesh& mesh) { return os << mesh.to_string(); }

}  // namespace shardtensor
