// plan_redistribute: the pure half of redistribution. See the decision table in plan.h.
#include <c10/util/Exception.h>

#include <mutex>
#include <sstream>
#include <unordered_map>

#include "redistribute/boxes.h"
#include "redistribute/plan.h"
#include "spec/placement_checks.h"
#include "util/hash.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

std::vector<std::vector<int64_t>> all_coordinates(const DeviceMesh& mesh) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t rank : mesh.ranks()) out.push_back(mesh.coordinate_of(rank));
  return out;
}

Placements with_placement(Placements ps, int64_t mesh_dim, Placement p) {
  ps[mesh_dim] = p;
  return ps;
}

// The spec `current` becomes when Partial on `mesh_dim` turns into Shard(tensor_dim): the
// target's table for that tensor dim when it nests the same way, else torch.chunk sizes.
ShardTensorSpec reduce_scattered(const ShardTensorSpec& current, const ShardTensorSpec& target, int64_t mesh_dim,
                                 int64_t tensor_dim) {
  Placements ps = with_placement(current.placements(), mesh_dim, Shard(tensor_dim));
  ShardSizes sizes;
  for (const DimShardSizes& s : current.shard_sizes())
    if (s.tensor_dim != tensor_dim) sizes.push_back(s);
  ShardTensorSpec chunked(current.mesh(), ps, current.shape(), current.dtype(), sizes);
  const DimSharding* mine = chunked.sharding_of(tensor_dim);
  const DimSharding* wanted = target.sharding_of(tensor_dim);
  if (wanted && wanted->mesh_dims == mine->mesh_dims) {
    sizes.push_back({tensor_dim, wanted->sizes});
    return ShardTensorSpec(current.mesh(), ps, current.shape(), current.dtype(), sizes);
  }
  return chunked;
}

// A reduce-scatter over the group of `mesh_dim` works when, for every rank, the pieces its
// group members get under `next` tile the box it holds under `current` (they differ only in
// `tensor_dim`). Nested sharding can break this; the planner then all-reduces instead.
bool pieces_tile_current_boxes(const ShardTensorSpec& current, const ShardTensorSpec& next, int64_t mesh_dim,
                               int64_t tensor_dim) {
  const DeviceMesh& mesh = current.mesh();
  for (const auto& coord : all_coordinates(mesh)) {
    const Box whole = box_of(current, coord);
    int64_t expected_offset = whole.offsets[tensor_dim];
    std::vector<int64_t> member = coord;
    for (int64_t i = 0; i < mesh.size(mesh_dim); ++i) {
      member[mesh_dim] = i;
      const Box piece = box_of(next, member);
      for (int64_t d = 0; d < current.ndim(); ++d) {
        if (d == tensor_dim) continue;
        if (piece.offsets[d] != whole.offsets[d] || piece.shape[d] != whole.shape[d]) return false;
      }
      if (piece.offsets[tensor_dim] != expected_offset && piece.shape[tensor_dim] != 0) return false;
      expected_offset += piece.shape[tensor_dim];
    }
    if (expected_offset != whole.offsets[tensor_dim] + whole.shape[tensor_dim]) return false;
  }
  return true;
}

// Whether any rank needs data it does not hold, and how much the busiest receiver gets.
ExchangeStep exchange_between(const ShardTensorSpec& current, const ShardTensorSpec& target) {
  const auto coords = all_coordinates(current.mesh());
  ExchangeStep step{{}, 0};
  std::vector<bool> crosses(current.mesh().ndim(), false);
  for (const auto& receiver : coords) {
    const Box wanted = box_of(target, receiver);
    int64_t received = 0;
    for (const auto& sender : coords) {
      if (sender == receiver || !feeds(current, sender, receiver)) continue;
      const int64_t n = intersect(box_of(current, sender), wanted).numel();
      if (n == 0) continue;
      received += n;
      for (size_t m = 0; m < sender.size(); ++m) crosses[m] = crosses[m] || sender[m] != receiver[m];
    }
    step.max_elements_received = std::max(step.max_elements_received, received);
  }
  for (size_t m = 0; m < crosses.size(); ++m)
    if (crosses[m]) step.mesh_dims.push_back(static_cast<int64_t>(m));
  return step;
}

RedistributePlan make_plan(const ShardTensorSpec& source, const ShardTensorSpec& target) {
  RedistributePlan plan;
  if (source == target) return plan;
  ShardTensorSpec current = source;
  for (int64_t m = 0; m < source.mesh().ndim(); ++m) {
    const Placement& from = source.placements()[m];
    const Placement& to = target.placements()[m];
    if (!from.is_partial() || from == to) continue;
    if (to.is_shard()) {
      ShardTensorSpec next = reduce_scattered(current, target, m, to.tensor_dim);
      if (pieces_tile_current_boxes(current, next, m, to.tensor_dim)) {
        plan.steps.push_back({ReduceScatterStep{m, from.reduce_op, to.tensor_dim}, next});
        current = next;
        continue;
      }
    }
    ShardTensorSpec next(current.mesh(), with_placement(current.placements(), m, Replicate()), current.shape(),
                         current.dtype(), current.shard_sizes());
    plan.steps.push_back({AllReduceStep{m, from.reduce_op}, next});
    current = next;
  }
  if (current == target) return plan;
  ExchangeStep exchange = exchange_between(current, target);
  if (exchange.max_elements_received == 0) {
    plan.steps.push_back({LocalSliceStep{}, target});
  } else {
    plan.steps.push_back({exchange, target});
  }
  return plan;
}

struct SpecPairHash {
  size_t operator()(const std::pair<ShardTensorSpec, ShardTensorSpec>& p) const {
    return hash_combine(p.first.hash(), p.second.hash());
  }
};

}  // namespace

std::string to_string(const RedistributeStep& step) {
  std::ostringstream os;
  if (auto* s = std::get_if<AllReduceStep>(&step)) {
    os << "AllReduce(mesh_dim=" << s->mesh_dim << ", " << to_string(s->op) << ")";
  } else if (auto* s = std::get_if<ReduceScatterStep>(&step)) {
    os << "ReduceScatter(mesh_dim=" << s->mesh_dim << ", tensor_dim=" << s->tensor_dim << ", " << to_string(s->op) << ")";
  } else if (std::holds_alternative<LocalSliceStep>(step)) {
    os << "LocalSlice()";
  } else if (auto* s = std::get_if<ExchangeStep>(&step)) {
    os << "Exchange(mesh_dims=[" << join(s->mesh_dims, ", ") << "], max_received=" << s->max_elements_received << ")";
  }
  return os.str();
}

std::string RedistributePlan::to_string() const {
  if (steps.empty()) return "(no work)";
  std::string out;
  for (size_t i = 0; i < steps.size(); ++i) out += (i ? " -> " : "") + shardtensor::to_string(steps[i].step);
  return out;
}

const RedistributePlan& plan_redistribute(const ShardTensorSpec& source, const ShardTensorSpec& target) {
  TORCH_CHECK(source.mesh() == target.mesh(), "redistribute: source is on ", source.mesh(), " and target on ",
              target.mesh(), "; redistributing to another mesh is not supported.");
  TORCH_CHECK(source.shape() == target.shape() && source.dtype() == target.dtype(), "redistribute: source ", source,
              " and target ", target, " differ in shape or dtype.");
  static std::mutex mutex;
  static std::unordered_map<std::pair<ShardTensorSpec, ShardTensorSpec>, RedistributePlan, SpecPairHash> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto key = std::make_pair(source, target);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(std::move(key), make_plan(source, target)).first;
  return it->second;  // unordered_map never moves its values, so the reference stays valid
}

RedistributePlan plan_redistribute_uncached(const ShardTensorSpec& source, const ShardTensorSpec& target) {
  return make_plan(source, target);
}

std::string explain_redistribute(const ShardTensorSpec& source, const ShardTensorSpec& target) {
  const RedistributePlan& plan = plan_redistribute(source, target);
  std::string out = to_string(source.placements());
  for (const PlannedStep& s : plan.steps) out += " -[" + to_string(s.step) + "]-> " + to_string(s.after.placements());
  return plan.empty() ? out + " (no work)" : out;
}

ShardTensorSpec redistribute_target(const ShardTensorSpec& source, const Placements& requested, const ShardSizes* sizes) {
  Placements placements = normalize_placements("redistribute", source.mesh(), requested, source.ndim());
  for (size_t m = 0; m < placements.size(); ++m) {
    TORCH_CHECK(!placements[m].is_partial() || placements[m] == source.placements()[m], "redistribute: cannot make ",
                to_string(placements[m]), " on mesh dim ", m, " from ", to_string(source.placements()),
                "; Partial placements only come out of operators. Ask for Replicate() or Shard(d).");
  }
  return relayout(source, placements, sizes ? *sizes : ShardSizes{});
}

ShardTensorSpec relayout(const ShardTensorSpec& source, const Placements& placements, const ShardSizes& given) {
  ShardSizes sizes = given;
  ShardTensorSpec chunked(source.mesh(), placements, source.shape(), source.dtype(), given);
  for (const DimSharding& s : chunked.shardings()) {
    const bool is_given = std::any_of(given.begin(), given.end(), [&](const DimShardSizes& g) { return g.tensor_dim == s.tensor_dim; });
    const DimSharding* before = source.sharding_of(s.tensor_dim);
    if (!is_given && before && before->mesh_dims == s.mesh_dims) sizes.push_back({s.tensor_dim, before->sizes});
  }
  return ShardTensorSpec(source.mesh(), placements, source.shape(), source.dtype(), sizes);
}

}  // namespace shardtensor
