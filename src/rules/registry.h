// The rule registry and the explicit list of rule families. The types a rule sees and returns
// are public: include/shardtensor/sharding_rule.h.
#pragma once

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "shardtensor/sharding_rule.h"

namespace shardtensor {

class RuleRegistry {
 public:
  void add(const std::string& op_name, Rule rule);  // replaces an existing rule
  const Rule* find(const std::string& op_name) const;
  std::vector<std::string> op_names() const;        // sorted: the coverage index
  uint64_t generation() const { return generation_; }  // bumps on every add (cache invalidation)

  // Marks the rule of `op_name` as one that carries the zigzag order (shardtensor/placement.h):
  // it is handed ZigzagShard inputs, and an output position it takes from such an input keeps
  // that order (it copies the placement, as pointwise, matmul and dim-keeping views do, or reads
  // it, as attention does). Every other rule is handed its inputs in order
  // (dispatch/propagation.cpp). add() drops the mark: a replacement rule must be marked anew.
  void carry_order(const std::string& op_name);
  bool carries_order(const std::string& op_name) const { return carrying_.count(op_name) != 0; }

 private:
  std::unordered_map<std::string, Rule> rules_;
  std::unordered_set<std::string> carrying_;
  uint64_t generation_ = 0;
};

// The process-wide registry, filled by register_all_rules() on first use.
RuleRegistry& rule_registry();

// One line per family file; the list is the coverage index.
void register_view_rules(RuleRegistry& registry);
void register_pointwise_rules(RuleRegistry& registry);
void register_reduction_rules(RuleRegistry& registry);
void register_matmul_rules(RuleRegistry& registry);
void register_normalization_rules(RuleRegistry& registry);
void register_loss_rules(RuleRegistry& registry);
void register_embedding_rules(RuleRegistry& registry);
void register_convolution_rules(RuleRegistry& registry);
void register_pooling_rules(RuleRegistry& registry);
void register_resampling_rules(RuleRegistry& registry);
void register_spatial_norm_rules(RuleRegistry& registry);
void register_random_rules(RuleRegistry& registry);
void register_indexing_rules(RuleRegistry& registry);
void register_attention_rules(RuleRegistry& registry);
void register_scan_rules(RuleRegistry& registry);
void register_dtype_view_rules(RuleRegistry& registry);
void register_comparison_rules(RuleRegistry& registry);
void register_linalg_rules(RuleRegistry& registry);

// The elementwise operators the pointwise rule serves by name alone (special functions, bitwise
// and shift operators, scalar-first and in-place overloads): the operator sweep builds a case
// for each from its schema.
std::vector<std::string> more_elementwise_op_names();

}  // namespace shardtensor
