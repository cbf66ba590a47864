// pool_tree.cpp: nested budgets through memplug.hpp (and so through the C
// API): a process limit over a device pool over a tenant pool; charges at
// every level, a refusal naming the short level, pressure sent to the
// tenant's holder when the device pool is short, capacity changes at run
// time (BUSY with the live bytes in the message when lowering below them),
// the parent in the pool info.
//
//   pool_tree PATH/TO/libmemplug_plugin_cpu.so
//
// Prints "N passed, N failed" and exits non-zero on any failure.
#include "memplug.hpp"

#include "expect.hpp"

#include <cstdio>
#include <cstring>
#include <deque>
#include <string>

namespace {

constexpr uint64_t KiB = 1024;

void run(const char *plugin) {
    auto m = memplug::Manager::create();
    m.load_plugin(plugin);
    auto mech = m.select(MemplugDevice{MEMPLUG_DEVICE_CPU, 0}, 0);
    auto process = m.create_pool("process", 256 * KiB);
    auto gpu = m.create_child_pool(process, "gpu0", 128 * KiB);
    auto tenant = m.create_child_pool(gpu, "tenant", 96 * KiB);

    // The parent in the pool info.
    auto ti = tenant.info();
    auto gi = gpu.info();
    EXPECT(ti.depth == 2 && gi.depth == 1 && process.info().depth == 0);
    EXPECT(ti.parent_id == gi.pool_id && gi.parent_id == process.info().pool_id);
    EXPECT(process.info().parent_id == 0);
    EXPECT(std::strcmp(ti.parent_name, "gpu0") == 0 && std::strcmp(ti.name, "tenant") == 0);
    EXPECT(tenant.parent().info().pool_id == gi.pool_id);
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_NOT_FOUND, (void)process.parent());

    // The tenant's holder frees its blocks when asked.
    std::deque<memplug::Allocation> blocks;
    int tickets = 0;
    auto holder = tenant.register_holder("tenant-kv", MEMPLUG_HOST_PRIORITY_LOWEST,
                                         [&](const MemplugHostPressureTicket &t) -> uint64_t {
                                             tickets++;
                                             uint64_t freed = 0;
                                             while (freed < t.bytes_wanted && !blocks.empty()) {
                                                 freed += blocks.front().info().size;
                                                 blocks.pop_front();
                                             }
                                             return freed;
                                         });
    memplug::BindingOptions kv_opts;
    kv_opts.alloc_class = MEMPLUG_HOST_CLASS_KV;
    kv_opts.holder = &holder;
    auto kv = m.bind(mech, tenant, kv_opts);
    auto on_gpu = m.bind(mech, gpu);

    // Charged at every level.
    for (int i = 0; i < 8; i++) blocks.push_back(kv.allocate(8 * KiB));
    EXPECT(tenant.stats().used == 64 * KiB && gpu.stats().used == 64 * KiB && process.stats().used == 64 * KiB);
    EXPECT(gpu.info().children_used == 64 * KiB && gpu.info().children == 1);

    // The tenant itself is short: a refusal that names it (its holder has
    // nothing more than 64 KiB to give; 40 KiB more do not fit in 96).
    auto msg = EXPECT_ERROR(MEMPLUG_HOST_STATUS_OUT_OF_BUDGET, (void)m.bind(mech, tenant).allocate(160 * KiB));
    EXPECT(msg.find("short in 'tenant'") != std::string::npos);

    // The device pool is short: the tenant's holder (under it) frees room.
    tickets = 0;
    auto big = on_gpu.allocate(96 * KiB);
    EXPECT(tickets == 1);
    EXPECT(tenant.stats().used < 64 * KiB && gpu.stats().used <= 128 * KiB);

    // Capacity changes: raise, lower to what is live, refuse below it.
    tenant.set_capacity(512 * KiB);
    EXPECT(tenant.info().capacity == 512 * KiB);
    uint64_t live = gpu.info().used;
    gpu.set_capacity(live);
    EXPECT(gpu.info().capacity == live && gpu.info().free == 0);
    blocks.clear();
    live = gpu.info().used;
    msg = EXPECT_ERROR(MEMPLUG_HOST_STATUS_BUSY, gpu.set_capacity(live / 2));
    EXPECT(msg.find(std::to_string(live) + " B are live") != std::string::npos);
    EXPECT(gpu.info().capacity == 128 * KiB); // as it was
    big.reset();
    gpu.set_capacity(16 * KiB);
    EXPECT(gpu.info().capacity == 16 * KiB && process.stats().used == 0);
}

} // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s PATH/TO/libmemplug_plugin_cpu.so\n", argv[0]);
        return 2;
    }
    try {
        run(argv[1]);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "FAIL: %s\n", e.what());
        failed++;
    }
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
