/*
 * descriptor.c: C API 1.1 through memplug_host.h, against the reference CPU
 * plugin (plugin ABI 1.2):
 *
 *   1. memplug_host_mechanism_descriptor: attributes HOST_VISIBLE |
 *      HOST_COHERENT | READ_ONLY_ENFORCED, export kinds MEMFD, location
 *      HOST, maps at offsets, the 4 KiB page bit; the info's capabilities
 *      carry MEMPLUG_CAP_TYPED_EXPORT; memplug_host_mechanism_identity: a
 *      NUMA node (0). Short and NULL out-structs refused, left alone.
 *   2. memplug_host_manager_select_needing: met needs select the mechanism;
 *      unmet ones are UNSUPPORTED naming what is missing; malformed ones
 *      INVALID_ARGUMENT.
 *   3. Placement in MemplugHostBindingOptions: what the plugin can do
 *      allocates; a page size or export kind it cannot is refused when
 *      memory is asked for, the grant given back; malformed placement is
 *      refused at create. A caller built with the API 1.0 options (its
 *      struct_size, whatever follows it in memory) still works and asks for
 *      no placement.
 *
 *   descriptor PATH/TO/libmemplug_plugin_cpu.so
 *
 * Built with -Wall -Wextra -Wpedantic -Werror (C99); also run under
 * AddressSanitizer + UndefinedBehaviorSanitizer and valgrind. Prints
 * "N passed, N failed" and exits non-zero on any failure.
 */
#include "memplug_host.h"

#include "expect.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>


/* The placement is appended: the 1.0 fields stay where they were. */
#define STATIC_CHECK(name, cond) typedef char name[(cond) ? 1 : -1]
STATIC_CHECK(options_1_0_prefix, offsetof(MemplugHostBindingOptions, hints) == MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_0);
STATIC_CHECK(options_1_1_size, sizeof(MemplugHostBindingOptions) == MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_1);
STATIC_CHECK(descriptor_size, sizeof(MemplugHostDescriptor) == MEMPLUG_HOST_DESCRIPTOR_SIZE_1_1);
STATIC_CHECK(identity_size, sizeof(MemplugHostDeviceIdentity) == MEMPLUG_HOST_DEVICE_IDENTITY_SIZE_1_1);
STATIC_CHECK(needs_size, sizeof(MemplugHostMemoryNeeds) == MEMPLUG_HOST_MEMORY_NEEDS_SIZE_1_1);

/* MemplugHostBindingOptions as a program built against API 1.0 knows it. */
struct binding_options_1_0 {
    uint32_t struct_size;
    uint32_t alloc_class;
    MemplugHostHolder holder;
    uint64_t wait_ns;
};
STATIC_CHECK(old_size, sizeof(struct binding_options_1_0) == MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_0);

#define CPU_ATTRIBUTES (MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_HOST_COHERENT | MEMPLUG_ATTR_READ_ONLY_ENFORCED)
#define MIB2 (2ull << 20)
#define GIB1 (1ull << 30)

static MemplugDevice cpu(uint32_t ordinal) {
    MemplugDevice d;
    memset(&d, 0, sizeof d);
    d.kind = MEMPLUG_DEVICE_CPU;
    d.ordinal = ordinal;
    return d;
}

static MemplugHostMemoryNeeds needs(uint32_t attributes, uint32_t location_kind, uint32_t location_id,
                                    uint64_t page_size) {
    MemplugHostMemoryNeeds n;
    memset(&n, 0, sizeof n);
    n.struct_size = sizeof n;
    n.attributes = attributes;
    n.location_kind = location_kind;
    n.location_id = location_id;
    n.page_size = page_size;
    return n;
}

static MemplugHostBindingOptions options(uint32_t alloc_class) {
    MemplugHostBindingOptions o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.alloc_class = alloc_class;
    return o;
}

static void descriptor_and_identity(MemplugHostMechanism mech) {
    MemplugHostDescriptor d;
    MemplugHostDeviceIdentity id;
    MemplugHostMechanismInfo info;

    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    EXPECT_OK(memplug_host_mechanism_descriptor(mech, &d));
    EXPECT(d.struct_size == MEMPLUG_HOST_DESCRIPTOR_SIZE_1_1);
    EXPECT(d.attributes == CPU_ATTRIBUTES);
    EXPECT(d.export_types == MEMPLUG_HANDLE_MEMFD);
    EXPECT(d.location_kind == MEMPLUG_LOCATION_HOST && d.location_id == 0);
    EXPECT(d.maps_at_offsets == 1);
    EXPECT(d.page_sizes == 4096);

    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    EXPECT_OK(memplug_host_mechanism_info(mech, &info));
    EXPECT((info.capabilities & MEMPLUG_CAP_TYPED_EXPORT) != 0);
    EXPECT((info.capabilities & MEMPLUG_CAP_SHARED_EXPORT) != 0);

    memset(&id, 0, sizeof id);
    id.struct_size = sizeof id;
    EXPECT_OK(memplug_host_mechanism_identity(mech, &id));
    EXPECT(id.valid == MEMPLUG_IDENTITY_NUMA_NODE);
    EXPECT(id.numa_node == 0);

    /* Short and NULL out-structs: refused, untouched. */
    memset(&d, 0, sizeof d);
    d.struct_size = 8;
    EXPECT_STATUS(memplug_host_mechanism_descriptor(mech, &d), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_MESSAGE("MemplugHostDescriptor: struct_size is 8");
    EXPECT(d.struct_size == 8 && d.attributes == 0);
    memset(&id, 0, sizeof id);
    id.struct_size = 4;
    EXPECT_STATUS(memplug_host_mechanism_identity(mech, &id), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT(id.struct_size == 4 && id.valid == 0);
    EXPECT_STATUS(memplug_host_mechanism_descriptor(mech, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_mechanism_identity(mech, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
}

static void selection(MemplugHostManager m) {
    MemplugHostMechanism found = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostMemoryNeeds n;
    MemplugHostDescriptor d;

    n = needs(MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_HOST_COHERENT, MEMPLUG_LOCATION_HOST, 0, 4096);
    EXPECT_OK(memplug_host_manager_select_needing(m, cpu(0), MEMPLUG_CAP_SHARED_MAPPING, &n, &found));
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    EXPECT_OK(memplug_host_mechanism_descriptor(found, &d));
    EXPECT(d.attributes == CPU_ATTRIBUTES);
    EXPECT_OK(memplug_host_mechanism_release(found));
    found.id = 0;
    EXPECT_OK(memplug_host_manager_select_needing(m, cpu(0), 0, NULL, &found));
    EXPECT_OK(memplug_host_mechanism_release(found));
    found.id = 0;

    n = needs(MEMPLUG_ATTR_PINNED, MEMPLUG_LOCATION_ANY, 0, 0);
    EXPECT_STATUS(memplug_host_manager_select_needing(m, cpu(0), 0, &n, &found), MEMPLUG_HOST_STATUS_UNSUPPORTED);
    EXPECT_MESSAGE("attributes 0x8");
    /* A node and a page size no mechanism of cpu:0 has (the CPU plugin's
     * node-0 and 2 MiB mechanisms serve node 0 and 2 MiB where the machine
     * has them). */
    n = needs(0, MEMPLUG_LOCATION_NUMA_NODE, 7, 0);
    EXPECT_STATUS(memplug_host_manager_select_needing(m, cpu(0), 0, &n, &found), MEMPLUG_HOST_STATUS_UNSUPPORTED);
    EXPECT_MESSAGE("location 3:7 (it has 2:0)");
    n = needs(0, MEMPLUG_LOCATION_ANY, 0, GIB1);
    EXPECT_STATUS(memplug_host_manager_select_needing(m, cpu(0), 0, &n, &found), MEMPLUG_HOST_STATUS_UNSUPPORTED);
    EXPECT_MESSAGE("page size 0x40000000");
    n = needs(0, MEMPLUG_LOCATION_ANY, 0, 0);
    EXPECT_STATUS(memplug_host_manager_select_needing(m, cpu(9), 0, &n, &found), MEMPLUG_HOST_STATUS_NOT_FOUND);

    n = needs(1u << 20, MEMPLUG_LOCATION_ANY, 0, 0);
    EXPECT_STATUS(memplug_host_manager_select_needing(m, cpu(0), 0, &n, &found),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    n = needs(0, 42, 0, 0);
    EXPECT_STATUS(memplug_host_manager_select_needing(m, cpu(0), 0, &n, &found),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    n = needs(0, MEMPLUG_LOCATION_ANY, 0, 12288);
    EXPECT_STATUS(memplug_host_manager_select_needing(m, cpu(0), 0, &n, &found),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    n = needs(0, MEMPLUG_LOCATION_ANY, 0, 0);
    n.struct_size = 4;
    EXPECT_STATUS(memplug_host_manager_select_needing(m, cpu(0), 0, &n, &found),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(memplug_host_manager_select_needing(m, cpu(0), 0, NULL, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT(found.id == 0);
}

static void placement(MemplugHostManager m, MemplugHostMechanism mech) {
    MemplugHostPool pool = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBinding b = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostAllocation a = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostPrefix p = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBindingOptions o;
    struct {
        struct binding_options_1_0 o;
        uint64_t after[3];
    } old;
    uint64_t addr = 0;

    EXPECT_OK(memplug_host_pool_create(m, "cpu0", 16u << 20, &pool));

    /* What the CPU plugin can do. */
    o = options(MEMPLUG_HOST_CLASS_KV);
    o.hints = MEMPLUG_HINT_UNINITIALIZED_OK;
    o.page_size = 4096;
    o.export_types = MEMPLUG_HANDLE_MEMFD;
    o.location_kind = MEMPLUG_LOCATION_HOST;
    EXPECT_OK(memplug_host_binding_create(m, mech, pool, &o, &b));
    EXPECT_OK(memplug_host_allocate(b, 8192, 64, &a, &addr));
    EXPECT(addr != 0);
    EXPECT_OK(memplug_host_allocation_free(a));
    EXPECT_OK(memplug_host_prefix_create(b, 8192, NULL, NULL, &p));
    EXPECT_OK(memplug_host_prefix_release(p));
    EXPECT_OK(memplug_host_binding_destroy(b));

    /* What it cannot: refused when memory is asked for. */
    o = options(MEMPLUG_HOST_CLASS_KV);
    o.page_size = MIB2;
    b.id = 0;
    EXPECT_OK(memplug_host_binding_create(m, mech, pool, &o, &b));
    a.id = 0;
    EXPECT_STATUS(memplug_host_allocate(b, 8192, 64, &a, NULL), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_MESSAGE("page size 0x200000");
    EXPECT(a.id == 0);
    EXPECT_OK(memplug_host_binding_destroy(b));
    o = options(MEMPLUG_HOST_CLASS_OTHER);
    o.export_types = MEMPLUG_HANDLE_DMABUF_FD;
    b.id = 0;
    EXPECT_OK(memplug_host_binding_create(m, mech, pool, &o, &b));
    EXPECT_STATUS(memplug_host_allocate(b, 8192, 64, &a, NULL), MEMPLUG_HOST_STATUS_UNSUPPORTED);
    p.id = 0;
    EXPECT_STATUS(memplug_host_prefix_create(b, 8192, NULL, NULL, &p), MEMPLUG_HOST_STATUS_UNSUPPORTED);
    EXPECT(p.id == 0);
    EXPECT_OK(memplug_host_binding_destroy(b));
    EXPECT(pool_used(pool) == 0);

    /* Malformed placement: refused at create. */
    b.id = 0;
    o = options(MEMPLUG_HOST_CLASS_OTHER);
    o.hints = 1u << 7;
    EXPECT_STATUS(memplug_host_binding_create(m, mech, pool, &o, &b), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_MESSAGE("unknown hint bits 0x80");
    o = options(MEMPLUG_HOST_CLASS_OTHER);
    o.export_types = 1u << 12;
    EXPECT_STATUS(memplug_host_binding_create(m, mech, pool, &o, &b), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    o = options(MEMPLUG_HOST_CLASS_OTHER);
    o.page_size = 4095;
    EXPECT_STATUS(memplug_host_binding_create(m, mech, pool, &o, &b), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    o = options(MEMPLUG_HOST_CLASS_OTHER);
    o.location_kind = MEMPLUG_LOCATION_TIER + 1;
    EXPECT_STATUS(memplug_host_binding_create(m, mech, pool, &o, &b), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    o = options(MEMPLUG_HOST_CLASS_OTHER);
    o.location_kind = MEMPLUG_LOCATION_DEVICE;
    o.location_id = 2;
    EXPECT_STATUS(memplug_host_binding_create(m, mech, pool, &o, &b), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT(b.id == 0);

    /* A caller built against API 1.0: its struct ends at wait_ns, and
     * what lies after it (here bytes that would be a placement the plugin
     * refuses, or malformed) is never read. */
    memset(&old, 0xff, sizeof old);
    old.o.struct_size = MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_0;
    old.o.alloc_class = MEMPLUG_HOST_CLASS_WEIGHTS;
    old.o.holder.id = 0;
    old.o.wait_ns = 0;
    EXPECT_OK(
        memplug_host_binding_create(m, mech, pool, (const MemplugHostBindingOptions *)(const void *)&old.o, &b));
    a.id = 0;
    EXPECT_OK(memplug_host_allocate(b, 8192, 64, &a, NULL));
    EXPECT(pool_used(pool) >= 8192);
    EXPECT_OK(memplug_host_allocation_free(a));
    EXPECT_OK(memplug_host_binding_destroy(b));
    EXPECT(pool_used(pool) == 0);
    EXPECT_OK(memplug_host_pool_release(pool));
}

int main(int argc, char **argv) {
    MemplugHostManager m = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostMechanism mech = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostVersion v;

    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH/TO/libmemplug_plugin_cpu.so\n", argv[0]);
        return 2;
    }
    EXPECT_OK(MEMPLUG_HOST_CHECK_API());
    memset(&v, 0, sizeof v);
    v.struct_size = sizeof v;
    EXPECT_OK(memplug_host_get_version(&v));
    EXPECT(v.api_major == 1 && v.api_minor >= 1);
    EXPECT(v.abi_max_minor >= 2);

    EXPECT_OK(memplug_host_manager_create(&m));
    EXPECT_OK(memplug_host_manager_load_plugin(m, argv[1]));
    EXPECT_OK(memplug_host_manager_find_mechanism(m, "memplug-cpu/cpu", &mech));

    descriptor_and_identity(mech);
    selection(m);
    placement(m, mech);

    EXPECT_OK(memplug_host_mechanism_release(mech));
    EXPECT_OK(memplug_host_manager_destroy(m));
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
