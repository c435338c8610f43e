// Views that reinterpret the element type: view_as_real, view_as_complex, view.dtype.
//
// view_as_real adds a trailing dim of 2 (real, imaginary) and view_as_complex removes it: the
// other dims keep their shards, and a pending sum or average stays pending (both are linear in
// the real view). view_as_complex reads the trailing pair whole, so a shard of it is gathered.
// view.dtype to a type of the same width keeps the layout; to another width it rescales the
// last dim, which is then read whole. A reinterpretation of bits is not linear: Partials are
// resolved first, except by view.dtype to the same type (a no-op).
//
// _conj and _neg_view (what conj() and autograd's complex formulas call) set a bit on the
// local piece that the wrapper would not carry, and the transport would move the stored,
// un-negated values: so here they materialize their piece (ResolvedBitsPlan) and return a
// copy, not a view. Writes into x.conj() do not reach x on ShardTensors.
#include "rules/dtype_views.h"
#include "rules/helpers.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

RuleResult run_on(const ShardTensorSpec& target) {
  RuleResult r;
  r.input_targets = {target};
  r.outputs = {layout_of(target)};
  return r;
}

RuleResult view_as_real_rule(const OpMeta& op) {
  // A complex Partial(max/min/product) is refused at planning: only sum and avg occur.
  return run_on(keep_linear_partials(op.inputs[0].spec));
}

RuleResult view_as_complex_rule(const OpMeta& op) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  TORCH_CHECK(in.ndim() >= 1 && in.shape().back() == 2, op.name, ": the last dim must have size 2 (real, imaginary); got global shape [",
              join(in.shape(), ", "), "]");
  return run_on(replicate_tensor_dims(keep_linear_partials(in), {in.ndim() - 1}));
}

RuleResult view_dtype_rule(const OpMeta& op) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  const c10::ScalarType to = op.arg("dtype").toScalarType();
  if (to == in.dtype()) return run_on(in);
  const ShardTensorSpec resolved = without_partial(in);
  if (c10::elementSize(to) == c10::elementSize(in.dtype()) || in.ndim() == 0) return run_on(resolved);
  return run_on(replicate_tensor_dims(resolved, {in.ndim() - 1}));
}

RuleResult materialized_bit_view_rule(const OpMeta& op) {
  RuleResult r = run_on(keep_linear_partials(op.inputs[0].spec));
  r.kernel_plan = declare(ResolvedBitsPlan());
  return r;
}

}  // namespace

void register_dtype_view_rules(RuleRegistry& registry) {
  registry.add("aten::view_as_real", view_as_real_rule);
  registry.add("aten::view_as_complex", view_as_complex_rule);
  registry.add("aten::view.dtype", view_dtype_rule);
  for (const char* name : {"aten::_conj", "aten::_neg_view"}) registry.add(name, materialized_bit_view_rule);
}

}  // namespace shardtensor
