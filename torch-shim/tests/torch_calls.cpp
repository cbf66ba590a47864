// Calls the shim the way PyTorch's CUDAPluggableAllocator does: the
// library opened with dlopen, its functions looked up by name and held in
// std::function objects, called from C++ that can take an exception. A
// refused allocation must arrive as an exception: torch uses the returned
// pointer without checking it. Exit status 0 and "ok" on stdout when every
// expectation held; the failing step's number otherwise.

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <stdexcept>

using AllocFn = void *(*)(std::size_t, int, void *);
using FreeFn = void (*)(void *, std::size_t, int, void *);

template <typename F> static F symbol(void *lib, const char *name) {
    void *s = dlsym(lib, name);
    F f = nullptr;
    std::memcpy(&f, &s, sizeof f);
    return f;
}

// Expects `alloc(size, device)` to throw a std::runtime_error; prints its text.
static bool throws(const std::function<void *(std::size_t, int, void *)> &alloc, std::size_t size, int device) {
    try {
        void *p = alloc(size, device, nullptr);
        std::fprintf(stderr, "alloc(%zu, %d) returned %p instead of throwing\n", size, device, p);
        return false;
    } catch (const std::runtime_error &e) {
        std::printf("refused: %s\n", e.what());
        return true;
    } catch (...) {
        std::fprintf(stderr, "alloc(%zu, %d) threw something that is not a std::runtime_error\n", size, device);
        return false;
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
        std::fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    std::function<void *(std::size_t, int, void *)> alloc = symbol<AllocFn>(lib, "memplug_torch_alloc");
    std::function<void(void *, std::size_t, int, void *)> free = symbol<FreeFn>(lib, "memplug_torch_free");
    void *p = alloc(1 << 20, 0, nullptr);
    if (p == nullptr) {
        return 3;
    }
    free(p, 1 << 20, 0, nullptr);
    if (!throws(alloc, std::size_t(1) << 40, 0)) { // over the pool's budget
        return 4;
    }
    if (!throws(alloc, 4096, 7)) { // a device the plugin does not serve
        return 5;
    }
    if (alloc(0, 0, nullptr) != nullptr) { // size 0: NULL, no exception
        return 6;
    }
    p = alloc(4096, 0, nullptr); // refusals changed nothing
    if (p == nullptr) {
        return 7;
    }
    free(p, 4096, 0, nullptr);
    std::printf("ok\n");
    return 0;
}
