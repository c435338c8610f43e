// Tensors made while this guard lives hold real bytes, even while torch.compile traces: it steps
// below the tracer's modes (the Python key) and functionalization, which would otherwise hand
// back tensors without storage for anything filled from host memory.
#pragma once

#include <c10/core/impl/LocalDispatchKeySet.h>

namespace shardtensor {

class BelowTracerModes {
 public:
  BelowTracerModes()
      : guard_(c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot, c10::DispatchKey::Functionalize})) {}

 private:
  c10::impl::ExcludeDispatchKeyGuard guard_;
};

}  // namespace shardtensor
