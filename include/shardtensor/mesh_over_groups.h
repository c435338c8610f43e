// A DeviceMesh over process groups the caller has, optionally with a mesh-wide group built here.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <string>
#include <vector>

#include "shardtensor/device_mesh.h"

namespace c10d {
class Store;
}

namespace shardtensor {

// DeviceMesh::from_process_groups; with `build_mesh_group_through` (torch.distributed's store)
// and no `mesh_group`, the mesh-wide group is built through that store, its group rank the
// row-major position. That serves
// layouts torch.distributed cannot give a group for, since it orders a group's ranks: the
// transposed mesh fully_shard nests data parallelism in (("tp", "dp") of a ("dp", "tp") mesh).
// Every rank of the mesh must build it, in the same order as its other meshes.
DeviceMesh mesh_over_process_groups(std::vector<int64_t> shape, std::vector<int64_t> ranks,
                                    std::vector<c10::intrusive_ptr<c10d::ProcessGroup>> groups,
                                    std::vector<std::string> dim_names, const MeshOptions& options,
                                    c10::intrusive_ptr<c10d::ProcessGroup> mesh_group,
                                    c10::intrusive_ptr<c10d::Store> build_mesh_group_through);

}  // namespace shardtensor
