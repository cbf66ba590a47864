// Consumer of an installed memplug through memplug.hpp, linked statically;
// loads the installed CPU plugin (MEMPLUG_CONSUMER_PLUGIN, from the
// package's plugin directory).
#include <memplug.hpp>
#include <cstdio>

int main() {
    try {
        auto m = memplug::Manager::create();
        m.load_plugin(MEMPLUG_CONSUMER_PLUGIN);
        auto mech = m.find_mechanism("cpu");
        auto pool = m.create_pool("p", 1 << 20);
        auto b = m.bind(mech, pool);
        auto a = b.allocate(4096, 64);
        std::printf("consumer (static, C++): allocated 4096 bytes at %#llx\n",
                    static_cast<unsigned long long>(a.addr()));
    } catch (const memplug::Error &e) {
        std::fprintf(stderr, "consumer: %s\n", e.what());
        return 1;
    }
    return 0;
}
