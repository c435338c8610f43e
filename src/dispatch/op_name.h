// The name rules are registered under, from the dispatcher's name of an operator.
#pragma once

#include <ATen/core/operator_name.h>

#include <string>

namespace shardtensor {

// "aten::add.Tensor" (name.overload), or "aten::mm" where the overload is the default one.
inline std::string full_op_name(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

}  // namespace shardtensor
