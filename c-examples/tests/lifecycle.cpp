// lifecycle.cpp: mechanism lives through memplug.hpp (and so through the C
// API): an RAII subscription told LOST (with its loss notice) when the
// runtime declares the reference CPU plugin's context lost, then
// TERMINATED with a settlement of exactly the bytes allocated; new work
// refused with DEVICE_LOST; handles destroyed afterwards without a second
// refund; replacement by the C example plugin's mechanism (same device)
// routing a new binding, terminate refusing while an old object lives, the
// old plugin unloaded once its context terminated; a subscription
// destroyed from its own callback; an exception thrown by a callback
// contained at the C boundary.
//
//   lifecycle_cpp PATH/TO/libmemplug_plugin_cpu.so PATH/TO/libmemplug_example_plugin.so
//
// Prints "N passed, N failed" and exits non-zero on any failure.
#include "memplug.hpp"

#include "expect.hpp"

#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;


void declared_loss(const char *cpu_plugin) {
    auto m = memplug::Manager::create();
    m.load_plugin(cpu_plugin);
    auto mech = m.find_mechanism("memplug-cpu/cpu");
    auto pool = m.create_pool("gpu0", 16u << 20);
    auto holder = pool.register_holder("kv", 1, [](const MemplugHostPressureTicket &) { return uint64_t{0}; });
    memplug::BindingOptions opts;
    opts.alloc_class = MEMPLUG_HOST_CLASS_KV;
    opts.holder = &holder;
    auto binding = m.bind(mech, pool, opts);

    std::vector<memplug::LifecycleEvent> events;
    std::vector<std::thread::id> threads;
    MemplugHostStatus poll_inside = MEMPLUG_HOST_STATUS_OK;
    auto sub = mech.subscribe([&](const memplug::LifecycleEvent &e) {
        events.push_back(e);
        threads.push_back(std::this_thread::get_id());
        try {
            m.poll();
        } catch (const memplug::Error &err) {
            poll_inside = err.code();
        }
    });
    EXPECT(static_cast<bool>(sub));
    // A second subscriber whose callback throws: contained, the first still told.
    auto thrower = mech.subscribe([](const memplug::LifecycleEvent &) { throw std::runtime_error("oops"); });

    EXPECT(mech.state() == MEMPLUG_HOST_LIFE_STATE_ACTIVE);
    EXPECT(mech.reason().empty());
    EXPECT(!mech.settlement());

    std::vector<memplug::Allocation> made;
    uint64_t charged = 0;
    for (uint64_t size : {1000u, 5000u, 64u}) {
        made.push_back(binding.allocate(size, 64));
        charged += made.back().info().size;
    }
    EXPECT(pool.stats().used == charged);
    EXPECT(!made[0].is_lost());

    EXPECT(mech.declare_lost("ECC error on HBM stack 2"));
    EXPECT(!mech.declare_lost("again"));
    EXPECT(mech.state() == MEMPLUG_HOST_LIFE_STATE_LOST);
    EXPECT(mech.reason().find("ECC error on HBM stack 2") != std::string::npos);
    EXPECT(events.size() == 1);
    if (events.size() == 1) {
        const auto &e = events[0];
        EXPECT(e.from == MEMPLUG_HOST_LIFE_STATE_ACTIVE && e.to == MEMPLUG_HOST_LIFE_STATE_LOST);
        EXPECT(e.subscription.id == sub.get().id);
        EXPECT(e.context == "memplug-cpu/cpu");
        EXPECT(e.reason && e.reason->find("ECC error") != std::string::npos);
        EXPECT(!e.settlement);
        EXPECT(e.notices.size() == 1);
        if (e.notices.size() == 1) {
            const auto &n = e.notices[0];
            EXPECT(n.pool == "gpu0");
            EXPECT(n.holder_id == holder.id());
            EXPECT(n.alloc_class == MEMPLUG_HOST_CLASS_KV);
            EXPECT(n.objects == 3);
            EXPECT(n.bytes == charged);
            EXPECT(n.quarantined_bytes == 0);
        }
        EXPECT(threads[0] == std::this_thread::get_id());
    }
    EXPECT(poll_inside == MEMPLUG_HOST_STATUS_REENTRANT);
    EXPECT(std::strcmp(memplug::life_state_name(mech.state()), "MEMPLUG_HOST_LIFE_STATE_LOST") == 0);

    EXPECT_ERROR(MEMPLUG_HOST_STATUS_DEVICE_LOST, binding.allocate(64, 64));
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_DEVICE_LOST, m.bind(mech, pool));
    EXPECT(made[1].is_lost() && made[2].is_lost());
    EXPECT(pool.stats().used == charged);

    m.poll();
    EXPECT(mech.state() == MEMPLUG_HOST_LIFE_STATE_TERMINATED);
    EXPECT(events.size() == 2);
    if (events.size() == 2) {
        EXPECT(events[1].from == MEMPLUG_HOST_LIFE_STATE_LOST && events[1].to == MEMPLUG_HOST_LIFE_STATE_TERMINATED);
        EXPECT(events[1].settlement && events[1].settlement->bytes == charged);
        EXPECT(events[1].settlement && events[1].settlement->after_loss == 1);
        EXPECT(events[1].settlement && events[1].settlement->leases == 3);
    }
    auto settled = mech.settlement();
    EXPECT(settled && settled->bytes == charged && settled->bindings == 1);
    EXPECT(pool.stats().used == 0);

    made.clear(); // destroys the lost allocations: no plugin call, no refund
    EXPECT(pool.stats().used == 0);
    EXPECT(pool.stats().leased == 0);
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_STATE, m.terminate(mech, 0ns));
    m.poll();
    EXPECT(events.size() == 2);
}

void replacement(const char *cpu_plugin, const char *example_plugin) {
    auto m = memplug::Manager::create();
    m.load_plugin(cpu_plugin);
    m.load_plugin(example_plugin);
    // The example's one mechanism, and the CPU plugin's "cpu" with those of
    // its others this machine serves (NUMA node, 2 MiB pages).
    EXPECT(m.mechanism_count() >= 2);
    auto old_mech = m.find_mechanism("memplug-cpu/cpu");
    auto new_mech = m.find_mechanism("memplug-c-example/c-example");
    auto pool = m.create_pool("cpu0", 16u << 20);
    auto b_old = m.bind(old_mech, pool);
    auto kept = b_old.allocate(4096, 64);

    std::vector<memplug::LifecycleEvent> events;
    auto sub = old_mech.subscribe([&](const memplug::LifecycleEvent &e) { events.push_back(e); });

    EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT, m.replace(old_mech, old_mech, "itself"));
    m.replace(old_mech, new_mech, "driver upgrade", true);
    EXPECT(old_mech.state() == MEMPLUG_HOST_LIFE_STATE_RETIRING);
    EXPECT(events.size() == 1 && events[0].to == MEMPLUG_HOST_LIFE_STATE_RETIRING);
    EXPECT(events.size() == 1 && events[0].reason && events[0].reason->find("driver upgrade") != std::string::npos);
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_STATE, m.replace(old_mech, new_mech, "twice"));

    EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_STATE, b_old.allocate(64, 64));
    EXPECT(!kept.is_lost());
    auto b_new = m.bind(old_mech, pool); // made on the successor
    EXPECT(std::strcmp(b_new.mechanism_info().plugin_name, "memplug-c-example") == 0);
    EXPECT(std::strcmp(b_old.mechanism_info().plugin_name, "memplug-cpu") == 0);
    auto fresh = b_new.allocate(4096, 64);
    EXPECT(!fresh.is_lost());
    auto selected = m.select(MemplugDevice{MEMPLUG_DEVICE_CPU, 0}, 0);
    EXPECT(std::strcmp(selected.info().plugin_name, "memplug-c-example") == 0);

    auto msg = EXPECT_ERROR(MEMPLUG_HOST_STATUS_BUSY, m.terminate(old_mech, 10ms));
    EXPECT(msg.find("live object") != std::string::npos);
    m.poll();
    EXPECT(old_mech.state() == MEMPLUG_HOST_LIFE_STATE_RETIRING);
    kept.reset();
    m.poll();
    EXPECT(old_mech.state() == MEMPLUG_HOST_LIFE_STATE_TERMINATED);
    EXPECT(events.size() == 2 && events[1].settlement && events[1].settlement->after_loss == 0);
    EXPECT(events.size() == 2 && events[1].settlement && events[1].settlement->bytes == 0);
    EXPECT(m.mechanism_count() == 1); // the old plugin was unloaded

    // A subscription destroyed from its own callback; then never called again.
    int calls = 0;
    std::optional<memplug::Subscription> self;
    self.emplace(new_mech.subscribe([&](const memplug::LifecycleEvent &) {
        calls++;
        self.reset();
    }));
    new_mech.retire("maintenance");
    EXPECT(calls == 1);
    EXPECT(!self.has_value());
    EXPECT(new_mech.state() == MEMPLUG_HOST_LIFE_STATE_RETIRING);
    EXPECT_ERROR(MEMPLUG_HOST_STATUS_INVALID_STATE, m.bind(old_mech, pool)); // the chain has ended
    fresh.reset();
    auto s = m.terminate(new_mech, 1s);
    EXPECT(s.after_loss == 0 && s.bytes == 0);
    EXPECT(calls == 1);
    EXPECT(pool.stats().used == 0);
}

} // namespace

int main(int argc, char **argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s PATH/TO/libmemplug_plugin_cpu.so PATH/TO/libmemplug_example_plugin.so\n",
                     argv[0]);
        return 2;
    }
    try {
        declared_loss(argv[1]);
        replacement(argv[1], argv[2]);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "FAIL: unexpected exception: %s\n", e.what());
        failed++;
    }
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
