// Registration of the ShardTensor kernel with the dispatcher. Done once, on first use of the
// API, rather than by static initialisers that a linker may drop.
#pragma once

namespace shardtensor {

// Registers the boxed kernel on PrivateUse1 for every operator that has no
// CompositeImplicitAutograd kernel, and as the PrivateUse1 fallback for operators registered
// later. Idempotent and thread-safe.
void ensure_dispatch_registered();

}  // namespace shardtensor
