// export_sync_peer.cpp: more of C API 1.1 through memplug.hpp, against the
// reference CPU plugin (plugin ABI 1.2): Prefix::export_handle (an RAII
// ExportedHandle owning a memfd) and Binding::import_prefix into another
// pool, mapped into a region (the same bytes, each pool charged once, both
// back to 0); an unoffered kind is UNSUPPORTED; Stream::wait_fence (a
// stream ordered behind another stream's fence is not complete while the
// first is held); Mechanism::can_access_peer and Region::set_peer_access
// (UNSUPPORTED on the CPU plugin, which has no peer access),
// Region::grow_on (UNSUPPORTED without queued binding, the region and the
// pool's charge unchanged; with it, charged at once and its fence completes) and Mechanism::adopt_stream (UNSUPPORTED: the
// CPU plugin adopts no native stream); Stream::copy (plugin ABI 1.3: ordered
// after a host function that writes the source, overlap refused) and
// Mechanism::copy_kinds — every failure a memplug::Error with its status.
//
//   export_sync_peer_cpp PATH/TO/libmemplug_plugin_cpu.so
//
// Prints "N passed, N failed" and exits non-zero on any failure.
#include "memplug.hpp"

#include "expect.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

namespace {


bool contains(const std::string &s, const char *part) { return s.find(part) != std::string::npos; }

uint8_t pattern(uint64_t i) { return static_cast<uint8_t>((i % 251u) ^ 0x5au); }

bool fd_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

void typed_export(memplug::Manager &m, const memplug::Mechanism &mech) {
    memplug::Pool pa = m.create_pool("exporter", 64u << 20);
    memplug::Pool pb = m.create_pool("importer", 64u << 20);
    {
        memplug::Binding ba = m.bind(mech, pa, memplug::BindingOptions{}.with_export_types(MEMPLUG_HANDLE_MEMFD));
        memplug::Binding bb = m.bind(mech, pb);
        memplug::Prefix prefix = ba.create_prefix(8192, [](uint64_t addr, uint64_t len) {
            auto *p = reinterpret_cast<uint8_t *>(static_cast<uintptr_t>(addr));
            for (uint64_t i = 0; i < len; i++) p[i] = pattern(i);
        });
        const uint64_t len = prefix.info().len;
        EXPECT(pa.stats().used == len && pb.stats().used == 0);

        int fd = -1;
        memplug::Prefix imported;
        {
            memplug::ExportedHandle h = prefix.export_handle(MEMPLUG_HANDLE_MEMFD);
            EXPECT(h && h.kind() == MEMPLUG_HANDLE_MEMFD && h.fd() > 2);
            fd = h.fd();
            imported = bb.import_prefix(h, len);
            EXPECT(imported.info().charged == len);
            EXPECT(pa.stats().used == len && pb.stats().used == len);
            // Moved: the new owner closes it, the old one nothing.
            memplug::ExportedHandle moved = std::move(h);
            EXPECT(!h && moved.fd() == fd);
        }
        EXPECT(!fd_open(fd)); // closed by the destructor

        memplug::Region r = bb.reserve(4 * len);
        r.map_prefix(imported);
        const auto *bytes = reinterpret_cast<const uint8_t *>(static_cast<uintptr_t>(r.addr()));
        bool same = true;
        for (uint64_t i = 0; i < len; i++) same = same && bytes[i] == pattern(i);
        EXPECT(same);
        EXPECT(r.info().prefix_len == len);
        EXPECT(pa.stats().used == len && pb.stats().used == len);

        EXPECT_ERROR(MEMPLUG_HOST_STATUS_UNSUPPORTED, prefix.export_handle(MEMPLUG_HANDLE_DMABUF_FD));
        std::string e = EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT, prefix.export_handle(3));
        EXPECT(contains(e, "not one MEMPLUG_HANDLE_* bit"));
        EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT, bb.import_prefix(memplug::ExportedHandle{}, len));

        // release() hands the C struct over without closing.
        MemplugHostHandle raw = prefix.export_handle(MEMPLUG_HANDLE_MEMFD).release();
        EXPECT(fd_open(raw.fd));
        EXPECT(::close(raw.fd) == 0);
    }
    // Regions, prefixes, bindings gone: each pool refunded once.
    EXPECT(pa.stats().used == 0 && pb.stats().used == 0);
}

void stream_wait(memplug::Manager &m, const memplug::Mechanism &mech) {
    memplug::Stream a = mech.create_stream();
    memplug::Stream b = mech.create_stream();
    std::mutex mu;
    std::condition_variable cv;
    bool entered = false, open = false, ran = false;
    a.enqueue([&] {
        std::unique_lock<std::mutex> l(mu);
        entered = true;
        cv.notify_all();
        cv.wait(l, [&] { return open; });
    });
    {
        memplug::Fence fa = a.record();
        b.wait_fence(fa);
    } // the wait keeps its own reference
    b.enqueue([&] {
        std::lock_guard<std::mutex> l(mu);
        ran = true;
    });
    memplug::Fence fb = b.record();
    {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return entered; });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    bool done = true;
    memplug::check(memplug_host_fence_query(fb.get(), &done));
    EXPECT(!done);
    {
        std::lock_guard<std::mutex> l(mu);
        EXPECT(!ran);
        open = true;
    }
    cv.notify_all();
    memplug::check(memplug_host_fence_wait(fb.get(), 10ull * 1000 * 1000 * 1000, &done));
    EXPECT(done);
    {
        std::lock_guard<std::mutex> l(mu);
        EXPECT(ran);
    }
    memplug::Fence rf = m.fence_from_query("runtime", [] { return true; });
    std::string e = EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT, b.wait_fence(rf));
    EXPECT(contains(e, "memplug_host_fence_from_callbacks"));
}

void peer(memplug::Manager &m, const memplug::Mechanism &mech) {
    EXPECT(!mech.peer_access());
    MemplugDevice cpu1{};
    cpu1.kind = MEMPLUG_DEVICE_CPU;
    cpu1.ordinal = 1;
    std::string e = EXPECT_ERROR(MEMPLUG_HOST_STATUS_UNSUPPORTED, mech.can_access_peer(cpu1));
    EXPECT(contains(e, "no peer access (MEMPLUG_CAP_PEER_ACCESS"));

    memplug::Pool pool = m.create_pool("peer", 64u << 20);
    {
        memplug::Binding b = m.bind(mech, pool);
        memplug::Region r = b.reserve(1u << 20);
        r.grow(64u << 10);
        const MemplugHostRegionInfo before = r.info();
        const uint64_t charged = pool.stats().used;
        EXPECT(before.committed >= (64u << 10) && charged == before.committed);
        e = EXPECT_ERROR(MEMPLUG_HOST_STATUS_UNSUPPORTED, r.set_peer_access(0, 4096, cpu1, MEMPLUG_ACCESS_READ));
        EXPECT(contains(e, "no peer access (MEMPLUG_CAP_PEER_ACCESS"));
        memplug::Stream s = mech.create_stream();
        if ((mech.info().capabilities & MEMPLUG_CAP_QUEUED_BINDING) == 0) {
            e = EXPECT_ERROR(MEMPLUG_HOST_STATUS_UNSUPPORTED, r.grow_on(1u << 20, s));
            EXPECT(contains(e, "no queued binding (MEMPLUG_CAP_QUEUED_BINDING"));
            EXPECT(r.info().len == before.len && r.info().committed == before.committed);
            EXPECT(pool.stats().used == charged);
        } else {
            memplug::Fence f = r.grow_on(1u << 20, s);
            EXPECT(r.info().committed == (1u << 20) && pool.stats().used == (1u << 20));
            EXPECT(f.wait(std::chrono::seconds(10)));
        }
        int native = 0;
        e = EXPECT_ERROR(MEMPLUG_HOST_STATUS_UNSUPPORTED, mech.adopt_stream(MEMPLUG_DEVICE_CUDA, &native));
        EXPECT(contains(e, "stream_adopt_typed"));
    }
    m.poll(); // a free behind a queued commit's fence retires here
    EXPECT(pool.stats().used == 0);
}

/// Plugin ABI 1.3's copy through Stream::copy: ordered after a host
/// function that writes the source; overlap refused.
void stream_copy(memplug::Manager &m, const memplug::Mechanism &mech) {
    EXPECT((mech.copy_kinds() & MEMPLUG_COPY_HOST) != 0);
    memplug::Pool pool = m.create_pool("copy", 1 << 20);
    memplug::Binding b = m.bind(mech, pool);
    memplug::Allocation src = b.allocate(4096, 64), dst = b.allocate(4096, 64);
    std::memset(src.data<char>(), 1, 4096);
    std::memset(dst.data<char>(), 0, 4096);
    memplug::Stream s = mech.create_stream();
    char *from = src.data<char>();
    s.enqueue([from] { std::memset(from, 7, 4096); });
    s.copy(dst.addr(), src.addr(), 4096);
    EXPECT(s.record().wait(std::chrono::seconds(10)));
    EXPECT(dst.data<char>()[0] == 7 && dst.data<char>()[4095] == 7);
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT, s.copy(src.addr() + 8, src.addr(), 64));
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
        typed_export(m, mech);
        stream_wait(m, mech);
        peer(m, mech);
        stream_copy(m, mech);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "FAIL: uncaught %s\n", e.what());
        failed++;
    }
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
