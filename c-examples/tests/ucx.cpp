// ucx.cpp: memory on the wire through memplug_ucx.hpp, between this process
// and a forked child over UCX's shared-memory transports (posix, cma;
// MEMPLUG_HOST_UCX_ERRORS_NONE, which shared memory needs) on the reference
// CPU plugin: the owner registers 2 MiB of a region read-only and offers
// it; the child pulls it into its own region in two halves, checks every
// byte, is refused a push into the read-only range (memplug::Error,
// INVALID_ARGUMENT) and releases it; the owner deregisters once the child
// has left, and both pools end at zero. Allocations too: the owner
// registers a 1 MiB allocation read-write, offers it and closes it at once
// (it stays charged while registered); the child pulls it into an
// allocation of its own, checks every byte, is refused a pull past its
// end, pushes a changed page back, which the owner reads; after the
// deregistration the owner's allocation is freed. A part of an allocation
// registers (a part past its end is refused), and the child pulls the
// allocation into a cached block of a caching binding (memplug::Cache),
// registered too, and pushes the changed page back from it. Skipped
// (exit 77, with the reason) when UCX is not installed.
//
//   ucx_cpp PATH/TO/libmemplug_plugin_cpu.so
#include "memplug_ucx.hpp"

#include "expect.hpp"

#include <chrono>
#include <cstring>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

constexpr uint64_t MIB = 1024 * 1024;
constexpr std::chrono::seconds WAIT{20};
constexpr const char *SETTINGS = "TLS=posix,cma,self";

uint8_t byte_at(uint64_t i) { return static_cast<uint8_t>((i * 7u + 3u) & 0xffu); }
uint8_t *bytes(const memplug::Region &r) { return reinterpret_cast<uint8_t *>(static_cast<uintptr_t>(r.addr())); }
uint8_t alloc_byte(uint64_t i) { return static_cast<uint8_t>((i * 13u + 1u) & 0xffu); }

// Runs the deferred frees until the pool uses `want` (or 10 s pass).
uint64_t poll_until(const memplug::Manager &m, const memplug::Pool &pool, uint64_t want) {
    for (int i = 0; i < 10000 && pool.stats().used != want; i++) {
        m.poll();
        if (pool.stats().used != want) usleep(1000);
    }
    return pool.stats().used;
}

void owner(const char *plugin, int fd) {
    memplug::Manager m = memplug::Manager::create();
    m.load_plugin(plugin);
    memplug::Mechanism mech = m.find_mechanism("memplug-cpu/cpu");
    memplug::Pool pool = m.create_pool("owner", 8 * MIB);
    memplug::Binding b = m.bind(mech, pool);
    memplug::Region region = b.reserve(4 * MIB);
    region.grow(2 * MIB);
    uint8_t *p = bytes(region);
    for (uint64_t i = 0; i < 2 * MIB; i++) p[i] = byte_at(i);
    memplug::Allocation alloc = b.allocate(MIB, 4096);
    uint8_t *q = alloc.data<uint8_t>();
    for (uint64_t i = 0; i < MIB; i++) q[i] = alloc_byte(i);
    {
        memplug::Ucx ucx(SETTINGS);
        memplug::UcxRegistration reg(ucx, mech, region, 0, 2 * MIB, MEMPLUG_HOST_UCX_ACCESS_READ);
        memplug::UcxRegistration areg(ucx, mech, alloc, MEMPLUG_HOST_UCX_ACCESS_READ_WRITE);
        EXPECT(areg.get().id != 0);
        {
            memplug::UcxRegistration part(ucx, mech, alloc, 4096, 8192, MEMPLUG_HOST_UCX_ACCESS_READ);
            EXPECT(part.get().id != 0);
            std::string why = EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT,
                                           memplug::UcxRegistration(ucx, mech, alloc, MIB, 1, MEMPLUG_HOST_UCX_ACCESS_READ));
            EXPECT(why.find("not inside the allocation") != std::string::npos);
            part.deregister();
        }
        memplug::UcxPeer peer(ucx, fd, MEMPLUG_HOST_UCX_ERRORS_NONE, WAIT);
        peer.offer(reg, 3);
        peer.offer(areg, 4);
        // Closed while registered: the bytes stay (the child reads and
        // writes them) and stay charged.
        alloc.close();
        m.poll();
        EXPECT(pool.stats().used == 3 * MIB);
        EXPECT_ERROR(MEMPLUG_HOST_STATUS_BUSY, reg.deregister());
        // Shared-memory gets of this memory are served by this worker.
        EXPECT(peer.serve(WAIT));
        bool pushed = true;
        for (uint64_t i = 0; i < MIB; i++) {
            uint8_t want = i < 4096 ? static_cast<uint8_t>(~alloc_byte(i)) : alloc_byte(i);
            pushed = pushed && q[i] == want;
        }
        EXPECT(pushed);
        reg.deregister();
        EXPECT(!reg);
        EXPECT(pool.stats().used == 3 * MIB);
        areg.deregister();
        EXPECT(poll_until(m, pool, 2 * MIB) == 2 * MIB); // the allocation, freed once deregistered
    }
    region.close();
    EXPECT(pool.stats().used == 0);
}

void puller(const char *plugin, int fd) {
    memplug::Manager m = memplug::Manager::create();
    m.load_plugin(plugin);
    memplug::Mechanism mech = m.find_mechanism("memplug-cpu/cpu");
    memplug::Pool pool = m.create_pool("puller", 8 * MIB);
    memplug::Binding b = m.bind(mech, pool);
    memplug::Region region = b.reserve(4 * MIB);
    {
        memplug::Ucx ucx(SETTINGS);
        memplug::UcxPeer peer(ucx, fd, MEMPLUG_HOST_UCX_ERRORS_NONE, WAIT);
        MemplugHostUcxRemoteRange r = peer.next_offer(WAIT);
        EXPECT(r.len == 2 * MIB && r.tag == 3 && r.writable == 0);
        memplug::UcxTransfer a = peer.pull_into(region, 0, r, 0, MIB);
        memplug::UcxTransfer c = peer.pull_into(region, MIB, r, MIB, MIB);
        a.wait(WAIT);
        c.wait(WAIT);
        EXPECT(pool.stats().used == 2 * MIB);
        const uint8_t *p = bytes(region);
        bool same = true;
        for (uint64_t i = 0; i < 2 * MIB; i++) same = same && p[i] == byte_at(i);
        EXPECT(same);
        std::string why = EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT, peer.push_from(region, 0, r, 0, 64));
        EXPECT(why.find("read-only") != std::string::npos);
        peer.release(r, WAIT);

        MemplugHostUcxRemoteRange ar = peer.next_offer(WAIT);
        EXPECT(ar.len == MIB && ar.tag == 4 && ar.writable == 1);
        memplug::Allocation mine = b.allocate(MIB, 4096);
        EXPECT(pool.stats().used == 3 * MIB);
        why = EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT, peer.pull_into(mine, 4096, ar, 0, MIB));
        EXPECT(why.find("not inside the allocation") != std::string::npos);
        peer.pull_into(mine, 0, ar, 0, MIB).wait(WAIT);
        uint8_t *q = mine.data<uint8_t>();
        same = true;
        for (uint64_t i = 0; i < MIB; i++) same = same && q[i] == alloc_byte(i);
        EXPECT(same);
        mine.close();
        // The same into a cached block of a caching binding.
        memplug::Cache cache = memplug::Cache::create(m, mech, pool);
        memplug::CachedAllocation block = cache.allocate(MIB, 4096);
        {
            memplug::UcxRegistration breg(ucx, mech, block, MEMPLUG_HOST_UCX_ACCESS_READ);
            memplug::UcxRegistration bpart(ucx, mech, block, 0, 4096, MEMPLUG_HOST_UCX_ACCESS_READ);
            EXPECT(breg.get().id != 0 && bpart.get().id != 0);
        }
        why = EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT, peer.pull_into(block, 1, ar, 0, MIB));
        EXPECT(why.find("not inside the allocation") != std::string::npos);
        peer.pull_into(block, 0, ar, 0, MIB).wait(WAIT);
        q = block.data<uint8_t>();
        same = true;
        for (uint64_t i = 0; i < MIB; i++) same = same && q[i] == alloc_byte(i);
        EXPECT(same);
        for (uint64_t i = 0; i < 4096; i++) q[i] = static_cast<uint8_t>(~q[i]);
        peer.push_from(block, 0, ar, 0, 4096).wait(WAIT);
        peer.release(ar, WAIT);
        block.close();
        cache.trim();
        EXPECT(pool.stats().used == 2 * MIB);
    }
    region.close();
    EXPECT(pool.stats().used == 0);
}

} // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s PATH/TO/libmemplug_plugin_cpu.so\n", argv[0]);
        return 2;
    }
    std::string why;
    if (!memplug::ucx_available(&why)) {
        std::printf("SKIP: UCX is not usable here: %s\n", why.c_str());
        return 77;
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        std::perror("socketpair");
        return 1;
    }
    std::fflush(nullptr);
    pid_t child = fork();
    if (child < 0) return 1;
    bool is_child = child == 0;
    try {
        if (is_child) {
            close(sv[0]);
            puller(argv[1], sv[1]);
        } else {
            close(sv[1]);
            owner(argv[1], sv[0]);
        }
    } catch (const memplug::Error &e) {
        std::fprintf(stderr, "FAIL (%s): %s (%s)\n", is_child ? "child" : "owner", e.what(), e.code_name());
        failed++;
    }
    if (is_child) {
        std::printf("child: %d passed, %d failed\n", passed, failed);
        std::fflush(nullptr);
        _exit(failed == 0 ? 0 : 1);
    }
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "FAIL: the child failed (status %d)\n", status);
        failed++;
    }
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
