// Batched matrix functions (svd, qr, inverse, determinants, cholesky, eigh, lu, ldl, tril, triu): each reads
// whole matrices, the last two dims, so a shard of those is gathered first; batch dims keep
// their shards (any sizes, empty pieces included), and every output (U, S, Vh; det, LU,
// pivots; info...) leads with the same batch dims, laid out alike. Partials are resolved:
// none of these is linear.
#include <ATen/core/function_schema.h>

#include "rules/helpers.h"

namespace shardtensor {
namespace {

RuleResult batched_matrix_rule(const OpMeta& op) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  if (in.ndim() < 2)
    return RuleResult::unsupported(op.name + " expects a batch of matrices (at least 2 dims), got a " +
                                   std::to_string(in.ndim()) + "-d tensor");
  const ShardTensorSpec target = replicate_tensor_dims(without_partial(in), {in.ndim() - 2, in.ndim() - 1});
  RuleResult r;
  r.input_targets = {target};
  r.outputs.assign(op.schema->returns().size(), layout_of(target));
  // Factors the call does not ask for come back as empty 1-d tensors, not batch-led: U and Vh
  // of svd without them (svdvals), the eigenvectors of eigvalsh, Q of qr(mode="r"), P of
  // lu(pivot=False).
  const OutputLayout empty = replicated_layout(op.mesh());
  if (op.name == "aten::_linalg_svd" && !bool_arg(op, "compute_uv")) r.outputs[0] = r.outputs[2] = empty;
  if (op.name == "aten::_linalg_eigh" && !bool_arg(op, "compute_v")) r.outputs[1] = empty;
  if (op.name == "aten::linalg_qr" && op.arg("mode").toStringRef() == "r") r.outputs[0] = empty;
  if (op.name == "aten::linalg_lu" && !bool_arg(op, "pivot")) r.outputs[0] = empty;
  return r;
}

// _linalg_check_errors(info, api_name, is_matrix): raises where a matrix of the batch failed
// (singular, not positive-definite). The info is gathered (one int per matrix), so every
// rank raises the same error, not only the rank holding the bad matrix.
RuleResult check_errors_rule(const OpMeta& op) {
  RuleResult r;
  r.input_targets = {replicated(op.inputs[0].spec)};
  return r;
}

}  // namespace

void register_linalg_rules(RuleRegistry& registry) {
  for (const char* name : {"aten::_linalg_svd", "aten::linalg_qr", "aten::linalg_inv_ex", "aten::_linalg_det",
                           "aten::_linalg_slogdet", "aten::linalg_cholesky_ex", "aten::_linalg_eigh",
                           "aten::linalg_lu_factor_ex", "aten::linalg_eig", "aten::linalg_lu", "aten::_linalg_eigvals",
                           "aten::linalg_eigvals", "aten::linalg_matrix_exp", "aten::logdet", "aten::det", "aten::slogdet",
                           "aten::cholesky_inverse", "aten::geqrf", "aten::linalg_ldl_factor_ex",
                           // Triangles of each matrix: the matrix dims whole, the batch dims split.
                           "aten::tril", "aten::tril_", "aten::triu", "aten::triu_"})
    registry.add(name, batched_matrix_rule);
  registry.add("aten::_linalg_check_errors", check_errors_rule);
}

}  // namespace shardtensor
