// memplug.h compiles on its own and included twice as C++ (g++ and clang++,
// -std=c++11 and -std=c++17, -Wall -Wextra -Wpedantic -Werror), by
// tests/header_compiles.rs and by ctest (header_cxx17).
#include "memplug.h"
#include "memplug.h"

#include <type_traits>

// A C++ host copies and zero-initialises these structs: they must stay
// trivial standard-layout types.
static_assert(std::is_standard_layout<MemplugPlugin>::value, "MemplugPlugin layout");
static_assert(std::is_trivially_copyable<MemplugMechanism>::value, "MemplugMechanism copy");
static_assert(std::is_standard_layout<MemplugObjectRef>::value, "MemplugObjectRef layout");
// Every minor's size is a prefix of the struct (MemplugHostInfo grew in 1.2).
static_assert(sizeof(MemplugHostInfo) >= MEMPLUG_HOST_INFO_SIZE_1_0, "HostInfo size");
static_assert(MEMPLUG_HOST_INFO_SIZE_1_0 == 24, "HostInfo 1.0 size");

int memplug_header_twice_cxx(const MemplugPlugin *plugin, MemplugEntryV1 entry);

int memplug_header_twice_cxx(const MemplugPlugin *plugin, MemplugEntryV1 entry)
{
    MemplugRequest request = {};
    request.struct_size = sizeof request;
    request.device.kind = MEMPLUG_DEVICE_CPU;
    return plugin != nullptr && entry != nullptr && request.struct_size == MEMPLUG_REQUEST_SIZE_1_0 &&
           plugin->abi_major == MEMPLUG_ABI_MAJOR;
}
