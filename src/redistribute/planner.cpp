// plan_redistribute: gives the steps a planner chains (moves.h) their concrete layouts, caches
// plans, explains them, and builds redistribute's target specs.
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <optional>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "redistribute/boxes.h"
#include "redistribute/moves.h"
#include "redistribute/plan.h"
#include "shardtensor/log.h"
#include "redistribute/transport.h"
#include "shardtensor/redistribute.h"
#include "spec/placement_checks.h"
#include "spec/sequence_order.h"
#include "util/hash.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

// Sums of consecutive groups of n entries: a table without its innermost split.
std::vector<int64_t> group_sums(const std::vector<int64_t>& table, int64_t n) {
  std::vector<int64_t> sums(table.size() / n, 0);
  for (size_t i = 0; i < table.size(); ++i) sums[i / n] += table[i];
  return sums;
}

// The table of `tensor_dim` once `mesh_dim` splits it innermost: every current piece is split
// in n, the target's way when the target nests the same mesh dims over these very pieces
// (so uneven targets need no extra step), else by torch.chunk.
std::vector<int64_t> split_table(const ShardTensorSpec& current, int64_t tensor_dim, int64_t mesh_dim,
                                 const ShardTensorSpec& target) {
  const DimSharding* before = current.sharding_of(tensor_dim);
  const std::vector<int64_t> pieces = before ? before->sizes : std::vector<int64_t>{current.shape()[tensor_dim]};
  std::vector<int64_t> mesh_dims = before ? before->mesh_dims : std::vector<int64_t>{};
  mesh_dims.push_back(mesh_dim);
  const int64_t n = current.mesh().size(mesh_dim);
  const DimSharding* wanted = target.sharding_of(tensor_dim);
  if (wanted && wanted->mesh_dims == mesh_dims && group_sums(wanted->sizes, n) == pieces) return wanted->sizes;
  std::vector<int64_t> table;
  for (int64_t piece : pieces)
    for (int64_t s : chunk_sizes(piece, n)) table.push_back(s);
  return table;
}

// The layout after a one-mesh-dim move: tables of untouched dims stay, the dim the move stops
// splitting loses its innermost split, the dim it starts splitting gains one.
ShardTensorSpec after_move(const ShardTensorSpec& current, const MoveStep& move, const ShardTensorSpec& target) {
  const int64_t m = mesh_dim_of(move);
  const Placement before = current.placements()[m];
  const std::optional<int64_t> starts = starts_sharding(move);
  Placements placements = current.placements();
  placements[m] = starts ? Shard(*starts) : Replicate();
  ShardSizes sizes;
  for (const DimSharding& s : current.shardings()) {
    if (before.is_shard(s.tensor_dim)) {
      if (s.mesh_dims.size() > 1) sizes.push_back({s.tensor_dim, group_sums(s.sizes, current.mesh().size(m))});
    } else if (!(starts && s.tensor_dim == *starts)) {
      sizes.push_back({s.tensor_dim, s.sizes});
    }
  }
  if (starts) sizes.push_back({*starts, split_table(current, *starts, m, target)});
  return ShardTensorSpec(current.mesh(), std::move(placements), current.shape(), current.dtype(), sizes);
}

// The exact price of a final Exchange that only fixes shard sizes: what the busiest rank lacks.
double size_fix_cost(const ShardTensorSpec& current, const ShardTensorSpec& target) {
  int64_t busiest = 0;
  for (int64_t rank : current.mesh().ranks()) {
    const auto coordinate = current.mesh().coordinate_of(rank);
    const Box wanted = box_of(target, coordinate);
    busiest = std::max(busiest, wanted.numel() - intersect(box_of(current, coordinate), wanted).numel());
  }
  return planning::kLatencyBytes + static_cast<double>(busiest) * static_cast<double>(c10::elementSize(current.dtype()));
}

// An Exchange into or out of zigzag order: every rank may receive all it holds after.
double exchange_cost(const ShardTensorSpec& after) {
  int64_t busiest = 0;
  for (int64_t rank : after.mesh().ranks()) {
    const std::vector<int64_t> shape = after.local_shape(after.mesh().coordinate_of(rank));
    busiest = std::max(busiest, std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>()));
  }
  return planning::kLatencyBytes + static_cast<double>(busiest) * static_cast<double>(c10::elementSize(after.dtype()));
}

// `spec` (in piece order) with the zigzag placements of `like` back where it still splits
// those dims as `like` does.
ShardTensorSpec with_zigzag_of(const ShardTensorSpec& spec, const ShardTensorSpec& like) {
  Placements placements = spec.placements();
  bool changed = false;
  for (size_t m = 0; m < placements.size(); ++m) {
    const Placement& z = like.placements()[m];
    if (!z.is_zigzag() || !placements[m].is_shard(z.tensor_dim) || spec.sharding_of(z.tensor_dim)->sizes != like.sharding_of(z.tensor_dim)->sizes)
      continue;
    placements[m] = z;
    changed = true;
  }
  return changed ? ShardTensorSpec(spec.mesh(), std::move(placements), spec.shape(), spec.dtype(), spec.shard_sizes()) : spec;
}

RedistributePlan make_plan(const ShardTensorSpec& source, const ShardTensorSpec& target, Planner planner);

// Between layouts of which either splits a dim in zigzag order (spec/sequence_order.h): one
// Exchange puts the dims the source zigzags and the target does not keep so in order, the usual
// moves run between the layouts as their pieces see them (to those moves a zigzag dim both keep
// is a dim numbered in the ranks' order), and one Exchange puts the dims the target zigzags in
// that order. Where the source is replicated along a mesh dim the target zigzags, it stays so up
// to the last Exchange, which then only cuts; where no usual move runs between the two Exchanges,
// they are one.
RedistributePlan make_zigzag_plan(const ShardTensorSpec& source, const ShardTensorSpec& target, Planner planner) {
  // The in-order layouts take the other end's sizes where it splits the dim in order too, so
  // that zigzag_shard of an uneven split, or zigzag_unshard to one, is one Exchange.
  const Placements& from = source.placements();
  const Placements& to = target.placements();
  Placements unzigzagged = from;
  ShardSizes target_sizes;
  for (size_t m = 0; m < from.size(); ++m) {
    if (from[m] == to[m] || !from[m].is_zigzag()) continue;
    unzigzagged[m] = Shard(from[m].tensor_dim);
    const DimSharding* wanted = target.sharding_of(from[m].tensor_dim);
    if (wanted && !wanted->zigzag && wanted->mesh_dims == std::vector<int64_t>{static_cast<int64_t>(m)})
      target_sizes.push_back({wanted->tensor_dim, wanted->sizes});
  }
  const ShardTensorSpec in_order_source = relayout(source, unzigzagged, target_sizes);
  Placements before_zigzag = to;
  for (size_t m = 0; m < to.size(); ++m)
    if (from[m] != to[m] && to[m].is_zigzag()) before_zigzag[m] = unzigzagged[m].is_replicate() ? Replicate() : Shard(to[m].tensor_dim);
  ShardSizes own_sizes;  // the target's, but for the dims it zigzags: those as the source has them
  for (const DimSharding& s : target.shardings())
    if (!s.zigzag) own_sizes.push_back({s.tensor_dim, s.sizes});
  const ShardTensorSpec in_order_target = relayout(in_order_source, before_zigzag, own_sizes);

  RedistributePlan plan;
  // Out of one zigzag order and straight into another (another unit, say): one Exchange, whose
  // parts go from the source's stretches to the target's, instead of two.
  if (!(in_order_source == source) && in_order_source == in_order_target && !(in_order_target == target)) {
    plan.steps.push_back({LoweredStep(ExchangeStep{}, source, target), target, exchange_cost(target)});
    return plan;
  }
  if (!(in_order_source == source))
    plan.steps.push_back({LoweredStep(ExchangeStep{}, source, in_order_source), in_order_source, exchange_cost(in_order_source)});
  for (PlannedStep& step : make_plan(in_piece_order(in_order_source), in_piece_order(in_order_target), planner).steps) {
    step.after = with_zigzag_of(step.after, in_order_target);
    plan.steps.push_back(std::move(step));
  }
  if (!(in_order_target == target))
    plan.steps.push_back({LoweredStep(ExchangeStep{}, in_order_target, target), target, exchange_cost(target)});
  return plan;
}

RedistributePlan make_plan(const ShardTensorSpec& source, const ShardTensorSpec& target, Planner planner) {
  RedistributePlan plan;
  if (source == target) return plan;
  if (has_zigzag(source) || has_zigzag(target)) return make_zigzag_plan(source, target, planner);
  const planning::Problem problem(source, target);
  const std::vector<MoveStep> moves = planner == Planner::Greedy ? planning::greedy_moves(problem) : planning::searched_moves(problem);
  ShardTensorSpec current = source;
  planning::Codes codes = problem.source();
  for (const MoveStep& move : moves) {
    ShardTensorSpec next = std::holds_alternative<ExchangeStep>(move) ? target : after_move(current, move, target);
    plan.steps.push_back({LoweredStep(move, current, next), next, problem.cost(codes, move)});
    codes = problem.apply(codes, move);
    current = std::move(next);
  }
  if (!(current == target))
    plan.steps.push_back({LoweredStep(ExchangeStep{}, current, target), target, size_fix_cost(current, target)});
  return plan;
}

using PlanKey = std::tuple<ShardTensorSpec, ShardTensorSpec, Planner, ResolvedTransportOptions>;
struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    const ResolvedTransportOptions& o = std::get<3>(k);
    size_t h = hash_combine(hash_combine(std::get<0>(k).hash(), std::get<1>(k).hash()), static_cast<size_t>(std::get<2>(k)));
    h = hash_combine(h, static_cast<size_t>(o.preference) * 4 + (o.peer_memory ? 2 : 0) + (o.shared_arena ? 1 : 0));
    h = hash_combine(h, static_cast<size_t>(o.peer_copy_bytes));
    return hash_combine(h, static_cast<size_t>(o.message_bytes));
  }
};

}  // namespace

std::string to_string(Planner planner) { return planner == Planner::Greedy ? "greedy" : "graph search"; }

namespace {
Planner planner_from_environment() {
  const char* name = std::getenv("SHARDTENSOR_PLANNER");
  if (!name || std::string(name).empty() || std::string(name) == "graph") return Planner::GraphSearch;
  TORCH_CHECK(std::string(name) == "greedy", "SHARDTENSOR_PLANNER is '", name, "'; use 'graph' (the default) or 'greedy'.");
  return Planner::Greedy;
}
std::atomic<Planner>& chosen_planner() {
  static std::atomic<Planner> planner{planner_from_environment()};
  return planner;
}
}  // namespace

Planner default_planner() { return chosen_planner().load(std::memory_order_relaxed); }
void set_default_planner(Planner planner) { chosen_planner().store(planner); }

double RedistributePlan::cost() const {
  double total = 0;
  for (const PlannedStep& s : steps) total += s.cost;
  return total;
}

std::string RedistributePlan::to_string() const {
  if (steps.empty()) return "(no work)";
  std::string out;
  for (size_t i = 0; i < steps.size(); ++i) out += (i ? " -> " : "") + shardtensor::to_string(steps[i].step());
  return out;
}

namespace {

struct PlanCache {
  std::mutex mutex;
  std::unordered_map<PlanKey, std::shared_ptr<const RedistributePlan>, PlanKeyHash> plans;
};

PlanCache& plan_cache() {
  static PlanCache cache;
  return cache;
}

}  // namespace

std::shared_ptr<const RedistributePlan> plan_redistribute(const ShardTensorSpec& source, const ShardTensorSpec& target,
                                                          Planner planner, const ResolvedTransportOptions& options) {
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  PlanKey key{source, target, planner, options};
  auto it = cache.plans.find(key);
  if (it == cache.plans.end()) {
    auto plan = std::make_shared<const RedistributePlan>(plan_redistribute_uncached(source, target, planner, options));
    it = cache.plans.emplace(std::move(key), std::move(plan)).first;
    if (debug_log_enabled())
      log_line(LogLevel::Debug, "redistribute plan: " + source.to_string() + " -> " + to_string(target.placements()) + ": " +
                                    (it->second->empty() ? std::string("nothing moves") : it->second->to_string()));
  }
  return it->second;
}

void clear_plan_cache() {
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.plans.clear();
}

RedistributePlan plan_redistribute_uncached(const ShardTensorSpec& source, const ShardTensorSpec& target, Planner planner,
                                            const ResolvedTransportOptions& options) {
  TORCH_CHECK(source.mesh() == target.mesh(), "redistribute: source is on ", source.mesh(), " and target on ",
              target.mesh(), "; redistributing to another mesh is not supported.");
  TORCH_CHECK(source.shape() == target.shape() && source.dtype() == target.dtype(), "redistribute: source ", source,
              " and target ", target, " differ in shape or dtype.");
  for (size_t m = 0; m < source.placements().size(); ++m) {  // before any rank moves a byte
    const Placement& p = source.placements()[m];
    if (p.is_partial() && p != target.placements()[m]) check_reducible(source.dtype(), p.reduce_op);
  }
  RedistributePlan plan = make_plan(source, target, planner);
  // Lowered once: each step's parts (make_plan) and its transport on this rank, which the
  // executor and explain read.
  plan.lowered_with = options;
  const ShardTensorSpec* before = &source;
  for (PlannedStep& s : plan.steps) {
    s.transport = transport_for(s.step(), *before, s.after, options);
    before = &s.after;
  }
  return plan;
}

std::string explain_redistribute(const ShardTensorSpec& source, const ShardTensorSpec& target, Planner planner,
                                 const ResolvedTransportOptions& options) {
  const std::shared_ptr<const RedistributePlan> held = plan_redistribute(source, target, planner, options);
  const RedistributePlan& plan = *held;
  std::string out = to_string(source.placements());
  for (const PlannedStep& s : plan.steps)
    out += " -[" + to_string(s.step()) + " by " + to_string(s.transport) + "]-> " + to_string(s.after.placements());
  if (plan.empty()) return out + " (no work)";
  std::ostringstream cost;
  cost << " (" << to_string(planner) << ", modelled cost " << plan.cost() / 1e6 << " MB)";
  return out + cost.str();
}

std::string explain_redistribute(const ShardTensorSpec& source, const ShardTensorSpec& target) {
  return explain_redistribute(source, target, default_planner());
}

std::string explain_redistribute(const ShardTensorSpec& source, const ShardTensorSpec& target, const TransportOptions& options) {
  return explain_redistribute(source, target, default_planner(), resolve(options));
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
    if (!is_given && before && before->mesh_dims == s.mesh_dims && before->zigzag == s.zigzag &&
        before->zigzag_unit == s.zigzag_unit)
      sizes.push_back({s.tensor_dim, before->sizes});
  }
  return ShardTensorSpec(source.mesh(), placements, source.shape(), source.dtype(), sizes);
}

}  // namespace shardtensor
