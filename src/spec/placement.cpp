// Placement value type: equality, hashing and printing. No tensor or mesh knowledge here.
#include "shardtensor/placement.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <functional>
#include <ostream>
#include <sstream>

#include "util/hash.h"

namespace shardtensor {

void check_reducible(c10::ScalarType dtype, ReduceOp op) {
  TORCH_CHECK_VALUE(!c10::isComplexType(dtype) || op == ReduceOp::Sum || op == ReduceOp::Avg, "Partial(", to_string(op),
              ") of a complex tensor (", dtype, ") cannot be reduced: only Partial(sum) and Partial(avg) are defined for ",
              "complex values.");
  TORCH_CHECK_VALUE(op != ReduceOp::Norm || c10::isFloatingType(dtype), "Partial(norm) of a ", dtype,
                    " tensor cannot be reduced: a pending norm takes floating-point values.");
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Product: return "product";
    case ReduceOp::Norm: return "norm";
  }
  return "?";
}

bool Placement::operator==(const Placement& other) const {
  if (kind != other.kind) return false;
  switch (kind) {
    case Kind::Shard: return tensor_dim == other.tensor_dim && order == other.order && zigzag_unit == other.zigzag_unit;
    case Kind::Partial: return reduce_op == other.reduce_op && (reduce_op != ReduceOp::Norm || norm_order == other.norm_order);
    case Kind::Replicate: return true;
  }
  return true;
}

size_t Placement::hash() const {
  size_t h = static_cast<size_t>(kind);
  if (is_shard()) h = hash_combine(h, static_cast<size_t>(tensor_dim) * 2 + (order == ShardOrder::Zigzag));
  if (is_zigzag()) h = hash_combine(h, static_cast<size_t>(zigzag_unit));
  if (is_partial()) h = hash_combine(h, static_cast<size_t>(reduce_op));
  if (is_partial() && reduce_op == ReduceOp::Norm) h = hash_combine(h, std::hash<double>()(norm_order));
  return h;
}

Placement Shard(int64_t tensor_dim) { return Placement{Placement::Kind::Shard, tensor_dim, ReduceOp::Sum}; }
Placement ZigzagShard(int64_t tensor_dim, int64_t unit) {
  TORCH_CHECK_VALUE(unit >= 1, "ZigzagShard(", tensor_dim, ", unit=", unit, "): the unit is a count of positions, >= 1.");
  Placement p = Shard(tensor_dim);
  p.order = ShardOrder::Zigzag;
  p.zigzag_unit = unit;
  return p;
}
Placement Replicate() { return Placement{}; }
Placement Partial(ReduceOp op) { return Placement{Placement::Kind::Partial, -1, op}; }

Placement NormPartial(double p) {
  if (p == 0 || p == 1) return Partial(ReduceOp::Sum);
  if (std::isinf(p)) return Partial(p > 0 ? ReduceOp::Max : ReduceOp::Min);
  Placement out = Partial(ReduceOp::Norm);
  out.norm_order = p;
  return out;
}

std::string to_string(const Placement& p) {
  switch (p.kind) {
    case Placement::Kind::Shard:
      if (!p.is_zigzag()) return "S(" + std::to_string(p.tensor_dim) + ")";
      return "Z(" + std::to_string(p.tensor_dim) + (p.zigzag_unit == 1 ? "" : ", unit=" + std::to_string(p.zigzag_unit)) + ")";
    case Placement::Kind::Replicate: return "R";
    case Placement::Kind::Partial: {
      if (p.reduce_op != ReduceOp::Norm) return std::string("P(") + to_string(p.reduce_op) + ")";
      std::ostringstream os;
      os << "P(norm" << p.norm_order << ")";
      return os.str();
    }
  }
  return "?";
}

std::string to_string(const Placements& ps) {
  std::string out = "[";
  for (size_t i = 0; i < ps.size(); ++i) {
    if (i > 0) out += ", ";
    out += to_string(ps[i]);
  }
  return out + "]";
}

std::ostream& operator<<(std::ostream& os, const Placement& p) { return os << to_string(p); }
std::ostream& operator<<(std::ostream& os, const Placements& ps) { return os << to_string(ps); }

}  // namespace shardtensor
