// shardtensor._C: the compiled half of the Python package.
#include "bindings.h"

#include <c10/util/Exception.h>

#include <cstring>

#include "shardtensor/dispatch.h"

namespace shardtensor::python {

Placements decode_placements(const EncodedPlacements& encoded) {
  Placements placements;
  placements.reserve(encoded.size());
  for (const auto& [kind, value] : encoded) {
    switch (kind) {
      case 0: placements.push_back(Shard(value)); break;
      case 1: placements.push_back(Replicate()); break;
      case 2:
        TORCH_CHECK_VALUE(value >= 0 && value <= static_cast<int64_t>(ReduceOp::Product), "Partial: reduce op code ",
                          value, " is not one of sum, avg, max, min, product.");
        placements.push_back(Partial(static_cast<ReduceOp>(value)));
        break;
      case 3: {  // a pending norm: the bits of its order
        double p = 0;
        std::memcpy(&p, &value, sizeof p);
        placements.push_back(NormPartial(p));
        break;
      }
      case 4: placements.push_back(ZigzagShard(static_cast<int32_t>(value & 0xffffffff), value >> 32)); break;
      default:
        TORCH_CHECK_VALUE(false, "placement kind code ", kind,
                          " is not Shard (0), Replicate (1), Partial (2), a norm Partial (3) or ZigzagShard (4).");
    }
  }
  return placements;
}

EncodedPlacements encode_placements(const Placements& placements) {
  EncodedPlacements encoded;
  encoded.reserve(placements.size());
  for (const Placement& p : placements) {
    if (p.is_zigzag()) encoded.emplace_back(4, (p.zigzag_unit << 32) | static_cast<uint32_t>(p.tensor_dim));
    else if (p.is_shard()) encoded.emplace_back(0, p.tensor_dim);
    else if (p.is_replicate()) encoded.emplace_back(1, 0);
    else if (p.reduce_op == ReduceOp::Norm) {
      int64_t bits = 0;
      std::memcpy(&bits, &p.norm_order, sizeof bits);
      encoded.emplace_back(3, bits);
    } else encoded.emplace_back(2, static_cast<int64_t>(p.reduce_op));
  }
  return encoded;
}

ShardSizes decode_sizes(const EncodedSizes& encoded) {
  ShardSizes sizes;
  for (const auto& [dim, values] : encoded) sizes.push_back({dim, values});
  return sizes;
}

EncodedSizes encode_sizes(const ShardSizes& sizes) {
  EncodedSizes encoded;
  for (const DimShardSizes& s : sizes) encoded.emplace_back(s.tensor_dim, s.sizes);
  return encoded;
}

}  // namespace shardtensor::python

PYBIND11_MODULE(_C, m) {
  m.doc() = "shardtensor's C++ core; use the shardtensor package, not this module.";
  // Now, with the GIL held, rather than inside the first call that makes a ShardTensor, which
  // releases the GIL: other Python threads could then dispatch operators while the dispatcher's
  // tables are being written (see register_kernels).
  shardtensor::register_kernels();
  shardtensor::python::bind_mesh(m);
  shardtensor::python::bind_tensor(m);
  shardtensor::python::bind_dispatch(m);
  shardtensor::python::bind_checkpoint(m);
  shardtensor::python::bind_rules(m);
  shardtensor::python::bind_tracing(m);
}
