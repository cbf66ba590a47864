// node.cpp: one budget across processes through memplug_node.hpp (and so
// through the C API 1.3): an authority served by this program, two
// managers joined to it as two members; a lease past the held budget, a
// cross-member pressure ticket answered by a holder, the books exact in
// both formats, an authority restarted and rejoined, refusals as
// memplug::Error.
//
//   node_cpp PATH/TO/libmemplug_plugin_cpu.so
//
// Prints "N passed, N failed" and exits non-zero on any failure.
#include "memplug_node.hpp"

#include "expect.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

namespace {

constexpr uint64_t MiB = 1024 * 1024;

std::string socket_path(const char *tag) {
    const char *tmp = std::getenv("TMPDIR");
    std::string dir = (tmp != nullptr && std::string(tmp).size() <= 60) ? tmp : "/tmp";
    return dir + "/memplug-node-cpp-" + std::to_string(getpid()) + tag;
}

template <class F> bool eventually(F f) {
    for (int i = 0; i < 300; i++) {
        if (f()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return f();
}

void run(const char *plugin) {
    const std::string path = socket_path(".sock");
    auto m1 = memplug::Manager::create();
    auto m2 = memplug::Manager::create();
    m1.load_plugin(plugin);
    m2.load_plugin(plugin);
    auto c1 = m1.find_mechanism("memplug-cpu/cpu");
    auto c2 = m2.find_mechanism("memplug-cpu/cpu");

    auto ao = memplug::detail::sized<MemplugHostNodeAuthorityOptions>();
    ao.chunk = MiB;
    auto node = memplug::NodeAuthority::start(m1, path, {{"cpu0", 8 * MiB}}, ao);
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_ALREADY_EXISTS, memplug::NodeAuthority::start(m2, path, {{"cpu0", MiB}}));
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT, memplug::NodeAuthority::start(m2, socket_path(".x"), {}));

    // The first member: its holder frees blocks when the node asks.
    auto p1 = m1.create_pool("cpu0", 0);
    std::mutex mu;
    std::deque<memplug::Allocation> blocks;
    int tickets = 0;
    auto holder = p1.register_holder("blocks", 0, [&](const MemplugHostPressureTicket &t) -> uint64_t {
        std::lock_guard<std::mutex> g(mu);
        tickets++;
        uint64_t freed = 0;
        while (freed < t.bytes_wanted && !blocks.empty()) {
            freed += blocks.front().info().size;
            blocks.pop_front();
        }
        return freed;
    });
    auto b1 = m1.bind(c1, p1, memplug::BindingOptions{}.with_holder(holder).with_wait(std::chrono::seconds(2)));
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_CALLBACK_REFUSED, memplug::NodeLink::join(m1, path, {{"gpu9", &p1, 0}}));
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_NOT_FOUND, memplug::NodeLink::join(m1, socket_path(".none"), {{"cpu0", &p1, 0}}));
    // Its blocks are KV: only a KV request presses it.
    auto l1 = memplug::NodeLink::join(m1, path, {{"cpu0", &p1, 0, memplug::node_classes({MEMPLUG_HOST_CLASS_KV})}});
    EXPECT(l1.connected() && l1.stats().chunk == MiB && l1.last_error().empty());
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_ALREADY_EXISTS, memplug::NodeLink::join(m1, path, {{"cpu0", &p1, 0}}));
    {
        std::lock_guard<std::mutex> g(mu);
        for (int i = 0; i < 6; i++) blocks.push_back(b1.allocate(MiB));
    }
    EXPECT(l1.stats().used == 6 * MiB && l1.stats().leases_granted >= 1);

    // The second member presses the first through the node.
    auto p2 = m2.create_pool("cpu0", 0);
    auto b2 = m2.bind(c2, p2,
                      memplug::BindingOptions{}.with_class(MEMPLUG_HOST_CLASS_KV).with_wait(std::chrono::seconds(3)));
    auto l2 = memplug::NodeLink::join(m2, path, {{"cpu0", &p2, 5}});
    auto big = b2.allocate(5 * MiB);
    EXPECT(tickets >= 1);
    auto s1 = l1.stats();
    // What the holder freed is the ticket's answer, not idle budget.
    EXPECT(s1.tickets_answered >= 1 && s1.bytes_released >= 3 * MiB && s1.used <= 3 * MiB);
    EXPECT(node.status().find("\"books_exact\":true") != std::string::npos);
    EXPECT(node.status().find("\"classes\":{\"cpu0\":[\"kv\"]}") != std::string::npos);
    EXPECT(l2.status(true).find("memplug_node_capacity_bytes{device=\"cpu0\"} 8388608") != std::string::npos);
    EXPECT(node.status(true).find("memplug_node_tickets_total") != std::string::npos);

    // A restart: both links rejoin and the books count each byte once.
    node.close();
    EXPECT(eventually([&] { return !l1.connected(); }));
    node = memplug::NodeAuthority::start(m2, path, {{"cpu0", 8 * MiB}}, ao);
    EXPECT(eventually([&] { return l1.stats().joins == 2 && l2.stats().joins == 2; }));
    // The books hold what the links hold, once the messages in flight
    // (a Return of idle budget) have been read.
    EXPECT(eventually([&] {
        uint64_t held = l1.stats().held + l2.stats().held;
        return node.status().find("\"leased\":" + std::to_string(held)) != std::string::npos;
    }));
    EXPECT(node.status().find("\"books_exact\":true") != std::string::npos);

    big.reset();
    MemplugHostNodeLink gone = l2.get();
    l2.close();
    auto st = memplug::detail::sized<MemplugHostNodeLinkStats>();
    EXPECT(memplug_host_node_link_stats(gone, &st) == MEMPLUG_HOST_STATUS_STALE_HANDLE);
    std::lock_guard<std::mutex> g(mu);
    blocks.clear();
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
