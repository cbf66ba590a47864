// kv_cache.cpp: a C++ runtime embedding the memplug host through
// memplug.hpp (header-only RAII over the C API).
//
//   kv_cache_cpp PATH/TO/libmemplug_plugin_cpu.so
//
// Same story as the C example: a budget, a KV cache that answers pressure
// by evicting blocks, a shared prompt prefix mapped into a growing KV
// region, and a free ordered after in-flight stream work. Errors are
// exceptions carrying the status code and message.
#include "memplug.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <thread>

namespace {

constexpr uint64_t MiB = 1024 * 1024;

#define EXPECT(cond)                                                                               \
    do {                                                                                           \
        if (!(cond)) throw std::runtime_error("expectation failed: " #cond);                       \
    } while (0)

void run(const char *plugin) {
    using namespace std::chrono_literals;
    auto m = memplug::Manager::create();
    m.load_plugin(plugin);
    auto mech = m.select(MemplugDevice{MEMPLUG_DEVICE_CPU, 0},
                         MEMPLUG_CAP_VIRTUAL_BACKING | MEMPLUG_CAP_SHARED_MAPPING | MEMPLUG_CAP_SYNC);
    auto info = mech.info();
    std::printf("mechanism %s/%s, granularity %llu\n", info.plugin_name, info.name,
                static_cast<unsigned long long>(info.granularity));

    auto pool = m.create_pool("host-memory", 32 * MiB);

    // The KV cache keeps fixed-size blocks; under pressure it frees the
    // oldest ones and answers with the bytes released.
    std::deque<memplug::Allocation> blocks;
    auto holder = pool.register_holder("kv-blocks", MEMPLUG_HOST_PRIORITY_LOWEST,
                                       [&](const MemplugHostPressureTicket &t) -> uint64_t {
                                           uint64_t freed = 0;
                                           while (freed < t.bytes_wanted && !blocks.empty()) {
                                               freed += blocks.front().info().size;
                                               blocks.pop_front(); // the destructor frees
                                           }
                                           std::printf("  ticket for %llu bytes: evicted %llu bytes\n",
                                                       static_cast<unsigned long long>(t.bytes_wanted),
                                                       static_cast<unsigned long long>(freed));
                                           return freed;
                                       });
    memplug::BindingOptions kv_opts;
    kv_opts.alloc_class = MEMPLUG_HOST_CLASS_KV;
    kv_opts.holder = &holder;
    auto kv = m.bind(mech, pool, kv_opts);
    auto weights = m.bind(mech, pool);

    // A shared prompt prefix mapped into a KV region that grows in place.
    const char prompt[] = "System: be concise.";
    auto prefix = kv.create_prefix(64 * 1024, [&](uint64_t addr, uint64_t) {
        std::memcpy(reinterpret_cast<char *>(static_cast<uintptr_t>(addr)), prompt, sizeof prompt);
    });
    auto region = kv.reserve(16 * MiB);
    region.map_prefix(prefix);
    const uint64_t base = region.addr();
    EXPECT(std::strcmp(reinterpret_cast<const char *>(static_cast<uintptr_t>(base)), prompt) == 0);
    for (uint64_t len : {2 * MiB, 4 * MiB, 8 * MiB}) {
        region.grow(len, [&](uint64_t addr, uint64_t view) {
            std::printf("  region view: %llu bytes at %#llx\n", static_cast<unsigned long long>(view),
                        static_cast<unsigned long long>(addr));
            return addr == base;
        });
    }
    EXPECT(region.addr() == base);

    // A refused update leaves the region as it was, and throws.
    try {
        region.grow(12 * MiB, [](uint64_t, uint64_t) { return false; });
        EXPECT(false);
    } catch (const memplug::Error &e) {
        EXPECT(e.code() == MEMPLUG_HOST_STATUS_CALLBACK_REFUSED);
        std::printf("refused grow: %s\n", e.code_name());
    }

    // KV blocks fill most of what is left.
    for (int i = 0; i < 20; i++) blocks.push_back(kv.allocate(1 * MiB, 64));
    std::printf("used %llu of %llu bytes\n", static_cast<unsigned long long>(pool.stats().used),
                static_cast<unsigned long long>(pool.stats().capacity));

    // A free ordered after in-flight work on a plugin stream.
    auto stream = mech.create_stream();
    auto scratch = weights.allocate(1 * MiB, 4096);
    auto *bytes = scratch.data<unsigned char>();
    stream.enqueue([bytes] {
        std::this_thread::sleep_for(20ms);
        std::memset(bytes, 0x42, 1 * MiB);
    });
    auto fence = stream.record();
    scratch.free_after({&fence});
    EXPECT(m.poll().pending == 1);
    EXPECT(fence.wait(5s));
    EXPECT(m.poll().pending == 0);
    std::printf("scratch freed after its fence\n");

    // Weights that only fit once the KV cache evicts.
    auto w = weights.allocate(8 * MiB, 4096);
    auto hs = holder.stats();
    std::printf("weights loaded; kv-blocks answered %llu bytes in %llu ticket(s), %zu blocks left\n",
                static_cast<unsigned long long>(hs.bytes_answered), static_cast<unsigned long long>(hs.tickets),
                blocks.size());
    EXPECT(hs.tickets >= 1 && hs.nonsense_answers == 0);

    // Errors carry their code.
    try {
        weights.allocate(1ull << 40);
        EXPECT(false);
    } catch (const memplug::Error &e) {
        EXPECT(e.code() == MEMPLUG_HOST_STATUS_OUT_OF_BUDGET);
        std::printf("1 TiB refused: %s\n", e.code_name());
    }

    blocks.clear();
    w.close();
    region.close();
    prefix.reset();
    EXPECT(pool.stats().used == 0);
    std::printf("done: every byte returned\n");
}

} // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s PATH/TO/libmemplug_plugin_cpu.so\n", argv[0]);
        return 2;
    }
    try {
        run(argv[1]);
    } catch (const memplug::Error &e) {
        std::fprintf(stderr, "kv_cache_cpp: %s\n", e.what());
        return 1;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "kv_cache_cpp: %s\n", e.what());
        return 1;
    }
    return 0;
}
