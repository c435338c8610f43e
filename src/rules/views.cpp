// Views and shape ops: view/reshape, permute/transpose/t, squeeze/unsqueeze, expand,
// select/slice, split/unbind, cat/stack, index_select, and their backward kernels.
//
// A view keeps a sharded dim sharded when the shard boundaries survive it: merging a sharded
// dim with the whole dims after it ([B, S] with B sharded -> [B*S]), or splitting it into
// pieces that each shard divides. Otherwise the dim is gathered first. Operators whose size
// arguments are global (view, expand, select_backward...) run locally with those sizes
// rewritten to the local piece's (see with_local_sizes). index_select along a split dim with a
// whole index answers locally into a Partial(sum) instead (index_select_rule).
#include <ATen/core/function_schema.h>

#include <algorithm>
#include <numeric>

#include "rules/contribution.h"
#include "rules/embedding.h"
#include "rules/helpers.h"
#include "rules/views.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

// The operator with its int[] argument `size_arg` rewritten from the local shape of tensor
// argument `in_arg` (views.h).
std::shared_ptr<const KernelPlan> with_local_sizes(size_t size_arg, size_t in_arg, std::vector<SizeFromInput> rewrites) {
  return declare(LocalSizesPlan(size_arg, in_arg, std::move(rewrites)));
}

RuleResult keep_layout(const ShardTensorSpec& in, OutputLayout out) {
  RuleResult r;
  r.input_targets = {in};
  r.outputs = {std::move(out)};
  return r;
}

RuleResult same_layout_view(const OpMeta& op) {
  return keep_layout(op.inputs[0].spec, layout_of(op.inputs[0].spec));
}

std::vector<int64_t> infer_view_shape(std::vector<int64_t> size, const std::vector<int64_t>& in_shape, const OpMeta& op) {
  const int64_t numel = std::accumulate(in_shape.begin(), in_shape.end(), int64_t{1}, std::multiplies<int64_t>());
  int64_t known = 1, infer = -1;
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] == -1) {
      TORCH_CHECK(infer < 0, op.name, ": only one dimension can be inferred in shape [", join(size, ", "), "]");
      infer = static_cast<int64_t>(d);
    } else {
      TORCH_CHECK(size[d] >= 0, op.name, ": invalid shape dimension ", size[d], " in shape [", join(size, ", "), "]");
      known *= size[d];
    }
  }
  // As torch's infer_size: with a 0 among the given sizes, -1 could be any size.
  TORCH_CHECK(infer < 0 || known != 0, op.name, ": cannot reshape tensor of ", numel, " elements into shape [", join(size, ", "),
              "] because the unspecified dimension size -1 can be any value and is ambiguous");
  if (infer >= 0) size[infer] = numel / known;
  TORCH_CHECK(std::accumulate(size.begin(), size.end(), int64_t{1}, std::multiplies<int64_t>()) == numel, op.name,
              ": shape [", join(size, ", "), "] is invalid for a tensor of ", numel, " elements (global shape [",
              join(in_shape, ", "), "]).");
  return size;
}

// view / _unsafe_view / _reshape_alias: dims grouped into runs whose products match.
RuleResult view_rule(const OpMeta& op) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  const std::vector<int64_t>& ishape = in.shape();
  const std::vector<int64_t> oshape = infer_view_shape(int_list_arg(op, "size"), ishape, op);
  const int64_t ind = in.ndim(), ond = static_cast<int64_t>(oshape.size());

  struct Group {
    int64_t i0, i1, o0, o1;
  };
  std::vector<Group> groups;
  for (int64_t i = 0, o = 0; i < ind || o < ond;) {
    Group g{i, i, o, o};
    int64_t pi = 1, po = 1;
    if (i < ind) pi *= ishape[i++];
    if (o < ond) po *= oshape[o++];
    while (pi != po && (i < ind || o < ond)) {
      if ((pi < po && i < ind) || o >= ond) pi *= ishape[i++];
      else po *= oshape[o++];
    }
    g.i1 = i, g.o1 = o;
    groups.push_back(g);
  }

  Placements ps = in.placements();
  Placements out_ps = ps;
  std::vector<SizeFromInput> rewrites;
  OutputLayout out;
  const int64_t numel = std::accumulate(ishape.begin(), ishape.end(), int64_t{1}, std::multiplies<int64_t>());
  for (const DimSharding& s : in.shardings()) {
    const int64_t d = s.tensor_dim;
    const Group* g = nullptr;
    for (const Group& candidate : groups)
      if (d >= candidate.i0 && d < candidate.i1) g = &candidate;
    bool ok = g && numel > 0;
    for (int64_t k = ok ? g->i0 : 0; ok && k < d; ++k) ok = ishape[k] == 1;
    int64_t od = ok ? g->o0 : -1;
    while (ok && od < g->o1 - 1 && oshape[od] == 1) ++od;
    ok = ok && od < g->o1;
    int64_t in_after = 1, out_after = 1;
    for (int64_t k = d + 1; ok && k < g->i1; ++k) in_after *= ishape[k];
    for (int64_t k = od + 1; ok && k < g->o1; ++k) out_after *= oshape[k];
    // A zigzag dim stays zigzag where its chunks stay whole rows of the output dim: merged with
    // the dims after it ([S, B] -> [S*B]) its unit grows by B, split back it shrinks again.
    int64_t unit = 1;
    if (ok && s.zigzag) {
      ok = (s.zigzag_unit * in_after) % out_after == 0;
      unit = ok ? s.zigzag_unit * in_after / out_after : 1;
    }
    std::vector<int64_t> sizes;
    for (int64_t piece : s.sizes) {
      ok = ok && (piece * in_after) % out_after == 0;
      sizes.push_back(ok ? piece * in_after / out_after : 0);
    }
    for (int64_t m : s.mesh_dims) {
      if (ok) {
        out_ps[m] = moved_to_dim(ps[m], od);
        if (s.zigzag) out_ps[m].zigzag_unit = unit;
      } else {
        ps[m] = out_ps[m] = Replicate();
      }
    }
    if (ok) {
      out.sizes.push_back({od, sizes});
      rewrites.push_back({od, d, in_after, out_after});
    }
  }
  out.placements = out_ps;
  // Partial placements stay: a view of a pending sum is a pending sum of views.
  RuleResult r = keep_layout(with_placements(in, ps), out);
  // Locally a reshape, not a view (views.h says why).
  LocalReshapePlan plan;
  plan.shape = oshape;
  plan.rewrites = std::move(rewrites);
  plan.num_args = static_cast<int64_t>(op.schema->arguments().size());
  r.kernel_plan = declare(std::move(plan));
  return r;
}

// A layout moved through a dim permutation: out dim k is input dim perm[k].
RuleResult permute_with(const OpMeta& op, const std::vector<int64_t>& perm) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  std::vector<int64_t> dim_map(perm.size());
  for (size_t k = 0; k < perm.size(); ++k) dim_map[perm[k]] = static_cast<int64_t>(k);
  return keep_layout(in, remap_dims(in, dim_map));
}

RuleResult permute_rule(const OpMeta& op) {
  std::vector<int64_t> perm = int_list_arg(op, "dims");
  for (int64_t& d : perm) d = wrap_dim(d, op.inputs[0].spec.ndim(), op);
  return permute_with(op, perm);
}

RuleResult transpose_rule(const OpMeta& op) {
  const int64_t ndim = op.inputs[0].spec.ndim();
  std::vector<int64_t> perm(ndim);
  std::iota(perm.begin(), perm.end(), 0);
  const int64_t a = op.name == "aten::t" ? 0 : wrap_dim(int_arg(op, "dim0"), ndim, op);
  const int64_t b = op.name == "aten::t" ? std::min<int64_t>(1, ndim - 1) : wrap_dim(int_arg(op, "dim1"), ndim, op);
  if (ndim > 0) std::swap(perm[a], perm[b]);
  return permute_with(op, perm);
}

RuleResult unsqueeze_rule(const OpMeta& op) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  const int64_t at = wrap_dim(int_arg(op, "dim"), in.ndim() + 1, op);
  std::vector<int64_t> dim_map(in.ndim());
  for (int64_t d = 0; d < in.ndim(); ++d) dim_map[d] = d < at ? d : d + 1;
  return keep_layout(in, remap_dims(in, dim_map));
}

RuleResult squeeze_rule(const OpMeta& op) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  std::vector<int64_t> dropped;
  if (op.name == "aten::squeeze.dim") {
    const int64_t d = wrap_dim(int_arg(op, "dim"), in.ndim(), op);
    if (in.ndim() > 0 && in.shape()[d] == 1) dropped.push_back(d);
  } else if (op.name == "aten::squeeze.dims") {
    // A 0-d tensor takes dim 0 or -1 and stays as it is, as in torch.
    for (int64_t d : int_list_arg(op, "dim")) {
      d = wrap_dim(d, std::max<int64_t>(in.ndim(), 1), op);
      if (in.ndim() > 0 && in.shape()[d] == 1 && !std::count(dropped.begin(), dropped.end(), d)) dropped.push_back(d);
    }
    std::sort(dropped.begin(), dropped.end());
  } else {
    for (int64_t d = 0; d < in.ndim(); ++d)
      if (in.shape()[d] == 1) dropped.push_back(d);
  }
  // A sharded size-1 dim is whole on one rank and empty elsewhere: gather it before dropping it.
  const ShardTensorSpec target = replicate_tensor_dims(in, dropped);
  std::vector<int64_t> dim_map(in.ndim());
  int64_t next = 0;
  for (int64_t d = 0; d < in.ndim(); ++d)
    dim_map[d] = std::count(dropped.begin(), dropped.end(), d) ? -1 : next++;
  RuleResult r = keep_layout(target, remap_dims(target, dim_map));
  // Locally, squeeze exactly the globally dropped dims (views.h).
  SqueezePlan plan;
  plan.dropped = dropped;
  plan.num_args = static_cast<int64_t>(op.schema->arguments().size());
  r.kernel_plan = declare(std::move(plan));
  return r;
}

// An output that keeps `in`'s dims except `removed` (in order) and appends `appended` whole
// dims: diagonal (the diagonal last), unfold (the window last, the unfolded dim in place).
RuleResult view_reading_dims_whole(const OpMeta& op, const std::vector<int64_t>& read_whole,
                                   const std::vector<int64_t>& removed) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  // A slice of a pending sum is the pending sum of slices: Partials stay.
  const ShardTensorSpec target = keep_shared_partials(replicate_tensor_dims(in, read_whole), {in});
  std::vector<int64_t> dim_map(in.ndim());
  int64_t next = 0;
  for (int64_t d = 0; d < in.ndim(); ++d) dim_map[d] = std::count(removed.begin(), removed.end(), d) ? -1 : next++;
  return keep_layout(target, remap_dims(target, dim_map));
}

// diagonal(self, offset, dim1, dim2): the two dims are read whole (a diagonal crosses every
// shard of both); the other dims keep their pieces, so the result is a view of the local piece
// wherever dim1 and dim2 are whole already.
RuleResult diagonal_rule(const OpMeta& op) {
  const int64_t ndim = op.inputs[0].spec.ndim();
  const int64_t a = wrap_dim(int_arg(op, "dim1"), ndim, op), b = wrap_dim(int_arg(op, "dim2"), ndim, op);
  TORCH_CHECK(a != b, op.name, ": diagonal dimensions cannot be identical ", a, ", ", b);
  return view_reading_dims_whole(op, {a, b}, {a, b});
}

// unfold(self, dimension, size, step): windows cross shard boundaries, so the unfolded dim is
// read whole; the other dims keep their pieces, and the window dim comes last, whole.
RuleResult unfold_rule(const OpMeta& op) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  const int64_t dim = wrap_dim(int_arg(op, "dimension"), std::max<int64_t>(in.ndim(), 1), op);
  return view_reading_dims_whole(op, in.ndim() ? std::vector<int64_t>{dim} : std::vector<int64_t>{}, {});
}

// diagonal_backward(grad_output, input_sizes, offset, dim1, dim2) and unfold_backward(grad_in,
// input_sizes, dim, size, step): the gradient of an input whose `whole_dims` the forward read
// whole. The gradient's last dim (the diagonal, the window) is read whole, and so is unfold's
// unfolded dim; every other dim keeps its pieces, with input_sizes rewritten to the local ones.
// `input_dim_of[j]`: the input dim that the gradient's dim j came from.
RuleResult view_backward_rule(const OpMeta& op, const std::vector<int64_t>& input_dim_of, const std::vector<int64_t>& grad_whole) {
  const ShardTensorSpec& grad = op.inputs[0].spec;
  const ShardTensorSpec target = keep_shared_partials(replicate_tensor_dims(grad, grad_whole), {grad});
  std::vector<SizeFromInput> rewrites;
  for (int64_t j = 0; j < grad.ndim(); ++j)
    if (input_dim_of[j] >= 0 && target.sharding_of(j)) rewrites.push_back({input_dim_of[j], j});
  RuleResult r = keep_layout(target, remap_dims(target, input_dim_of));
  if (!rewrites.empty()) r.kernel_plan = with_local_sizes(op.arg_index("input_sizes"), 0, rewrites);
  return r;
}

RuleResult diagonal_backward_rule(const OpMeta& op) {
  const int64_t ndim = static_cast<int64_t>(int_list_arg(op, "input_sizes").size());
  const int64_t a = wrap_dim(int_arg(op, "dim1"), ndim, op), b = wrap_dim(int_arg(op, "dim2"), ndim, op);
  std::vector<int64_t> input_dim_of;
  for (int64_t d = 0; d < ndim; ++d)
    if (d != a && d != b) input_dim_of.push_back(d);
  input_dim_of.push_back(-1);  // the diagonal, spread over dim1 and dim2
  return view_backward_rule(op, input_dim_of, {ndim - 2});
}

RuleResult unfold_backward_rule(const OpMeta& op) {
  const int64_t ndim = static_cast<int64_t>(int_list_arg(op, "input_sizes").size());
  const int64_t dim = wrap_dim(int_arg(op, "dim"), std::max<int64_t>(ndim, 1), op);
  std::vector<int64_t> input_dim_of(ndim);
  std::iota(input_dim_of.begin(), input_dim_of.end(), 0);
  input_dim_of.push_back(-1);  // the window, folded back into dim
  return view_backward_rule(op, input_dim_of, {dim, ndim});
}

// as_strided(self, size, stride, storage_offset): sizes and strides address the whole tensor's
// memory, so it runs on the whole tensor: a view of the local piece where self is Replicate
// (aliasing kept), else of a gathered copy. The result is Replicate.
RuleResult as_strided_rule(const OpMeta& op) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  return keep_layout(replicated(in), replicated_layout(in.mesh()));
}

// `in` with `dims` gathered but Partial kept: expanding or repeating a pending sum expands
// or repeats every term.
ShardTensorSpec gather_dims_keep_partial(const ShardTensorSpec& in, const std::vector<int64_t>& dims) {
  Placements ps = replicate_tensor_dims(in, dims).placements();
  for (size_t m = 0; m < ps.size(); ++m)
    if (in.placements()[m].is_partial()) ps[m] = in.placements()[m];
  return with_placements(in, ps);
}

// repeat(self, repeats): a sharded dim repeated more than once is gathered first; the others
// keep their pieces (repeats of 1 leave a local piece as it is).
RuleResult repeat_rule(const OpMeta& op) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  const std::vector<int64_t> repeats = int_list_arg(op, "repeats");
  const int64_t offset = static_cast<int64_t>(repeats.size()) - in.ndim();
  std::vector<int64_t> repeated, dim_map(in.ndim());
  for (int64_t d = 0; d < in.ndim(); ++d) {
    if (repeats[d + offset] != 1) repeated.push_back(d);
    dim_map[d] = d + offset;
  }
  const ShardTensorSpec target = gather_dims_keep_partial(in, repeated);
  return keep_layout(target, remap_dims(target, dim_map));
}

RuleResult expand_rule(const OpMeta& op) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  const std::vector<int64_t> size = int_list_arg(op, "size");
  const int64_t offset = static_cast<int64_t>(size.size()) - in.ndim();
  std::vector<int64_t> expanded;
  for (int64_t d = 0; d < in.ndim(); ++d)
    if (size[d + offset] != -1 && size[d + offset] != in.shape()[d]) expanded.push_back(d);
  const ShardTensorSpec target = gather_dims_keep_partial(in, expanded);
  std::vector<int64_t> dim_map(in.ndim());
  std::vector<SizeFromInput> rewrites;
  for (int64_t d = 0; d < in.ndim(); ++d) {
    dim_map[d] = d + offset;
    if (target.sharding_of(d)) rewrites.push_back({d + offset, d});
  }
  RuleResult r = keep_layout(target, remap_dims(target, dim_map));
  if (!rewrites.empty()) r.kernel_plan = with_local_sizes(op.arg_index("size"), op.arg_index("self"), rewrites);
  return r;
}

// An op that reads its `dim` whole: gather it, keep the rest. Selecting keeps a Partial (a
// slice of a pending sum is the pending sum of slices), so select and slice of a Partial stay
// views of their base.
RuleResult along_whole_dim(const OpMeta& op, bool removes_dim) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  const int64_t dim = wrap_dim(int_arg(op, "dim"), in.ndim(), op);
  const ShardTensorSpec target = keep_shared_partials(replicate_tensor_dims(in, {dim}), {in});
  std::vector<int64_t> dim_map(in.ndim());
  for (int64_t d = 0; d < in.ndim(); ++d) dim_map[d] = !removes_dim ? d : d < dim ? d : d == dim ? -1 : d - 1;
  RuleResult r = keep_layout(target, remap_dims(target, dim_map));
  for (size_t k = 1; k < op.inputs.size(); ++k) r.input_targets.push_back(replicated(op.inputs[k].spec));  // indices
  return r;
}

Rule whole_dim(bool removes_dim) {
  return [=](const OpMeta& op) { return along_whole_dim(op, removes_dim); };
}

// index_select(self, dim, index): along a whole dim, except where self splits `dim` (whole on
// every other mesh dim) and the index is whole there: then self stays split and each rank
// answers the entries in its own range, a Partial(sum) over the splitting mesh dims with no
// communication (see Note [Lookups along a split dim] in rules/embedding.h). The backward
// (index_select_backward) sees only self's sizes: it builds the whole gradient, which the
// leaf's layout cuts into self's pieces locally.
RuleResult index_select_rule(const OpMeta& op) {
  const ShardTensorSpec& self = op.inputs[0].spec;
  const int64_t dim = wrap_dim(int_arg(op, "dim"), self.ndim(), op);
  const std::vector<int64_t> split = lookup_split_mesh_dims(self, dim, op.inputs[1].spec);
  if (split.empty()) return along_whole_dim(op, /*removes_dim=*/false);
  RuleResult r;
  r.input_targets = {self, replicated(op.inputs[1].spec)};
  r.outputs = {replicated_layout(self.mesh())};  // self is Replicate off `split`
  for (int64_t m : split) r.outputs[0].placements[m] = Partial(ReduceOp::Sum);
  r.kernel_plan = declare(MaskedLookupPlan(self, dim, op.arg_index("self"), op.arg_index("index"), LookupMask::kAlongDim, "index_select"));
  return r;
}

// split / split_with_sizes / unbind: every piece keeps the layout of the other dims.
RuleResult split_rule(const OpMeta& op) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  const bool unbind = op.name == "aten::unbind.int";
  const int64_t dim = wrap_dim(int_arg(op, "dim"), in.ndim(), op);
  RuleResult r = along_whole_dim(op, unbind);
  int64_t pieces = in.shape()[dim];
  if (op.name == "aten::split.Tensor") {
    const int64_t split = int_arg(op, "split_size");
    pieces = split == 0 ? 1 : std::max<int64_t>(1, (in.shape()[dim] + split - 1) / split);
  } else if (op.name == "aten::split_with_sizes" || op.name == "aten::split_with_sizes_copy") {
    pieces = static_cast<int64_t>(int_list_arg(op, "split_sizes").size());
  }
  r.outputs.resize(std::max<int64_t>(pieces, 1), r.outputs[0]);
  return r;
}

std::vector<ShardTensorSpec> input_specs(const OpMeta& op) {
  std::vector<ShardTensorSpec> specs;
  for (const TensorInput& in : op.inputs) specs.push_back(in.spec);
  return specs;
}

// `resolved` (the lead of cat or stack) with a Partial restored on every mesh dim where it is
// Replicate and the operands of its rank hold one Partial or Replicate, at least one the Partial.
// Joining moves values without combining them, and a Replicate operand is already a pending
// avg, max or min of itself (every term holds it) or, counted once, a pending sum (see
// rules/contribution.h). Not a pending product (every term would multiply it in) nor a pending
// norm (a replicated value may be negative; a norm's terms are not).
ShardTensorSpec join_partials(const ShardTensorSpec& resolved, const std::vector<ShardTensorSpec>& operands) {
  Placements ps = resolved.placements();
  for (size_t m = 0; m < ps.size(); ++m) {
    if (!ps[m].is_replicate()) continue;
    std::optional<Placement> shared;
    bool alike = true, some_replicate = false;
    for (const ShardTensorSpec& o : operands) {
      if (o.ndim() != resolved.ndim()) continue;  // cat skips its legacy empty [0] inputs
      const Placement& p = o.placements()[m];
      some_replicate = some_replicate || p.is_replicate();
      if (p.is_replicate()) continue;
      alike = alike && p.is_partial() && (!shared || *shared == p);
      shared = p;
    }
    const bool joins_replicate = shared && (shared->reduce_op == ReduceOp::Product || shared->reduce_op == ReduceOp::Norm);
    if (alike && shared && !(some_replicate && joins_replicate)) ps[m] = *shared;
  }
  return with_placements(resolved, ps);
}

// An operand's target in `lead`'s layout: Replicate where it is Replicate and the lead keeps a
// Partial (it joins as it is: no move can make a Partial), the lead's placements and shard sizes
// elsewhere.
ShardTensorSpec joining_target(const ShardTensorSpec& in, const ShardTensorSpec& lead) {
  Placements ps = lead.placements();
  for (size_t m = 0; m < ps.size(); ++m)
    if (ps[m].is_partial() && in.placements()[m].is_replicate()) ps[m] = Replicate();
  ShardTensorSpec t = with_placements(in, ps);
  for (const DimSharding& s : lead.shardings()) t = with_dim_sizes(t, s.tensor_dim, s.sizes);
  return t;
}

// The operands (elements of the Tensor[] argument) that join a Partial(sum) of `lead` as
// Replicate: each counted once, on coordinate 0 of those mesh dims. Inputs are the list's
// elements in order (cat and stack take no other tensor).
std::shared_ptr<const KernelPlan> contributed_operands(const OpMeta& op, const ShardTensorSpec& lead) {
  std::vector<ContributedValue> contributed;
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    const ShardTensorSpec& in = op.inputs[i].spec;
    if (in.ndim() != lead.ndim()) continue;
    std::vector<int64_t> summed;
    for (size_t m = 0; m < lead.placements().size(); ++m)
      if (lead.placements()[m] == Partial(ReduceOp::Sum) && in.placements()[m].is_replicate())
        summed.push_back(static_cast<int64_t>(m));
    if (!summed.empty()) contributed.push_back({op.inputs[i].arg_index, summed, static_cast<int64_t>(i)});
  }
  if (contributed.empty()) return nullptr;
  return declare(ContributedOncePlan(op.mesh(), std::move(contributed)));
}

// cat along a dim: inputs share the first input's layout elsewhere; the dim itself is gathered.
// Operands that hold one Partial, or Replicate, keep it (see join_partials); so do stack's.
RuleResult cat_rule(const OpMeta& op) {
  const ShardTensorSpec& first = op.inputs[0].spec;
  int64_t dim = int_arg(op, "dim");
  const int64_t ndim = first.ndim();
  dim = wrap_dim(dim, ndim, op);
  RuleResult r;
  const ShardTensorSpec lead = join_partials(without_partial(replicate_tensor_dims(first, {dim})), input_specs(op));
  for (const TensorInput& in : op.inputs) {
    if (in.spec.ndim() != ndim) {  // legacy empty [0] inputs are skipped by cat
      r.input_targets.push_back(replicated(in.spec));
      continue;
    }
    r.input_targets.push_back(joining_target(in.spec, lead));
  }
  r.outputs.push_back(layout_of(lead));
  r.kernel_plan = contributed_operands(op, lead);
  return r;
}

// stack along a new dim: every input follows the first one's layout, dims from `dim` on shift.
RuleResult stack_rule(const OpMeta& op) {
  const ShardTensorSpec lead = join_partials(without_partial(op.inputs[0].spec), input_specs(op));
  const int64_t dim = wrap_dim(int_arg(op, "dim"), lead.ndim() + 1, op);
  RuleResult r;
  for (const TensorInput& in : op.inputs) r.input_targets.push_back(joining_target(in.spec, lead));
  std::vector<int64_t> dim_map(lead.ndim());
  for (int64_t d = 0; d < lead.ndim(); ++d) dim_map[d] = d < dim ? d : d + 1;
  r.outputs.push_back(remap_dims(lead, dim_map));
  r.kernel_plan = contributed_operands(op, lead);
  return r;
}

// Backward kernels that build a zero tensor of the input's (global) size and place the
// gradient in it: select_backward, slice_backward, index_select_backward and
// value_selecting_reduction_backward (max.dim/min.dim). The gradient keeps its layout except
// along `dim`, which is gathered where the op indexes it; the size argument (`sizes_name`: the
// four ops name it differently) is rewritten to this rank's piece. `inserts_dim`: the gradient
// lacks `dim` (select, reductions without keepdim).
RuleResult scatter_back(const OpMeta& op, const char* sizes_name, bool inserts_dim, bool gather_dim) {
  const ShardTensorSpec& grad = op.inputs[0].spec;
  const std::vector<int64_t> sizes = int_list_arg(op, sizes_name);
  const int64_t dim = wrap_dim(int_arg(op, "dim"), static_cast<int64_t>(sizes.size()), op);
  std::vector<int64_t> whole;
  if (gather_dim) whole.push_back(dim);
  const ShardTensorSpec target = replicate_tensor_dims(grad, whole);
  const ShardTensorSpec resolved = without_partial(target);
  std::vector<int64_t> dim_map(grad.ndim());
  std::vector<SizeFromInput> rewrites;
  for (int64_t d = 0; d < grad.ndim(); ++d) {
    dim_map[d] = inserts_dim && d >= dim ? d + 1 : d;
    if (resolved.sharding_of(d)) rewrites.push_back({dim_map[d], d});
  }
  RuleResult r = keep_layout(resolved, remap_dims(resolved, dim_map));
  for (size_t k = 1; k < op.inputs.size(); ++k)  // indices: aligned with the gradient, or whole for index_select
    r.input_targets.push_back(op.inputs[k].spec.ndim() == grad.ndim() && op.name != "aten::index_select_backward"
                                  ? align_to(op.inputs[k].spec, resolved)
                                  : replicated(op.inputs[k].spec));
  // The gradient is the first argument, named grad_output or grad.
  if (!rewrites.empty()) r.kernel_plan = with_local_sizes(op.arg_index(sizes_name), op.inputs[0].arg_index, rewrites);
  return r;
}

}  // namespace

void register_view_rules(RuleRegistry& registry) {
  for (const char* name : {"aten::detach", "aten::alias"}) registry.add(name, same_layout_view);
  for (const char* name : {"aten::view", "aten::_unsafe_view", "aten::_reshape_alias"}) registry.add(name, view_rule);
  registry.add("aten::permute", permute_rule);
  for (const char* name : {"aten::transpose.int", "aten::t"}) registry.add(name, transpose_rule);
  registry.add("aten::unsqueeze", unsqueeze_rule);
  for (const char* name : {"aten::squeeze", "aten::squeeze.dim", "aten::squeeze.dims"}) registry.add(name, squeeze_rule);
  registry.add("aten::diagonal", diagonal_rule);
  registry.add("aten::unfold", unfold_rule);
  registry.add("aten::diagonal_backward", diagonal_backward_rule);
  registry.add("aten::unfold_backward", unfold_backward_rule);
  registry.add("aten::as_strided", as_strided_rule);
  // These keep every position of a dim they keep (their placements are copied or remapped).
  for (const char* name : {"aten::detach", "aten::alias", "aten::view", "aten::_unsafe_view", "aten::_reshape_alias", "aten::permute",
                           "aten::transpose.int", "aten::t", "aten::unsqueeze", "aten::squeeze", "aten::squeeze.dim"})
    registry.carry_order(name);
  registry.add("aten::expand", expand_rule);
  registry.carry_order("aten::expand");  // an expanded dim is gathered (in order), the others remapped
  registry.add("aten::repeat", repeat_rule);
  registry.add("aten::select.int", whole_dim(/*removes_dim=*/true));
  registry.add("aten::slice.Tensor", whole_dim(/*removes_dim=*/false));
  registry.add("aten::index_select", index_select_rule);
  for (const char* name : {"aten::split.Tensor", "aten::split_with_sizes", "aten::unbind.int"}) registry.add(name, split_rule);
  registry.add("aten::cat", cat_rule);
  // The copying forms of views (what functionalization emits) lay out their result as the
  // view would, in fresh memory.
  registry.add("aten::view_copy", view_rule);
  registry.add("aten::expand_copy", expand_rule);
  registry.add("aten::diagonal_copy", diagonal_rule);
  registry.add("aten::split_with_sizes_copy", split_rule);
  registry.add("aten::stack", stack_rule);
  registry.add("aten::select_backward",
               [](const OpMeta& op) { return scatter_back(op, "input_sizes", /*inserts_dim=*/true, false); });
  registry.add("aten::slice_backward",
               [](const OpMeta& op) { return scatter_back(op, "input_sizes", false, /*gather_dim=*/true); });
  registry.add("aten::index_select_backward",
               [](const OpMeta& op) { return scatter_back(op, "self_sizes", false, /*gather_dim=*/true); });
  registry.add("aten::value_selecting_reduction_backward", [](const OpMeta& op) {
    return scatter_back(op, "sizes", /*inserts_dim=*/!bool_arg(op, "keepdim"), /*gather_dim=*/true);
  });
  // The dim these read or join is gathered (in order); the others keep their placements.
  for (const char* name : {"aten::select.int", "aten::slice.Tensor", "aten::split.Tensor", "aten::split_with_sizes", "aten::unbind.int",
                           "aten::cat", "aten::stack", "aten::select_backward", "aten::slice_backward", "aten::index_select_backward",
                           "aten::value_selecting_reduction_backward"})
    registry.carry_order(name);
}

}  // namespace shardtensor
