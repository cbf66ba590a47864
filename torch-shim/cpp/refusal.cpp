// The one piece of the shim in C++: the exception PyTorch needs.
//
// PyTorch's CUDAPluggableAllocator wraps the allocator's function pointer in
// a std::function and uses the pointer it returns without checking it for
// NULL; only a C++ exception thrown by the allocator becomes a Python
// error (torch's error handling turns any std::exception into a
// RuntimeError). `memplug_torch_alloc` (Rust, `extern "C-unwind"`) calls
// this function when a request of more than zero bytes is refused; the
// exception unwinds through that one Rust frame, which owns nothing, into
// PyTorch. It is never called from anywhere else.

#include <cstddef>
#include <stdexcept>
#include <string>

namespace memplug_torch {

// What a refused allocation throws: a std::runtime_error, so PyTorch shows
// it as a RuntimeError carrying this text. (torch.OutOfMemoryError is
// c10::OutOfMemoryError, which only a library linked against c10 can
// throw; this shim links nothing of torch.)
class AllocationRefused : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

} // namespace memplug_torch

extern "C" [[noreturn]] void memplug_torch_throw_refusal(const char *why, std::size_t len) {
    throw memplug_torch::AllocationRefused(std::string(why, len));
}
