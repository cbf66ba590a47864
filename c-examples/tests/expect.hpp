// expect.hpp: the checks the C++ tests of the host API share. Each test is
// one program: these count into its own `passed` and `failed`, print each
// failure with its line, and main reports both counts.
#ifndef MEMPLUG_CPP_TESTS_EXPECT_HPP
#define MEMPLUG_CPP_TESTS_EXPECT_HPP

#include "memplug.hpp"

#include <cstdio>
#include <string>

namespace {

int passed = 0, failed = 0;

inline void expect(bool cond, const char *what, int line) {
    if (cond) {
        passed++;
    } else {
        std::fprintf(stderr, "FAIL line %d: %s\n", line, what);
        failed++;
    }
}
#define EXPECT(cond) expect((cond), #cond, __LINE__)

/// Runs `f`, which must throw memplug::Error with `code`; returns its message.
template <class F> std::string expect_error(F f, MemplugHostStatus code, int line) {
    try {
        f();
    } catch (const memplug::Error &e) {
        expect(e.code() == code, e.what(), line);
        return e.what();
    } catch (...) {
        expect(false, "another exception", line);
        return {};
    }
    expect(false, "no exception", line);
    return {};
}
#define EXPECT_ERROR(code, ...) expect_error([&] { __VA_ARGS__; }, (code), __LINE__)

} // namespace

#endif
