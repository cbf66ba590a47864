/* memplug_host.h compiles alone, included twice, as C99 with
 * -Wall -Wextra -Wpedantic -Werror. */
#include "memplug_host.h"
#include "memplug_host.h"

int memplug_host_header_check(void);
int memplug_host_header_check(void) {
    MemplugHostManager m = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostStatus s = memplug_host_manager_destroy(m);
    return (int)s + (int)sizeof(MemplugHostPoolStats) + MEMPLUG_HOST_CLASS_COUNT;
}
