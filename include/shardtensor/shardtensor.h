// Everything a user of shardtensor includes.
#pragma once

#include "shardtensor/checkpoint.h"
#include "shardtensor/context_parallel.h"
#include "shardtensor/device_mesh.h"
#include "shardtensor/dispatch.h"
#include "shardtensor/factories.h"
#include "shardtensor/placement.h"
#include "shardtensor/redistribute.h"
#include "shardtensor/shard_tensor.h"
#include "shardtensor/sharding_rule.h"
#include "shardtensor/spec.h"
#include "shardtensor/transport_options.h"
