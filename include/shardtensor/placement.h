// Placements: how a tensor is laid out along one mesh dimension.
//
// Shard(tensor_dim) splits a tensor dim over the ranks of the mesh dim, Replicate() gives every
// rank the whole, Partial(op) gives every rank a term of a pending reduction. ZigzagShard(d)
// splits dim d too, in the order load-balanced causal attention wants (context_parallel.h): the
// dim cut into 2n chunks, rank r holding chunks r and 2n - 1 - r. They are small value types
// with ==, hash and operator<< (printed like DTensor's short form: S(0), Z(2), R, P(sum)).
// Only c10 and the standard library are included here.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace shardtensor {

// The reduction a Partial placement is waiting for. Norm is a pending p-norm (DTensor's
// _NormPartial): every term holds the p-norm of its part, the value is (sum of terms^p)^(1/p)
// (Placement::norm_order holds p); it reduces as a sum of p-th powers followed by the root.
enum class ReduceOp : uint8_t { Sum, Avg, Max, Min, Product, Norm };

const char* to_string(ReduceOp op);

// Raises unless a Partial(op) of `dtype` values can be reduced: a complex tensor reduces only
// by sum and avg (as its real view), since max and min have no meaning for complex numbers
// and a product does not work on the real view.
void check_reducible(c10::ScalarType dtype, ReduceOp op);

// The order in which a Shard's pieces sit on the ranks of its mesh dim: one stretch each, in
// rank order, or zigzag chunks (two stretches each; see the file comment).
enum class ShardOrder : uint8_t { InOrder, Zigzag };

struct Placement {
  enum class Kind : uint8_t { Shard, Replicate, Partial };

  Kind kind = Kind::Replicate;
  int64_t tensor_dim = -1;               // meaningful for Shard only
  ReduceOp reduce_op = ReduceOp::Sum;    // meaningful for Partial only
  double norm_order = 2.0;               // meaningful for Partial(Norm) only: p, finite, not 0 or 1
  ShardOrder order = ShardOrder::InOrder;  // meaningful for Shard only
  // Zigzag only: the chunks are whole multiples of this many positions. 1 but where a zigzag
  // sequence was flattened with the dims after it ([S, B] -> [S*B]: B), which a view undoes.
  int64_t zigzag_unit = 1;

  bool is_shard() const { return kind == Kind::Shard; }
  bool is_shard(int64_t dim) const { return is_shard() && tensor_dim == dim; }
  bool is_zigzag() const { return is_shard() && order == ShardOrder::Zigzag; }
  bool is_replicate() const { return kind == Kind::Replicate; }
  bool is_partial() const { return kind == Kind::Partial; }

  bool operator==(const Placement& other) const;
  bool operator!=(const Placement& other) const { return !(*this == other); }
  size_t hash() const;
};

using Placements = std::vector<Placement>;

// Factories that read like DTensor: {Shard(0), Replicate()}.
Placement Shard(int64_t tensor_dim);
Placement ZigzagShard(int64_t tensor_dim, int64_t unit = 1);
Placement Replicate();
Placement Partial(ReduceOp op = ReduceOp::Sum);
// A pending p-norm, or the Partial the same pending reduction has where one exists: p = 1 and
// p = 0 (a count) are sums, +inf a maximum and -inf a minimum of the terms' norms.
Placement NormPartial(double p);

std::string to_string(const Placement& p);     // "S(0)", "Z(2)", "Z(0, unit=4)", "R", "P(sum)"
std::string to_string(const Placements& ps);   // "[S(0), R]"
std::ostream& operator<<(std::ostream& os, const Placement& p);
std::ostream& operator<<(std::ostream& os, const Placements& ps);

}  // namespace shardtensor

template <>
struct std::hash<shardtensor::Placement> {
  size_t operator()(const shardtensor::Placement& p) const { return p.hash(); }
};
