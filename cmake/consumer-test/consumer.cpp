// Consumer of an installed memplug through memplug.hpp, linked statically.
#include <memplug.hpp>
#include <cstdio>

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    try {
        auto m = memplug::Manager::create();
        m.load_plugin(argv[1]);
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
