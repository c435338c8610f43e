// The graph-search planner: Dijkstra over placement layouts (see moves.h), from the source's
// to the target's, with the cost model's price on every move. Its moves include every move the
// greedy planner makes, so its chain never costs more; they also include Exchange, one
// all-to-all of exactly the missing box intersections, which is how nested and uneven cases
// avoid the gather-then-chunk detours of per-mesh-dim steps.
//
// A layout is at most one byte per mesh dim, so a 3-D mesh over a 3-D tensor has at most
// 5^3 = 125 of them; the search visits a fraction of those.
#include <c10/util/Exception.h>

#include <functional>
#include <queue>
#include <unordered_map>

#include "redistribute/moves.h"

namespace shardtensor::planning {
namespace {

struct Distance {
  double cost;
  int steps;  // ties go to the shorter chain
  bool operator<(const Distance& o) const { return cost != o.cost ? cost < o.cost : steps < o.steps; }
  bool operator>(const Distance& o) const { return o < *this; }
};

struct Reached {
  Distance distance;
  Codes parent;
  MoveStep move;
  bool settled = false;
};

}  // namespace

std::vector<MoveStep> searched_moves(const Problem& problem) {
  using Entry = std::pair<Distance, Codes>;
  auto later = [](const Entry& a, const Entry& b) { return a.first > b.first; };
  std::priority_queue<Entry, std::vector<Entry>, decltype(later)> frontier(later);
  std::unordered_map<Codes, Reached> reached;
  reached.reserve(128);

  reached[problem.source()] = Reached{{0, 0}, problem.source(), ExchangeStep{}};
  frontier.push({{0, 0}, problem.source()});
  while (!frontier.empty()) {
    const auto [distance, codes] = frontier.top();
    frontier.pop();
    Reached& here = reached[codes];
    if (here.settled) continue;
    here.settled = true;
    if (codes == problem.target()) break;
    problem.for_each_move(codes, [&, distance = distance, codes = codes](const MoveStep& move, Codes next) {
      const Distance through{distance.cost + problem.cost(codes, move), distance.steps + 1};
      auto [it, fresh] = reached.try_emplace(next, Reached{through, codes, move});
      if (!fresh) {
        if (it->second.settled || !(through < it->second.distance)) return;
        it->second = Reached{through, codes, move};
      }
      frontier.push({through, next});
    });
  }

  // Always reachable: all-reduce every Partial, then Exchange.
  TORCH_INTERNAL_ASSERT(reached.count(problem.target()), "graph planner: the target layout was not reached");
  std::vector<MoveStep> moves;
  for (Codes at = problem.target(); at != problem.source(); at = reached.at(at).parent) moves.push_back(reached.at(at).move);
  return {moves.rbegin(), moves.rend()};
}

}  // namespace shardtensor::planning
