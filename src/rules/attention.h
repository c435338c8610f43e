// The plan of scaled dot-product attention on ShardTensors (rules/attention.cpp declares it,
// kernels/attention.cpp runs it), and the pure geometry both share: which part of a block of
// keys a block of query rows sees under the causal mask, and which blocks of a ring each rank
// computes and passes on.
//
// Positions are global sequence indices: query row i sees key j iff j <= i under is_causal
// (torch's top-left alignment, also when Sq != Sk).
#pragma once

#include "rules/kernel_plan.h"
#include "spec/sequence_order.h"  // Pieces

namespace shardtensor {

// The part of a (query rows x keys) block that takes part in the attention: rows that see
// at least one key, keys that at least one row sees, and how the mask inside looks.
struct VisibleBlock {
  bool any = false;        // false: every pair is masked (or a side is empty): skip the block
  Range rows, keys;        // global positions, restricted
  bool top_left = false;   // the causal mask inside is the operator's own (first row meets first key)
  bool offset_mask = false;  // the causal diagonal is offset: the kernel builds an additive mask
};
VisibleBlock visible_block(Range rows, Range keys, bool is_causal);

// Any pair of a row piece and a key piece takes part in the attention.
bool any_visible(const Pieces& rows, const Pieces& keys, bool is_causal);

// The SDPA operators F.scaled_dot_product_attention reaches, which take and return the same
// things under different names and positions (kernels/attention_operators.cpp calls each).
enum class AttentionOperator {
  CpuFlash,       // _scaled_dot_product_flash_attention_for_cpu: top-left causal, an optional mask
  CudaFlash,      // _scaled_dot_product_flash_attention: no mask; causal only where Sq == Sk
  CudaEfficient,  // _scaled_dot_product_efficient_attention: attn_bias; log-sum-exp padded to 32 rows
  CudaCudnn,      // _scaled_dot_product_cudnn_attention: attn_bias; log-sum-exp [B, H, Sq, 1]
};

struct AttentionPlan : KernelPlan {
  enum class Pass { Forward, Backward };
  explicit AttentionPlan(DeviceMesh m) : mesh(std::move(m)) {}

  Pass pass = Pass::Forward;
  AttentionOperator op = AttentionOperator::CpuFlash;
  DeviceMesh mesh;
  int64_t seq_mesh_dim = -1;      // the mesh dim splitting the query rows (dim 2); -1: rows whole
  bool ring = false;              // keys and values are split on seq_mesh_dim too: they travel the ring
  bool keys_split = false;        // rows whole, keys and values split on seq_mesh_dim: merged by log-sum-exp
  std::vector<Pieces> query_rows;  // per coordinate along seq_mesh_dim (one entry when rows are whole)
  std::vector<Pieces> key_rows;    // ring, keys_split: per coordinate along seq_mesh_dim; else one entry, [0, Sk)
  bool is_causal = false;
  bool zigzag = false;             // the ring's shards are zigzag chunks (the pieces say where)

  // The operator's own causal mask is passed to a block only where it is square: where the
  // query is longer than the keys, flash-attention on CUDA aligns the diagonal bottom-right
  // (not torch's top-left), so the kernel cuts such a block into a square causal part and a
  // rectangle without mask, which mean the same under either alignment.
  bool square_causal_only() const { return op != AttentionOperator::CpuFlash; }

  // The ring's schedule (Note [Ring schedule] in attention.cpp). Step t of block b: the block is
  // on the rank b + t (mod n).
  int64_t ring_size() const { return ring ? static_cast<int64_t>(key_rows.size()) : 1; }
  const Pieces& query_rows_at(int64_t coordinate) const { return query_rows.size() == 1 ? query_rows[0] : query_rows[coordinate]; }
  const Pieces& local_keys(int64_t coordinate) const;  // the keys the rank at `coordinate` holds before any pass
  bool computes(int64_t block, int64_t step) const;  // the rank holding it at `step` attends to it
  bool sends(int64_t block, int64_t step) const;     // after `step`, it moves on to the next rank
  bool reaches(int64_t block, int64_t step) const;   // it is on its rank at `step` (step 0: its owner)
  bool present(int64_t block, int64_t step) const { return !ring || reaches(block, step); }  // ring or not: the local keys always
  int64_t last_step(int64_t block) const;            // the last step it reaches: where its gradients end
  bool any_send(int64_t step) const;                 // some block moves after `step`: one message batch
  // Backward: where a block's key and value gradients end (the rank holding it at its last step),
  // and whether they go home from there in that step's batch (there is one, and they are not
  // home already) rather than in one batch after the ring. Going home as soon as they are final
  // keeps them from piling up: under a causal mask every block stops on the last rank.
  int64_t gradient_holder(int64_t block) const { return (block + last_step(block)) % ring_size(); }
  bool returns_during_ring(int64_t block) const;

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override;
  // Ring: K/V blocks passed along the mesh dim (backward: their gradients passed behind them,
  // then returned to their owners). Local attention moves nothing.
  std::vector<MoveStep> moves() const override;
  MoveLowering move_lowering() const override;  // kernels/attention_blocks.cpp: the ring's batches
};

}  // namespace shardtensor
