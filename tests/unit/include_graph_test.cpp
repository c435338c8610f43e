// The layer rules of docs/design.md ("Layout of the code"), checked on the source tree: every
// `#include "dir/..."` in src/ must point to a layer below its own, c10d headers stay in src/comm, and no header
// pulls in <ATen/ATen.h> or <torch/torch.h>. A new include that breaks a rule fails here, with
// the file and the line; so does an entry of the known-debt list that has been paid off (take
// it out of the list).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;

// The project layers each layer of src/ may include, besides itself, util/ and the public
// shardtensor/ headers. Dependency order (docs/design.md): mesh -> spec -> rules, spec ->
// redistribute (planner) -> comm <- executor, dispatch and autograd on top, api above all.
const std::map<std::string, std::set<std::string>>& allowed() {
  static const std::map<std::string, std::set<std::string>> table = {
      {"util", {}},
      {"mesh", {}},
      {"spec", {"mesh"}},
      {"comm", {"mesh"}},
      {"redistribute", {"mesh", "spec", "comm"}},  // the planner's files: not comm (below)
      {"rules", {"mesh", "spec", "redistribute"}},  // the planner's headers only (below)
      {"domain", {"mesh", "spec", "comm", "redistribute", "rules"}},  // the transports' seam; the moves plans declare
      {"kernels", {"mesh", "spec", "comm", "redistribute", "rules", "domain"}},
      {"autograd", {"mesh", "spec"}},
      {"debug", {"mesh", "spec", "redistribute", "rules"}},
      {"checkpoint", {"mesh", "spec", "comm", "redistribute"}},  // redistribute: the planner's boxes.h only
      {"dispatch", {"mesh", "spec", "comm", "redistribute", "rules", "domain", "kernels", "autograd"}},
      {"api", {"mesh", "spec", "comm", "redistribute", "rules", "domain", "kernels", "autograd", "dispatch", "debug"}},
      // torch::nn modules, on the public API, and fully_shard's gather with its reduce-scatter
      // as one backward function (no composition of public calls reduces in reduce_dtype).
      {"nn", {"autograd"}},
  };
  return table;
}

// Files of redistribute/ that run plans (and so talk to comm/), or choose their transport from
// the process's communication options; the rest is the pure planner.
bool is_executor(const std::string& file) {
  for (const char* runs : {"redistribute/executor", "redistribute/transport.", "redistribute/transports/"})
    if (file.rfind(runs, 0) == 0) return true;
  return false;
}

// Includes that break a rule today and are scheduled to go.
const std::set<std::pair<std::string, std::string>> kKnownDebt = {};

struct Include {
  std::string file;  // relative to src/
  int line;
  std::string target;  // as written between the quotes or brackets
  bool quoted;
};

std::vector<Include> includes_of_src() {
  const fs::path src = fs::path(SHARDTENSOR_SOURCE_DIR) / "src";
  std::vector<Include> out;
  for (const auto& entry : fs::recursive_directory_iterator(src)) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".h" && ext != ".cpp" && ext != ".cu") continue;
    const std::string file = fs::relative(entry.path(), src).generic_string();
    std::ifstream in(entry.path());
    std::string text;
    for (int line = 1; std::getline(in, text); ++line) {
      const size_t at = text.find("#include");
      if (at != 0) continue;
      const size_t open = text.find_first_of("\"<", at);
      if (open == std::string::npos) continue;
      const size_t close = text.find_first_of("\">", open + 1);
      out.push_back({file, line, text.substr(open + 1, close - open - 1), text[open] == '"'});
    }
  }
  return out;
}

std::string layer_of(const std::string& path) { return path.substr(0, path.find('/')); }

TEST(IncludeGraph, EveryProjectIncludePointsDownward) {
  const std::vector<Include> all = includes_of_src();
  ASSERT_GT(all.size(), 100u) << "read too few includes from " << SHARDTENSOR_SOURCE_DIR << "/src";
  std::set<std::pair<std::string, std::string>> debt_seen;
  for (const Include& inc : all) {
    if (!inc.quoted || inc.target.find('/') == std::string::npos) continue;
    const std::string from = layer_of(inc.file), to = layer_of(inc.target);
    if (from == to || to == "util" || to == "shardtensor") continue;
    const auto rules = allowed().find(from);
    ASSERT_NE(rules, allowed().end()) << "src/" << inc.file << ": layer '" << from << "' is not in the table of this test";
    bool ok = rules->second.count(to) > 0;
    if (from == "redistribute" && to == "comm" && !is_executor(inc.file)) ok = false;  // the planner is pure
    if (from == "rules" && to == "redistribute" && is_executor(inc.target)) ok = false;
    if (!ok && kKnownDebt.count({inc.file, inc.target})) {
      debt_seen.insert({inc.file, inc.target});
      continue;
    }
    EXPECT_TRUE(ok) << "src/" << inc.file << ":" << inc.line << " includes \"" << inc.target << "\": layer '" << from
                    << "' may not include layer '" << to << "' (docs/design.md, \"Layout of the code\")";
  }
  for (const auto& debt : kKnownDebt)
    EXPECT_TRUE(debt_seen.count(debt)) << "src/" << debt.first << " no longer includes " << debt.second
                                       << ": take it out of kKnownDebt in this test";
}

// A file's component: its header and its source together (path without the extension).
std::string component_of(const std::string& path) { return path.substr(0, path.rfind('.')); }

// Inside a layer the components include each other without a cycle (STYLE.md: a cycle means
// two components that can be understood, tested and replaced only together): the layer's
// files read in an order where each depends only on those before it. A cycle is printed as
// the chain of includes that closes it.
TEST(IncludeGraph, NoCycleInsideALayer) {
  std::map<std::string, std::map<std::string, std::string>> edges;  // component -> component -> "file:line"
  for (const Include& inc : includes_of_src()) {
    if (!inc.quoted || inc.target.find('/') == std::string::npos || layer_of(inc.file) != layer_of(inc.target)) continue;
    const std::string from = component_of(inc.file), to = component_of(inc.target);
    if (from != to) edges[from].emplace(to, inc.file + ":" + std::to_string(inc.line));
  }
  enum class Mark { Unseen, OnPath, Done };
  std::map<std::string, Mark> mark;
  std::vector<std::string> path;
  std::vector<std::string> cycles;
  std::function<void(const std::string&)> visit = [&](const std::string& c) {
    mark[c] = Mark::OnPath;
    path.push_back(c);
    for (const auto& [next, where] : edges[c]) {
      if (mark[next] == Mark::OnPath) {
        std::string chain;
        for (auto it = std::find(path.begin(), path.end(), next); it != path.end(); ++it) chain += *it + " -> ";
        cycles.push_back(chain + next + " (closed by src/" + where + ")");
      } else if (mark[next] == Mark::Unseen) {
        visit(next);
      }
    }
    path.pop_back();
    mark[c] = Mark::Done;
  };
  for (const auto& entry : edges)
    if (mark[entry.first] == Mark::Unseen) visit(entry.first);
  ASSERT_GT(edges.size(), 20u) << "read too few includes inside layers";
  for (const std::string& cycle : cycles) ADD_FAILURE() << "include cycle inside a layer: " << cycle;
}

// Kernels reach other ranks only through the moves their plans declare, which dispatch lowers
// into one KernelMoves value (domain/kernel_moves.h: halo gathers and scatter-adds, mid-op
// reductions, the statistics gather and the ring's batches) and hands to the kernel, each run
// as an exchange of parts through the one transport seam. The executor and the transports are not
// theirs to call, so a kernel cannot move bytes that explain does not print
// (tests/dist/explained_moves_test.cpp counts what they move).
TEST(IncludeGraph, KernelsMoveBytesOnlyThroughDeclaredMoves) {
  // Random draws agree on their key with the mesh: a check, not a data move.
  const std::set<std::pair<std::string, std::string>> allowed_below = {
      {"kernels/random.cpp", "comm/agreement.h"},
  };
  for (const Include& inc : includes_of_src()) {
    if (layer_of(inc.file) != "kernels" || !inc.quoted) continue;
    const bool below_the_seam = layer_of(inc.target) == "comm" || is_executor(inc.target);
    EXPECT_TRUE(!below_the_seam || allowed_below.count({inc.file, inc.target}))
        << "src/" << inc.file << ":" << inc.line << " includes \"" << inc.target
        << "\": kernels move bytes only through the moves their plan declares (domain/), not through comm/, the executor "
           "or the transports";
  }
}

TEST(IncludeGraph, C10dStaysInComm) {
  const fs::path src = fs::path(SHARDTENSOR_SOURCE_DIR) / "src";
  for (const auto& entry : fs::recursive_directory_iterator(src)) {
    if (!entry.is_regular_file()) continue;
    const std::string file = fs::relative(entry.path(), src).generic_string();
    if (layer_of(file) == "comm") continue;
    // Its c10d part is compiled only where SHARDTENSOR_COMPAT_C10D is defined, which only
    // src/comm may do (checked below for every other file).
    if (file == "util/torch_compat.h") continue;
    std::ifstream in(entry.path());
    std::string text;
    for (int line = 1; std::getline(in, text); ++line) {
      const bool c10d = text.rfind("#include", 0) == 0 && text.find("distributed/c10d") != std::string::npos;
      const bool compat = text.rfind("#define SHARDTENSOR_COMPAT_C10D", 0) == 0;
      EXPECT_FALSE(c10d || compat) << "src/" << file << ":" << line << ": c10d headers are for src/comm only (STYLE.md)";
    }
  }
}

// Rules are metadata functions (issue 14): the code that touches tensors or calls operators
// lives in kernels/, which they reach only by declaring a KernelPlan.
TEST(IncludeGraph, RulesHoldNoKernelCode) {
  for (const Include& inc : includes_of_src()) {
    if (layer_of(inc.file) != "rules") continue;
    const bool kernel_code = inc.target == "ATen/ATen.h" || inc.target.rfind("ATen/ops/", 0) == 0 ||
                             inc.target == "ATen/core/dispatch/Dispatcher.h" || inc.target.rfind("torch/", 0) == 0;
    EXPECT_FALSE(kernel_code) << "src/" << inc.file << ":" << inc.line << " includes <" << inc.target
                              << ">: rules hold metadata only; put tensor code in a KernelPlan's lower() in src/kernels/";
  }
}

TEST(IncludeGraph, NoHeaderPullsInAllOfATenOrTorch) {
  for (const Include& inc : includes_of_src()) {
    const bool header = inc.file.size() > 2 && inc.file.compare(inc.file.size() - 2, 2, ".h") == 0;
    EXPECT_FALSE(inc.target == "torch/torch.h") << "src/" << inc.file << ":" << inc.line << ": <torch/torch.h> is for examples only";
    EXPECT_FALSE(header && inc.target == "ATen/ATen.h")
        << "src/" << inc.file << ":" << inc.line << ": headers include the ATen headers they need, not <ATen/ATen.h>";
  }
}

}  // namespace
