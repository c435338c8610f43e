// Sharding rules: what they see, what they return, and where they are registered.
//
// A rule is a pure function over metadata: it sees the operator name and the specs of its
// ShardTensor inputs, never tensors, never the rank. It returns the layout each input must
// have when the op runs and the spec of every output. Because it sees the same metadata on
// every rank, every rank plans the same collectives. Only c10 and spec headers here.
#pragma once

#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "shardtensor/spec.h"

namespace shardtensor {

struct OpMeta {
  std::string name;                      // "aten::add.Tensor"
  std::vector<ShardTensorSpec> inputs;   // one per ShardTensor argument, in argument order
};

struct RuleResult {
  std::vector<ShardTensorSpec> input_targets;  // one per input
  std::vector<ShardTensorSpec> output_specs;   // one per tensor output
  std::string unsupported_reason;              // non-empty: the rule refuses this call

  static RuleResult unsupported(std::string reason);
};

using Rule = std::function<RuleResult(const OpMeta&)>;

class RuleRegistry {
 public:
  void add(const std::string& op_name, Rule rule);  // replaces an existing rule
  const Rule* find(const std::string& op_name) const;
  std::vector<std::string> op_names() const;        // sorted: the coverage index

 private:
  std::unordered_map<std::string, Rule> rules_;
};

// The process-wide registry, filled by register_all_rules() on first use.
RuleRegistry& rule_registry();

// One line per family file; the list is the coverage index.
void register_view_rules(RuleRegistry& registry);

}  // namespace shardtensor
