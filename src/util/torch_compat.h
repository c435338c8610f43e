// Every difference between the libtorch versions we build against lives here (1.13.1 from
// Debian, 2.x from pytorch.org). Code elsewhere uses these names and never tests versions.
#pragma once

#include <torch/version.h>

// libtorch 2.0 split c10d::ProcessGroup into a front (ProcessGroup) and per-device backends
// (c10d::Backend): ProcessGroupGloo and ProcessGroupNCCL became Backends. Both classes offer
// the same collective methods, so the c10d adapter is written once over `C10dBackend`.
#if TORCH_VERSION_MAJOR >= 2
#define SHARDTENSOR_C10D_HAS_BACKEND 1
namespace c10d {
class Backend;
}
namespace shardtensor {
using C10dBackend = c10d::Backend;
}
#else
#define SHARDTENSOR_C10D_HAS_BACKEND 0
namespace c10d {
class ProcessGroup;
}
namespace shardtensor {
using C10dBackend = c10d::ProcessGroup;
}
#endif
