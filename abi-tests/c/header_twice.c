/* memplug.h compiles on its own (nothing is included before it) and a second
 * inclusion is harmless. Compiled as C99 (gcc and clang) by
 * tests/header_compiles.rs and by ctest (header_c99), with
 * -Wall -Wextra -Wpedantic -Werror. */
#include "memplug.h"
#include "memplug.h"

/* Use a little of everything so the unit is not empty and the types are
 * complete. */
int memplug_header_twice_c(const MemplugPlugin *plugin, MemplugEntryV1 entry);

int memplug_header_twice_c(const MemplugPlugin *plugin, MemplugEntryV1 entry)
{
    MemplugHostFn fn = 0;
    MemplugDevice device = {MEMPLUG_DEVICE_CPU, 0};
    static const char symbol[] = MEMPLUG_ENTRY_SYMBOL_V1;
    (void)fn;
    return plugin != NULL && entry != NULL && device.kind == MEMPLUG_DEVICE_CPU &&
           sizeof symbol > 1 && (MEMPLUG_CAP_ALL_1_0 & MEMPLUG_CAP_ALLOCATOR) != 0 &&
           plugin->abi_major == MEMPLUG_ABI_MAJOR && MEMPLUG_STATUS_OK == 0;
}
