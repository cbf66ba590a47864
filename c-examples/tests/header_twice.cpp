// memplug_host.h, memplug.hpp, memplug_cache.hpp, memplug_offload.hpp, memplug_node.hpp and memplug_ucx.hpp compile alone, included
// twice, as C++17
// with -Wall -Wextra -Wpedantic -Werror.
#include <cstddef>
#include "memplug_host.h"
#include "memplug_host.h"
#include "memplug.hpp"
#include "memplug.hpp"
#include "memplug_cache.hpp"
#include "memplug_cache.hpp"
#include "memplug_offload.hpp"
#include "memplug_offload.hpp"
#include "memplug_ucx.hpp"
#include "memplug_ucx.hpp"
#include "memplug_node.hpp"
#include "memplug_node.hpp"

static_assert(sizeof(MemplugHostManager) == 8, "a handle is 64 bits");
static_assert(sizeof(MemplugHostPoolStats) == MEMPLUG_HOST_POOL_STATS_SIZE_1_0, "1.0 layout");
static_assert(sizeof(MemplugHostStatus) == 4, "statuses are 32-bit");
static_assert(sizeof(MemplugHostCacheStats) == MEMPLUG_HOST_CACHE_STATS_SIZE_1_3, "1.3 layout");
static_assert(offsetof(MemplugHostCacheStats, pinned_blocks) == MEMPLUG_HOST_CACHE_STATS_SIZE_1_2,
              "the 1.2 prefix is unchanged");
static_assert(sizeof(MemplugHostOffloadReport) == MEMPLUG_HOST_OFFLOAD_REPORT_SIZE_1_3, "1.3 layout");
static_assert(sizeof(MemplugHostResidence) == MEMPLUG_HOST_RESIDENCE_SIZE_1_3, "1.3 layout");
static_assert(sizeof(MemplugHostUcxRemoteRange) == 40, "a fixed layout");

int memplug_host_header_check();
int memplug_host_header_check() {
    memplug::Manager none;
    return none ? 1 : 0;
}
