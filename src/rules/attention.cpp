// Scaled dot-product attention: the operators that F.scaled_dot_product_attention reaches in
// torch 2.x, with their backwards (AttentionOperator in attention.h): on CPU
// _scaled_dot_product_flash_attention_for_cpu, on CUDA _scaled_dot_product_flash_attention,
// _scaled_dot_product_efficient_attention and _scaled_dot_product_cudnn_attention (the composite
// picked cuDNN for float32 on an H100). Query [B, H, Sq, D], key/value [B, Hk, Sk, D], Hk
// dividing H for grouped-query attention, an optional additive mask broadcastable to
// [B, H, Sq, Sk]: attn_mask, or attn_bias for efficient and cuDNN. Inputs that take the math path
// instead decompose into matmul, softmax and pointwise ops, which have rules of their own; what
// these rules refuse (dropout, a debug mask, a gradient for the bias) falls back to gathering.
// On libtorch 1.13 these operators do not exist and the rules are never reached.
//
// The query leads; each mesh dim is handled by what it shards of the query:
//   - batch (dim 0) or heads (dim 1): local attention, no communication. Keys, values and the
//     mask follow the query's shard sizes (heads divided by the group size H / Hk; a head split
//     that cuts a group gathers the heads instead);
//   - sequence (dim 2), keys and values split on the sequence by the same mesh dim: ring
//     attention (kernels/attention.cpp). Keys and values keep their own shard sizes, which
//     may differ from the query's; gradients of K and V come back sharded like them. A mask
//     is split by rows like the query and kept whole along the keys: each block reads its
//     keys' columns (the mask never travels the ring);
//   - sequence, otherwise: local attention on this rank's rows against the whole keys and
//     values (gathered), whose gradients are then Partial(sum). The mask is split by rows;
//   - the query whole (replicated or Partial) against keys and values split on the sequence:
//     every rank attends with all rows to its own keys, and the blocks merge by log-sum-exp
//     after one all-gather of the per-row statistics (Note [Merging split keys] in
//     kernels/attention_blocks.cpp). The output is Partial(sum), the log-sum-exp whole; backward,
//     the query's gradient is Partial(sum) and K and V keep their shards. No K/V byte moves;
//   - anything else (the head dim D split, a second mesh dim splitting the sequence): the
//     inputs are gathered on that mesh dim.
// Under is_causal the kernel places every block by the global offsets of its shards (uneven
// sizes and empty shards included); see VisibleBlock in attention.h. Where the query's sequence
// is ZigzagShard (shardtensor/context_parallel.h), so are the keys' and values', each shard is
// two pieces, the zigzag chunks, and the kernel places each pair of pieces alike.
//
// The log-sum-exp a sharded forward returns is [B, H, Sq] laid out like the query's rows
// ([B, H, Sq, 1] for cuDNN's, as that operator returns it): the efficient operator's own pads it
// to a multiple of 32 rows, which no split of the rows could keep, so the kernel drops the
// padding and restores it for each block call.
// The operators' other outputs (random-number state, sequence offsets, the debug mask) are
// this rank's own, replicated in name only: with dropout 0 no backward reads their values.
#include "rules/attention.h"

#include <algorithm>
#include <optional>

#include "rules/helpers.h"
#include "rules/registry.h"
#include "spec/sequence_order.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

constexpr int64_t kBatchDim = 0, kHeadDim = 1, kSeqDim = 2;

// SeqLocal: this rank's query rows against whole keys; Ring: rows and keys split alike;
// KeysSplit: whole rows against this rank's keys.
enum class AttentionMode { Gather, Batch, Heads, SeqLocal, Ring, KeysSplit };

// The layout every input runs in, decided from the query, key, value and mask specs alone, so
// that the forward rule and the backward rule (which sees the same saved inputs) agree.
struct Decision {
  std::vector<AttentionMode> modes;  // per mesh dim
  ShardTensorSpec query, key, value;
  std::optional<ShardTensorSpec> mask;
  int64_t seq_mesh_dim = -1;
  bool zigzag = false;  // the query's sequence is split in zigzag order (ZigzagShard): so are the keys'
};

// The mask's tensor dim for logical dim `logical` of [B, H, Sq, Sk], or -1 where it is
// broadcast (missing or of size 1).
int64_t mask_dim(const ShardTensorSpec& mask, int64_t logical) {
  const int64_t d = logical - (4 - mask.ndim());
  return d >= 0 && mask.shape()[d] != 1 ? d : -1;
}

std::vector<int64_t> divided(std::vector<int64_t> sizes, int64_t by) {
  for (int64_t& s : sizes) s /= by;
  return sizes;
}

std::vector<AttentionMode> choose_modes(const ShardTensorSpec& q, const ShardTensorSpec& k, const ShardTensorSpec& v, bool heads_allowed) {
  std::vector<AttentionMode> modes;
  bool seq_taken = false;
  for (int64_t m = 0; m < q.mesh().ndim(); ++m) {
    const Placement& p = q.placements()[m];
    const bool kv_split = k.placements()[m].is_shard(kSeqDim) || v.placements()[m].is_shard(kSeqDim);
    AttentionMode mode = AttentionMode::Gather;
    if (p.is_shard(kBatchDim)) {
      mode = AttentionMode::Batch;
    } else if (p.is_shard(kHeadDim) && heads_allowed) {
      mode = AttentionMode::Heads;
    } else if (p.is_shard(kSeqDim) && !seq_taken) {
      seq_taken = true;
      mode = kv_split ? AttentionMode::Ring : AttentionMode::SeqLocal;
    } else if (!p.is_shard() && kv_split && !seq_taken) {
      seq_taken = true;
      mode = AttentionMode::KeysSplit;
    }
    modes.push_back(mode);
  }
  return modes;
}

Placements placements_for(const std::vector<AttentionMode>& modes, bool keys, bool zigzag) {
  Placements ps;
  for (AttentionMode mode : modes) {
    switch (mode) {
      case AttentionMode::Batch: ps.push_back(Shard(kBatchDim)); break;
      case AttentionMode::Heads: ps.push_back(Shard(kHeadDim)); break;
      case AttentionMode::Ring: ps.push_back(zigzag ? ZigzagShard(kSeqDim) : Shard(kSeqDim)); break;
      case AttentionMode::SeqLocal: ps.push_back(keys ? Replicate() : Shard(kSeqDim)); break;
      case AttentionMode::KeysSplit: ps.push_back(keys ? Shard(kSeqDim) : Replicate()); break;
      case AttentionMode::Gather: ps.push_back(Replicate()); break;
    }
  }
  return ps;
}

// Keys (or values) laid out for `modes`: batch and heads cut where the query's are, the
// sequence of a ring cut where `seq_sizes` says.
ShardTensorSpec key_layout(const ShardTensorSpec& kv, const Decision& d, int64_t group, const std::vector<int64_t>& seq_sizes) {
  ShardTensorSpec t = with_placements(kv, placements_for(d.modes, /*keys=*/true, d.zigzag));
  if (t.sharding_of(kBatchDim)) t = with_dim_sizes(t, kBatchDim, d.query.sharding_of(kBatchDim)->sizes);
  if (t.sharding_of(kHeadDim)) t = with_dim_sizes(t, kHeadDim, divided(d.query.sharding_of(kHeadDim)->sizes, group));
  if (t.sharding_of(kSeqDim)) t = with_dim_sizes(t, kSeqDim, seq_sizes);
  return t;
}

ShardTensorSpec mask_layout(const ShardTensorSpec& mask, const Decision& d) {
  Placements ps;
  for (AttentionMode mode : d.modes) {
    // Split like the query's rows; whole along the keys, whose columns each block reads.
    const int64_t logical = mode == AttentionMode::Batch ? kBatchDim : mode == AttentionMode::Heads ? kHeadDim
                            : mode == AttentionMode::SeqLocal || mode == AttentionMode::Ring ? kSeqDim : -1;
    const int64_t dim = logical >= 0 ? mask_dim(mask, logical) : -1;
    ps.push_back(dim >= 0 ? Shard(dim) : Replicate());
  }
  ShardTensorSpec t = with_placements(mask, ps);
  for (int64_t logical : {kBatchDim, kHeadDim, kSeqDim}) {
    const int64_t dim = mask_dim(mask, logical);
    if (dim >= 0 && t.sharding_of(dim)) t = with_dim_sizes(t, dim, d.query.sharding_of(logical)->sizes);
  }
  return t;
}

bool whole_groups(const std::vector<int64_t>& head_sizes, int64_t group) {
  return std::all_of(head_sizes.begin(), head_sizes.end(), [&](int64_t s) { return s % group == 0; });
}

// The mask's argument name: attn_mask (CPU), attn_bias (efficient); flash on CUDA has none.
bool is_mask_argument(const std::string& name) { return name == "attn_mask" || name == "attn_bias"; }

const TensorInput* mask_input(const OpMeta& op) {
  for (const char* name : {"attn_mask", "attn_bias"})
    if (op.has_arg(name)) return op.input_named(name);
  return nullptr;
}

Decision decide(const OpMeta& op) {
  const ShardTensorSpec& q = op.input_named("query")->spec;
  const ShardTensorSpec& k = op.input_named("key")->spec;
  const ShardTensorSpec& v = op.input_named("value")->spec;
  const TensorInput* mask = mask_input(op);
  TORCH_CHECK(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4, op.name, ": query, key and value must be 4-d [B, H, S, D]; got ",
              q.ndim(), "-d, ", k.ndim(), "-d and ", v.ndim(), "-d.");
  const int64_t heads = q.shape()[kHeadDim], kv_heads = k.shape()[kHeadDim];
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, op.name, ": the query's ", heads,
              " heads are not a multiple of the key's ", kv_heads, " heads (grouped-query attention needs Hk to divide H).");
  const int64_t group = heads / kv_heads;

  Decision d{choose_modes(q, k, v, /*heads_allowed=*/true), q, k, v, std::nullopt, -1};
  d.query = with_placements(q, placements_for(d.modes, /*keys=*/false, false));
  if (d.query.sharding_of(kHeadDim) && !whole_groups(d.query.sharding_of(kHeadDim)->sizes, group)) {
    // A shard would hold part of a group whose keys another holds: gather the heads.
    d.modes = choose_modes(q, k, v, /*heads_allowed=*/false);
    d.query = with_placements(q, placements_for(d.modes, /*keys=*/false, false));
  }
  for (size_t m = 0; m < d.modes.size(); ++m)
    if (d.modes[m] == AttentionMode::SeqLocal || d.modes[m] == AttentionMode::Ring || d.modes[m] == AttentionMode::KeysSplit)
      d.seq_mesh_dim = static_cast<int64_t>(m);
  // The query's order decides (a zigzag key alone is put in order): its rows in zigzag order
  // meet keys in the same order, around the ring, whose steps then balance under a causal mask.
  if (d.seq_mesh_dim >= 0 && q.placements()[d.seq_mesh_dim].is_zigzag() && q.placements()[d.seq_mesh_dim].zigzag_unit == 1) {
    d.zigzag = true;
    d.modes[d.seq_mesh_dim] = AttentionMode::Ring;  // whole keys are cut locally into their zigzag chunks
    d.query = with_placements(q, placements_for(d.modes, /*keys=*/false, true));
  }
  std::vector<int64_t> seq_sizes;
  if (d.seq_mesh_dim >= 0 && d.modes[d.seq_mesh_dim] != AttentionMode::SeqLocal) {
    // Split keys keep their own split (the values'; or torch.chunk) along their mesh dim.
    const ShardTensorSpec& lead = k.placements()[d.seq_mesh_dim].is_shard(kSeqDim) ? k : v;
    seq_sizes = with_placements(lead, placements_for(d.modes, /*keys=*/true, d.zigzag)).sharding_of(kSeqDim)->sizes;
  }
  d.key = key_layout(k, d, group, seq_sizes);
  d.value = key_layout(v, d, group, seq_sizes);
  if (mask) d.mask = mask_layout(mask->spec, d);
  return d;
}

// `layout` with Partial(sum) on every mesh dim handled by `mode`: each rank holds its share.
OutputLayout summed_where(OutputLayout layout, const Decision& d, AttentionMode mode) {
  for (size_t m = 0; m < d.modes.size(); ++m)
    if (d.modes[m] == mode) layout.placements[m] = Partial(ReduceOp::Sum);
  return layout;
}

bool any_split(const Decision& d) {
  return std::any_of(d.modes.begin(), d.modes.end(), [](AttentionMode m) { return m != AttentionMode::Gather; });
}

AttentionPlan plan_of(const OpMeta& op, const Decision& d, AttentionOperator kind, AttentionPlan::Pass pass) {
  AttentionPlan plan(op.mesh());
  plan.pass = pass;
  plan.op = kind;
  plan.is_causal = bool_arg(op, "is_causal");
  plan.seq_mesh_dim = d.seq_mesh_dim;
  const AttentionMode seq_mode = d.seq_mesh_dim >= 0 ? d.modes[d.seq_mesh_dim] : AttentionMode::Gather;
  plan.ring = seq_mode == AttentionMode::Ring;
  plan.keys_split = seq_mode == AttentionMode::KeysSplit;
  const int64_t sq = d.query.shape()[kSeqDim], sk = d.key.shape()[kSeqDim];
  const bool rows_split = seq_mode == AttentionMode::Ring || seq_mode == AttentionMode::SeqLocal;
  // Without a causal mask positions do not matter: zigzag pieces are then read as they lie.
  plan.zigzag = d.zigzag && plan.is_causal;
  if (plan.zigzag) {
    const int64_t n = op.mesh().size(d.seq_mesh_dim);
    plan.query_rows = zigzag_pieces(sq, n);
    plan.key_rows = zigzag_pieces(sk, n);
    return plan;
  }
  plan.query_rows = rows_split ? contiguous_pieces(d.query.sharding_of(kSeqDim)->sizes) : std::vector<Pieces>{{{0, sq}}};
  plan.key_rows = plan.ring || plan.keys_split ? contiguous_pieces(d.key.sharding_of(kSeqDim)->sizes) : std::vector<Pieces>{{{0, sk}}};
  return plan;
}

// What the kernel cannot split: dropout (each rank would draw its own mask), the flash
// operator's debug mask (the attention weights, O(Sq x Sk)), the efficient operator's gradient
// for its bias, and flash's causal mask where Sq != Sk, which that operator aligns bottom-right
// (the kernel places every block top-left, as F.scaled_dot_product_attention means it; that
// function never picks flash for such a call). These fall back to the operator on the whole
// tensors (correct, with the warning).
std::optional<RuleResult> refuse_unsupported(const OpMeta& op, AttentionOperator kind) {
  const double p = op.arg("dropout_p").toDouble();
  if (p != 0.0)
    return RuleResult::unsupported("dropout_p=" + std::to_string(p) +
                                   " is not supported on sharded inputs (each rank would draw its own mask); "
                                   "F.scaled_dot_product_attention takes the math path for dropout, which is supported");
  if (op.has_arg("return_debug_mask") && bool_arg(op, "return_debug_mask"))
    return RuleResult::unsupported("return_debug_mask=True is not supported on sharded inputs (the debug mask is the whole "
                                   "[Sq, Sk] attention weights)");
  if (op.has_arg("grad_input_mask") && op.arg("grad_input_mask").toBoolList().get(3))
    return RuleResult::unsupported("a gradient for attn_bias is not supported on sharded inputs");
  const int64_t sq = op.input_named("query")->spec.shape()[kSeqDim], sk = op.input_named("key")->spec.shape()[kSeqDim];
  // cuDNN's alignment of such a diagonal is cuDNN's to choose (and has changed between its
  // versions): the whole-tensor call, whatever it does, is the answer there too.
  if ((kind == AttentionOperator::CudaFlash || kind == AttentionOperator::CudaCudnn) && bool_arg(op, "is_causal") && sq != sk)
    return RuleResult::unsupported("is_causal with " + std::to_string(sq) + " query rows and " + std::to_string(sk) +
                                   " keys: " + (kind == AttentionOperator::CudaFlash ? "flash-attention aligns that diagonal bottom-right"
                                                                                     : "cuDNN aligns that diagonal as its version does") +
                                   ", which the ring does not place");
  return std::nullopt;
}

// The operator's outputs after the output and log-sum-exp (each rank's own; see the header).
std::vector<OutputLayout> other_forward_outputs(const OpMeta& op, AttentionOperator kind) {
  const size_t count = kind == AttentionOperator::CudaFlash       ? 5   // cum_seq_q, cum_seq_k, rng_state, unused, debug_attn_mask
                       : kind == AttentionOperator::CudaEfficient ? 2   // philox_seed, philox_offset
                       : kind == AttentionOperator::CudaCudnn     ? 5   // cum_seq_q, cum_seq_k, philox_seed, philox_offset, debug_attn_mask
                                                                  : 0;
  return std::vector<OutputLayout>(count, replicated_layout(op.mesh()));
}

// (output, logsumexp, and the operator's others; see other_forward_outputs)
// A mask's rows and columns are positions: on zigzag chunks the ring would read them as lying
// in order. Refused, the operator runs on its inputs put back in order (dispatch/propagation.cpp).
std::optional<RuleResult> refuse_zigzag_mask(const OpMeta& op, const Decision& d) {
  if (!d.zigzag || !mask_input(op)) return std::nullopt;
  return RuleResult::unsupported("an attention mask next to a query split in zigzag order is not supported");
}

RuleResult attention_rule(const OpMeta& op, AttentionOperator kind) {
  if (auto refused = refuse_unsupported(op, kind)) return *refused;
  const Decision d = decide(op);
  if (auto refused = refuse_zigzag_mask(op, d)) return *refused;
  RuleResult r;
  for (const TensorInput& in : op.inputs) {
    const std::string& name = arg_name(op, in);
    r.input_targets.push_back(name == "query" ? d.query : name == "key" ? d.key : name == "value" ? d.value : *d.mask);
  }
  // output [B, H, Sq, Dv] and logsumexp [B, H, Sq]; merged over split keys, the output is
  // each rank's weighted share and the log-sum-exp the merged one.
  r.outputs = {summed_where(layout_of(d.query), d, AttentionMode::KeysSplit), layout_of(d.query)};
  for (OutputLayout& other : other_forward_outputs(op, kind)) r.outputs.push_back(std::move(other));
  if (any_split(d)) r.kernel_plan = declare(plan_of(op, d, kind, AttentionPlan::Pass::Forward));
  return r;
}

// (grad_query, grad_key, grad_value; the efficient operator's grad_bias, refused where asked for)
RuleResult attention_backward_rule(const OpMeta& op, AttentionOperator kind) {
  if (auto refused = refuse_unsupported(op, kind)) return *refused;
  const Decision d = decide(op);
  if (auto refused = refuse_zigzag_mask(op, d)) return *refused;
  RuleResult r;
  for (const TensorInput& in : op.inputs) {
    const std::string& name = arg_name(op, in);
    if (name == "query" || name == "key" || name == "value")
      r.input_targets.push_back(name == "query" ? d.query : name == "key" ? d.key : d.value);
    else if (is_mask_argument(name))
      r.input_targets.push_back(*d.mask);
    else if (name == "grad_out" || name == "grad_out_" || name == "out" || name == "logsumexp")  // laid out like the output
      r.input_targets.push_back(align_to(in.spec, d.query));
    else  // the forward's random-number state and sequence offsets: this rank's own
      r.input_targets.push_back(in.spec);
  }
  // Keys a rank saw whole got contributions from its own rows only: summed over the rows'
  // shards. Likewise whole rows that saw a rank's own keys only.
  r.outputs = {summed_where(layout_of(d.query), d, AttentionMode::KeysSplit), summed_where(layout_of(d.key), d, AttentionMode::SeqLocal),
               summed_where(layout_of(d.value), d, AttentionMode::SeqLocal)};
  if (kind == AttentionOperator::CudaEfficient) r.outputs.push_back(replicated_layout(op.mesh()));  // grad_bias: undefined
  if (any_split(d)) r.kernel_plan = declare(plan_of(op, d, kind, AttentionPlan::Pass::Backward));
  return r;
}

}  // namespace

// Note [Ring schedule]
// n ranks along the mesh dim; block b (rank b's keys and values) sits on rank (b + t) mod n at
// step t. A rank attends to a block when its rows see some of its keys (computes); the block
// moves on after step t only while a rank further along its path still needs it (sends), so
// under is_causal blocks above the diagonal never move: with even splits block b travels
// b -> n-1 and stops. Each step with any move is one message batch on every rank (a rank may
// move nothing in it), so every rank runs the same batches.
VisibleBlock visible_block(Range rows, Range keys, bool is_causal) {
  VisibleBlock v;
  if (rows.size() == 0 || keys.size() == 0) return v;
  v.any = true;
  v.rows = rows;
  v.keys = keys;
  if (!is_causal) return v;
  if (keys.begin > rows.end - 1) return {};  // every key comes after every row
  v.rows = {std::max(rows.begin, keys.begin), rows.end};  // rows before the first key see none of them
  v.keys = {keys.begin, std::min(keys.end, rows.end)};    // keys after the last row are seen by none
  if (v.keys.end - 1 <= v.rows.begin) return v;            // every row sees every key: no mask
  v.top_left = v.rows.begin == v.keys.begin;
  v.offset_mask = !v.top_left;
  return v;
}

bool any_visible(const Pieces& rows, const Pieces& keys, bool is_causal) {
  for (const Range& r : rows)
    for (const Range& k : keys)
      if (visible_block(r, k, is_causal).any) return true;
  return false;
}

bool AttentionPlan::computes(int64_t block, int64_t step) const {
  const int64_t n = ring_size();
  return any_visible(query_rows_at((block + step) % n), ring ? key_rows[block] : key_rows[0], is_causal);
}

bool AttentionPlan::sends(int64_t block, int64_t step) const {
  for (int64_t later = step + 1; later < ring_size(); ++later)
    if (computes(block, later)) return true;
  return false;
}

bool AttentionPlan::reaches(int64_t block, int64_t step) const { return step == 0 || sends(block, step - 1); }

int64_t AttentionPlan::last_step(int64_t block) const {
  int64_t last = 0;
  while (last + 1 < ring_size() && sends(block, last)) ++last;
  return last;
}

bool AttentionPlan::any_send(int64_t step) const {
  for (int64_t b = 0; b < ring_size(); ++b)
    if (sends(b, step)) return true;
  return false;
}

bool AttentionPlan::returns_during_ring(int64_t block) const {
  const int64_t last = last_step(block);
  return gradient_holder(block) != block && last + 1 < ring_size() && any_send(last);
}

const Pieces& AttentionPlan::local_keys(int64_t coordinate) const { return key_rows.size() == 1 ? key_rows[0] : key_rows[coordinate]; }

std::string AttentionPlan::name() const {
  const std::string what = ring         ? "ring attention over mesh dim " + std::to_string(seq_mesh_dim)
                           : keys_split ? "attention on split keys over mesh dim " + std::to_string(seq_mesh_dim) +
                                              ", merged by log-sum-exp"
                                        : "local attention";
  return what + (is_causal ? (zigzag ? ", causal on zigzag chunks" : ", causal") : "") + (pass == Pass::Forward ? " (forward)" : " (backward)");
}

std::vector<MoveStep> AttentionPlan::moves() const {
  if (keys_split && key_rows.size() > 1 && pass == Pass::Forward) return {StatisticsGatherStep{seq_mesh_dim}};
  if (!ring || ring_size() == 1) return {};
  // One batch per step after which some block moves on (a causal ring skips the rest); the
  // backward passes each block's gradients one batch behind it, and returns those that did not
  // come home during the ring in one batch after it.
  const int64_t n = ring_size();
  int64_t passing_steps = 0;
  for (int64_t step = 0; step + 1 < n; ++step) passing_steps += any_send(step) ? 1 : 0;
  std::vector<MoveStep> moves;
  if (passing_steps > 0) moves.push_back(RingStep{RingPhase::Pass, seq_mesh_dim, kSeqDim, passing_steps});
  if (pass == Pass::Backward) {
    if (passing_steps > 0) moves.push_back(RingStep{RingPhase::GradientPass, seq_mesh_dim, kSeqDim, passing_steps});
    bool returns_after = false;
    for (int64_t block = 0; block < n; ++block)
      returns_after = returns_after || (gradient_holder(block) != block && !returns_during_ring(block));
    if (returns_after) moves.push_back(RingStep{RingPhase::Return, seq_mesh_dim, kSeqDim});
  }
  return moves;
}

void register_attention_rules(RuleRegistry& registry) {
  const std::pair<const char*, AttentionOperator> operators[] = {
      {"aten::_scaled_dot_product_flash_attention_for_cpu", AttentionOperator::CpuFlash},
      {"aten::_scaled_dot_product_flash_attention", AttentionOperator::CudaFlash},
      {"aten::_scaled_dot_product_efficient_attention", AttentionOperator::CudaEfficient},
      {"aten::_scaled_dot_product_cudnn_attention", AttentionOperator::CudaCudnn},
  };
  for (const auto& [name, kind] : operators) {
    registry.add(name, [kind = kind](const OpMeta& op) { return attention_rule(op, kind); });
    registry.add(std::string(name) + "_backward", [kind = kind](const OpMeta& op) { return attention_backward_rule(op, kind); });
    registry.carry_order(name);
    registry.carry_order(std::string(name) + "_backward");
  }
}

}  // namespace shardtensor
