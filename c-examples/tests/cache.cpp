// cache.cpp: caching bindings through memplug_cache.hpp (C API 1.2) on the
// reference CPU plugin: a block reused at its address; stream-ordered reuse
// behind a runtime fence; idle bytes given back to another binding's
// request and by trim; a holder in the options refused; the idle policy
// (C API 1.3): a cap held at every free, collect under a usage threshold.
//
//   cache PATH/TO/libmemplug_plugin_cpu.so
//
// Built with -Wall -Wextra -Wpedantic -Werror (C++17). Prints
// "N passed, N failed" and exits non-zero on any failure.
#include "memplug_cache.hpp"

#include "expect.hpp"

#include <atomic>
#include <cstring>
#include <vector>

namespace {

constexpr uint64_t MIB = 1024 * 1024;

void reuse_and_streams(const memplug::Manager &m, const memplug::Mechanism &mech) {
    memplug::Pool pool = m.create_pool("device", 64 * MIB);
    memplug::Cache cache = memplug::Cache::create(
        m, mech, pool, memplug::CacheOptions{}.with_class(MEMPLUG_HOST_CLASS_ACTIVATIONS).with_holder_name("acts"));
    uint64_t addr = 0;
    {
        memplug::CachedAllocation a = cache.allocate(3000, 64);
        addr = a.addr();
        std::memset(a.data<char>(), 1, 3000);
        EXPECT(a.info().size == 3000);
    }
    EXPECT(pool.stats().used == 3072);
    EXPECT(cache.stats().idle_blocks == 1);
    EXPECT(cache.allocate(3072, 64).addr() == addr);
    EXPECT(cache.stats().hits == 1);

    std::atomic<bool> done{false};
    memplug::Fence fence = m.fence_from_query("kernel", [&] { return done.load(); });
    memplug::CachedAllocation s = cache.allocate(8192, 256, 1);
    uint64_t on_stream = s.addr();
    s.free_on(1, {&fence});
    EXPECT(cache.stats().pending_blocks == 1);
    {
        memplug::CachedAllocation other = cache.allocate(8192, 256, 2);
        EXPECT(other.addr() != on_stream);
    }
    memplug::CachedAllocation same = cache.allocate(8192, 256, 1);
    EXPECT(same.addr() == on_stream);
    same.free_on(1, {&fence});
    done = true;
    bool found = false;
    {
        memplug::CachedAllocation x = cache.allocate(8192, 256);
        memplug::CachedAllocation y = cache.allocate(8192, 256);
        found = x.addr() == on_stream || y.addr() == on_stream;
    }
    EXPECT(found);
    uint64_t idle = cache.stats().idle_bytes;
    EXPECT(cache.trim() == idle);
    EXPECT(pool.stats().used == 0);
}

void pressure(const memplug::Manager &m, const memplug::Mechanism &mech) {
    memplug::Pool pool = m.create_pool("small", 4 * MIB);
    // No idle cap (the default is a quarter of the pool): this is about
    // pressure.
    memplug::Cache cache = memplug::Cache::create(m, mech, pool, memplug::CacheOptions{}.with_max_idle_bytes(UINT64_MAX));
    memplug::Binding other = m.bind(mech, pool);
    memplug::CachedAllocation kept = cache.allocate(MIB, 4096);
    {
        memplug::CachedAllocation a = cache.allocate(MIB, 4096);
        memplug::CachedAllocation b = cache.allocate(MIB, 4096);
    }
    EXPECT(pool.stats().used == 3 * MIB);
    memplug::Allocation big = other.allocate(2 * MIB, 4096);
    EXPECT(cache.stats().pressure_bytes >= MIB);
    EXPECT(cache.stats().in_use_bytes == MIB);
    std::memset(kept.data<char>(), 7, MIB);

    memplug::Holder h = pool.register_holder("mine", 0, [](const MemplugHostPressureTicket &) { return uint64_t{0}; });
    memplug::CacheOptions bad;
    bad.binding.with_holder(h);
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT, memplug::Cache::create(m, mech, pool, bad));
}

void idle_policy(const memplug::Manager &m, const memplug::Mechanism &mech) {
    memplug::Pool pool = m.create_pool("idle", 16 * MIB);
    memplug::Cache cache = memplug::Cache::create(
        m, mech, pool, memplug::CacheOptions{}.with_max_idle_bytes(2 * MIB).with_gc_threshold(0.25));
    {
        std::vector<memplug::CachedAllocation> blocks;
        for (int i = 0; i < 4; i++) {
            blocks.push_back(cache.allocate(MIB, 64));
        }
    }
    EXPECT(cache.stats().idle_bytes == 2 * MIB);
    EXPECT(pool.stats().used == 2 * MIB);
    memplug::Binding other = m.bind(mech, pool);
    memplug::Allocation weights = other.allocate(3 * MIB, 64);
    // 5 MiB used, past a quarter of 16 MiB: collect gives 1 MiB back.
    EXPECT(cache.collect() == MIB);
    EXPECT(pool.stats().used == 4 * MIB);
}

} // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s PATH/TO/libmemplug_plugin_cpu.so\n", argv[0]);
        return 2;
    }
    try {
        memplug::Manager m = memplug::Manager::create();
        m.load_plugin(argv[1]);
        memplug::Mechanism mech = m.find_mechanism("memplug-cpu/cpu");
        reuse_and_streams(m, mech);
        pressure(m, mech);
        idle_policy(m, mech);
    } catch (const memplug::Error &e) {
        std::fprintf(stderr, "FAIL: %s (%s)\n", e.what(), e.code_name());
        failed++;
    }
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
