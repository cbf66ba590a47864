/* Consumer of an installed memplug: loads the installed CPU plugin
 * (MEMPLUG_CONSUMER_PLUGIN, defined by the build from the package's plugin
 * directory), allocates, frees. */
/* One topic's header alone first, as a consumer may include it. */
#include <memplug/host/pools.h>
#include <memplug_host.h>
#include <stdio.h>

int main(void) {
    MemplugHostManager m = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostMechanism mech = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostPool pool = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBinding b = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostAllocation a = MEMPLUG_HOST_NULL_HANDLE_INIT;
    uint64_t addr = 0;
    if (MEMPLUG_HOST_CHECK_API() != MEMPLUG_HOST_STATUS_OK || memplug_host_manager_create(&m) != MEMPLUG_HOST_STATUS_OK ||
        memplug_host_manager_load_plugin(m, MEMPLUG_CONSUMER_PLUGIN) != MEMPLUG_HOST_STATUS_OK ||
        memplug_host_manager_mechanism(m, 0, &mech) != MEMPLUG_HOST_STATUS_OK ||
        memplug_host_pool_create(m, "p", 1 << 20, &pool) != MEMPLUG_HOST_STATUS_OK ||
        memplug_host_binding_create(m, mech, pool, NULL, &b) != MEMPLUG_HOST_STATUS_OK ||
        memplug_host_allocate(b, 4096, 64, &a, &addr) != MEMPLUG_HOST_STATUS_OK ||
        memplug_host_allocation_free(a) != MEMPLUG_HOST_STATUS_OK ||
        memplug_host_manager_destroy(m) != MEMPLUG_HOST_STATUS_OK) {
        char msg[256];
        memplug_host_last_error_message(msg, sizeof msg);
        fprintf(stderr, "consumer: %s\n", msg);
        return 1;
    }
    printf("consumer: memplug %s allocated 4096 bytes at %#llx\n", memplug_host_version_string(),
           (unsigned long long)addr);
    return 0;
}
