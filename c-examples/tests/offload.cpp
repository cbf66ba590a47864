// offload.cpp: offload/restore and copy-on-write through memplug_offload.hpp
// (C API 1.3) on the reference CPU plugin: a round trip at the same address
// with the bytes and both pools exact; a holder answering pressure by
// offloading its weight shard (the answer is the bytes decommitted) and
// the shard restored intact afterwards; a prefix's last block privatised
// in one region while another keeps reading the shared bytes; refusals
// thrown as memplug::Error with the region unchanged.
//
//   offload PATH/TO/libmemplug_plugin_cpu.so
//
// Built with -Wall -Wextra -Wpedantic -Werror (C++17). Prints
// "N passed, N failed" and exits non-zero on any failure.
#include "memplug_offload.hpp"

#include "expect.hpp"

#include <chrono>
#include <cstring>
#include <vector>

namespace {

constexpr uint64_t MIB = 1024 * 1024;
constexpr std::chrono::seconds WAIT{10};

uint8_t byte_at(uint64_t i, uint8_t seed) { return static_cast<uint8_t>((i * 31u + seed) & 0xffu); }

void fill(uint64_t addr, uint64_t len, uint8_t seed) {
    auto *p = reinterpret_cast<uint8_t *>(static_cast<uintptr_t>(addr));
    for (uint64_t i = 0; i < len; i++) p[i] = byte_at(i, seed);
}

bool holds(uint64_t addr, uint64_t len, uint8_t seed) {
    const auto *p = reinterpret_cast<const uint8_t *>(static_cast<uintptr_t>(addr));
    for (uint64_t i = 0; i < len; i++) {
        if (p[i] != byte_at(i, seed)) return false;
    }
    return true;
}

struct Rig {
    const memplug::Manager &m;
    const memplug::Mechanism &mech;
    uint64_t g;
};

void round_trip(const Rig &r) {
    const uint64_t g = r.g;
    memplug::Pool dev = r.m.create_pool("device", 64 * MIB);
    memplug::Pool host_pool = r.m.create_pool("host", 64 * MIB);
    memplug::Binding d = r.m.bind(r.mech, dev);
    memplug::Binding host = r.m.bind(r.mech, host_pool);
    memplug::Stream s = r.mech.create_stream();
    memplug::Region region = d.reserve(32 * g);
    region.grow(4 * g);
    const uint64_t base = region.addr();
    fill(base, 4 * g, 11);

    MemplugHostOffloadReport rep = memplug::offload(region, host, s, WAIT);
    EXPECT(rep.released == 4 * g && rep.kept == 0 && rep.ranges_kept == 0);
    EXPECT(memplug::is_offloaded(region));
    MemplugHostResidence where = memplug::residence(region);
    EXPECT(where.kind == MEMPLUG_HOST_RESIDENCE_HOST && where.host_bytes == 4 * g);
    EXPECT(where.host_addr != 0 && holds(where.host_addr, 4 * g, 11));
    EXPECT(dev.stats().used == 0 && host_pool.stats().used == 4 * g);
    std::string msg = EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_STATE, memplug::offload(region, host, s, WAIT));
    EXPECT(msg.find("already offloaded") != std::string::npos);
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_STATE, region.grow(8 * g));
    EXPECT(dev.stats().used == 0 && host_pool.stats().used == 4 * g);

    memplug::Fence f = memplug::restore(region, s);
    EXPECT(f.wait(WAIT));
    EXPECT(region.addr() == base && holds(base, 4 * g, 11));
    EXPECT(!memplug::is_offloaded(region));
    EXPECT(dev.stats().used == 4 * g);
    r.m.poll();
    EXPECT(host_pool.stats().used == 0);
    msg = EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_STATE, memplug::restore(region, s));
    EXPECT(msg.find("not offloaded") != std::string::npos);
}

void pressure(const Rig &r) {
    const uint64_t g = r.g;
    memplug::Pool dev = r.m.create_pool("device-8g", 8 * g);
    memplug::Pool host_pool = r.m.create_pool("host-for-weights", 64 * MIB);
    memplug::Binding host = r.m.bind(r.mech, host_pool);
    memplug::Stream s = r.mech.create_stream();
    memplug::Region shard;
    std::vector<uint64_t> answers;
    memplug::Holder weights = dev.register_holder("weights", 1, [&](const MemplugHostPressureTicket &) {
        if (!shard || memplug::is_offloaded(shard)) return uint64_t{0};
        uint64_t released = memplug::offload(shard, host, s, WAIT).released;
        answers.push_back(released);
        return released;
    });
    memplug::Binding wb = r.m.bind(r.mech, dev, memplug::BindingOptions{}.with_class(MEMPLUG_HOST_CLASS_WEIGHTS).with_holder(weights));
    memplug::Binding acts = r.m.bind(r.mech, dev, memplug::BindingOptions{}.with_class(MEMPLUG_HOST_CLASS_ACTIVATIONS));
    shard = wb.reserve(8 * g);
    shard.grow(6 * g);
    const uint64_t addr = shard.addr();
    fill(addr, 6 * g, 3);
    {
        memplug::Allocation a = acts.allocate(4 * g, 64);
        EXPECT(answers.size() == 1 && answers[0] == 6 * g);
        EXPECT(dev.stats().used == 4 * g);
        EXPECT(memplug::is_offloaded(shard));
    }
    memplug::Fence f = memplug::restore(shard, s);
    EXPECT(f.wait(WAIT));
    EXPECT(shard.addr() == addr && holds(addr, 6 * g, 3));
    EXPECT(dev.stats().used == 6 * g);
    shard.reset();
    r.m.poll();
    EXPECT(dev.stats().used == 0 && host_pool.stats().used == 0);
}

void copy_on_write(const Rig &r) {
    const uint64_t g = r.g;
    memplug::Pool dev = r.m.create_pool("cow", 64 * MIB);
    memplug::Binding d = r.m.bind(r.mech, dev);
    memplug::Stream s = r.mech.create_stream();
    memplug::Region a = d.reserve(16 * g), b = d.reserve(16 * g);
    {
        memplug::Prefix p = d.create_prefix(4 * g, [](uint64_t addr, uint64_t len) { fill(addr, len, 9); });
        a.map_prefix(p);
        b.map_prefix(p);
    }
    EXPECT(dev.stats().used == 4 * g);
    memplug::Fence f = memplug::privatise(a, 3 * g, g, s, WAIT);
    EXPECT(f.wait(WAIT));
    EXPECT(dev.stats().used == 5 * g);
    fill(a.addr() + 3 * g, g, 42);
    EXPECT(holds(a.addr() + 3 * g, g, 42) && holds(a.addr(), 3 * g, 9));
    EXPECT(holds(b.addr(), 4 * g, 9));
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT, memplug::privatise(a, 1, g, s, WAIT));
    std::string msg = EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT, memplug::privatise(a, 3 * g, g, s, WAIT));
    EXPECT(msg.find("already private") != std::string::npos);
    EXPECT(dev.stats().used == 5 * g && holds(a.addr() + 3 * g, g, 42));
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
        Rig r{m, mech, mech.info().granularity};
        round_trip(r);
        pressure(r);
        copy_on_write(r);
    } catch (const memplug::Error &e) {
        std::fprintf(stderr, "FAIL: %s (%s)\n", e.what(), e.code_name());
        failed++;
    }
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
