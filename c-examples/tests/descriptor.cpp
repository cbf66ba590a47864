// descriptor.cpp: C API 1.1 through memplug.hpp, against the reference CPU
// plugin (plugin ABI 1.2): Mechanism::descriptor() (attributes
// HOST_VISIBLE | HOST_COHERENT | READ_ONLY_ENFORCED, memfd export, host
// memory, maps at offsets, 4 KiB pages), identity() (NUMA node 0),
// typed_export(); Manager::select_needing with MemoryNeeds (met, unmet
// with the missing need named, malformed); BindingOptions' placement
// builders reaching the plugin (accepted, refused by the plugin when memory
// is asked for, malformed refused at bind) — every failure a memplug::Error
// with its status.
//
//   descriptor_cpp PATH/TO/libmemplug_plugin_cpu.so
//
// Prints "N passed, N failed" and exits non-zero on any failure.
#include "memplug.hpp"

#include "expect.hpp"

#include <cstdio>
#include <cstring>
#include <string>

namespace {


bool contains(const std::string &s, const char *part) { return s.find(part) != std::string::npos; }

constexpr uint32_t kCpuAttributes =
    MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_HOST_COHERENT | MEMPLUG_ATTR_READ_ONLY_ENFORCED;
constexpr uint64_t kMib2 = 2ull << 20;

MemplugDevice cpu(uint32_t ordinal) {
    MemplugDevice d{};
    d.kind = MEMPLUG_DEVICE_CPU;
    d.ordinal = ordinal;
    return d;
}

void descriptor_and_identity(const memplug::Mechanism &mech) {
    memplug::Descriptor d = mech.descriptor();
    EXPECT(d.attributes == kCpuAttributes);
    EXPECT(d.has(MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_HOST_COHERENT) && !d.has(MEMPLUG_ATTR_PINNED));
    EXPECT(d.export_types == MEMPLUG_HANDLE_MEMFD);
    EXPECT(d.exports_as(MEMPLUG_HANDLE_MEMFD) && !d.exports_as(MEMPLUG_HANDLE_DMABUF_FD));
    EXPECT(d.location == memplug::Location::host());
    EXPECT(d.location != memplug::Location::numa_node(0));
    EXPECT(d.maps_at_offsets);
    EXPECT(d.page_sizes == 4096);
    EXPECT(d.accepts_page_size(0) && d.accepts_page_size(4096) && !d.accepts_page_size(kMib2));
    EXPECT(!d.accepts_page_size(4095));
    EXPECT(mech.typed_export());

    std::optional<MemplugHostDeviceIdentity> id = mech.identity();
    EXPECT(id.has_value());
    if (id) {
        EXPECT(id->valid == MEMPLUG_IDENTITY_NUMA_NODE);
        EXPECT(id->numa_node == 0);
        EXPECT(id->struct_size == MEMPLUG_HOST_DEVICE_IDENTITY_SIZE_1_1);
    }
}

void selection(memplug::Manager &m) {
    memplug::MemoryNeeds needs;
    needs.attributes = MEMPLUG_ATTR_HOST_VISIBLE;
    needs.location = memplug::Location::host();
    needs.page_size = 4096;
    memplug::Mechanism found = m.select_needing(cpu(0), MEMPLUG_CAP_VIRTUAL_BACKING, needs);
    EXPECT(found.descriptor().attributes == kCpuAttributes);
    EXPECT(std::strcmp(found.info().name, "cpu") == 0);
    memplug::Mechanism any = m.select_needing(cpu(0), 0, memplug::MemoryNeeds{});
    EXPECT(static_cast<bool>(any));

    memplug::MemoryNeeds pinned;
    pinned.attributes = MEMPLUG_ATTR_PINNED;
    std::string e = EXPECT_ERROR(MEMPLUG_HOST_STATUS_UNSUPPORTED, m.select_needing(cpu(0), 0, pinned));
    EXPECT(contains(e, "attributes 0x8"));
    memplug::MemoryNeeds node;
    // A node and a page size no mechanism of cpu:0 has.
    node.location = memplug::Location::numa_node(7);
    e = EXPECT_ERROR(MEMPLUG_HOST_STATUS_UNSUPPORTED, m.select_needing(cpu(0), 0, node));
    EXPECT(contains(e, "location 3:7 (it has 2:0)"));
    memplug::MemoryNeeds huge;
    huge.page_size = 1ull << 30;
    e = EXPECT_ERROR(MEMPLUG_HOST_STATUS_UNSUPPORTED, m.select_needing(cpu(0), 0, huge));
    EXPECT(contains(e, "page size 0x40000000"));
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_NOT_FOUND, m.select_needing(cpu(7), 0, memplug::MemoryNeeds{}));
    memplug::MemoryNeeds odd;
    odd.page_size = 3 * 4096;
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT, m.select_needing(cpu(0), 0, odd));
    memplug::MemoryNeeds nowhere;
    nowhere.location = memplug::Location{99, 0};
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT, m.select_needing(cpu(0), 0, nowhere));
}

void placement(memplug::Manager &m, const memplug::Mechanism &mech) {
    memplug::Pool pool = m.create_pool("cpu0", 16u << 20);

    // Builders: what the CPU plugin can do.
    memplug::BindingOptions ok_opts = memplug::BindingOptions{}
                                          .with_class(MEMPLUG_HOST_CLASS_KV)
                                          .with_uninitialized_ok()
                                          .with_page_size(4096)
                                          .with_location(memplug::Location::host())
                                          .with_export_types(MEMPLUG_HANDLE_MEMFD);
    EXPECT(ok_opts.hints == MEMPLUG_HINT_UNINITIALIZED_OK && ok_opts.page_size == 4096);
    {
        memplug::Binding b = m.bind(mech, pool, ok_opts);
        memplug::Allocation a = b.allocate(8192, 64);
        EXPECT(a.addr() != 0);
        memplug::Prefix p = b.create_prefix(8192);
        EXPECT(p.info().len >= 8192);
    }
    EXPECT(pool.stats().used == 0);

    // What it cannot: the plugin refuses when memory is asked for.
    {
        memplug::Binding b = m.bind(mech, pool, memplug::BindingOptions{}.with_page_size(kMib2));
        std::string e = EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT, b.allocate(8192, 64));
        EXPECT(contains(e, "page size 0x200000"));
        memplug::Binding dmabuf =
            m.bind(mech, pool, memplug::BindingOptions{}.with_export_types(MEMPLUG_HANDLE_DMABUF_FD));
        EXPECT_ERROR(MEMPLUG_HOST_STATUS_UNSUPPORTED, dmabuf.allocate(4096, 64));
        EXPECT_ERROR(MEMPLUG_HOST_STATUS_UNSUPPORTED, dmabuf.create_prefix(4096));
    }
    EXPECT(pool.stats().used == 0);

    // Malformed placement: refused at bind.
    memplug::BindingOptions bad;
    bad.hints = 1u << 9;
    std::string e = EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT, m.bind(mech, pool, bad));
    EXPECT(contains(e, "unknown hint bits 0x200"));
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT,
                 m.bind(mech, pool, memplug::BindingOptions{}.with_page_size(5000)));
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT,
                 m.bind(mech, pool, memplug::BindingOptions{}.with_location(memplug::Location{7, 0})));
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT,
                 m.bind(mech, pool, memplug::BindingOptions{}.with_export_types(1u << 15)));
    // A tier or a NUMA node is a placement the wrapper passes on as given.
    memplug::Binding tier = m.bind(mech, pool, memplug::BindingOptions{}.with_location(memplug::Location::tier(1)));
    EXPECT(static_cast<bool>(tier));
}

} // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s PATH/TO/libmemplug_plugin_cpu.so\n", argv[0]);
        return 2;
    }
    try {
        auto m = memplug::Manager::create();
        m.load_plugin(argv[1]);
        memplug::Mechanism mech = m.find_mechanism("memplug-cpu/cpu");
        descriptor_and_identity(mech);
        selection(m);
        placement(m, mech);
        // A stale mechanism handle: descriptor() and identity() throw.
        memplug::Mechanism gone = m.find_mechanism("memplug-cpu/cpu");
        MemplugHostMechanism raw = gone.get();
        gone.reset();
        memplug::Mechanism stale(raw);
        EXPECT_ERROR(MEMPLUG_HOST_STATUS_STALE_HANDLE, stale.descriptor());
        EXPECT_ERROR(MEMPLUG_HOST_STATUS_STALE_HANDLE, stale.identity());
        (void)stale.release();
    } catch (const std::exception &e) {
        std::fprintf(stderr, "FAIL: uncaught %s\n", e.what());
        failed++;
    }
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
