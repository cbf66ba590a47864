// memplug_offload.hpp: the C++ wrapper of offload/restore and
// copy-on-write of regions (memplug_host.h, C API 1.3), beside memplug.hpp
// and in its style: memplug::Error on every failure, the C structs as the
// answers. Free functions of a Region, since a class cannot gain members
// in a second header (memplug.hpp is the Region class's one place):
//
//   MemplugHostOffloadReport r = memplug::offload(region, host_binding, stream, 1s);
//   ... the device bytes are refunded; the address stays reserved ...
//   memplug::Fence f = memplug::restore(region, stream);   // same address
//   memplug::Fence p = memplug::privatise(region, 3 * g, g, stream, 1s);
//
// Both ride on the stream-ordered copy (plugin ABI 1.3): the stream is one
// of the region's mechanism. Each refusal leaves the region, its bytes and
// the pools as they were.
#ifndef MEMPLUG_OFFLOAD_HPP
#define MEMPLUG_OFFLOAD_HPP

#include "memplug.hpp"

namespace memplug {

namespace detail {
inline uint64_t timeout_ns(std::chrono::nanoseconds t) noexcept {
    return t.count() < 0 ? 0 : static_cast<uint64_t>(t.count());
}
} // namespace detail

/// Moves the region's private bytes to memory of `target` (a host-memory
/// binding), copying on `stream` and waiting up to `timeout` for the
/// region's work and the copies (memplug_host_region_offload). `released`
/// is the device bytes decommitted and refunded.
inline MemplugHostOffloadReport offload(Region &region, const Binding &target, const Stream &stream,
                                        std::chrono::nanoseconds timeout) {
    auto r = detail::sized<MemplugHostOffloadReport>();
    check(memplug_host_region_offload(region.get(), target.get(), stream.get(), detail::timeout_ns(timeout), &r));
    return r;
}

/// Brings an offloaded region's bytes back at the same addresses
/// (memplug_host_region_restore); the fence completes once they are there.
inline Fence restore(Region &region, const Stream &stream) {
    MemplugHostFence f{};
    check(memplug_host_region_restore(region.get(), stream.get(), &f));
    return Fence(f);
}

/// Where the region's private bytes are (memplug_host_region_residence):
/// `kind` is MEMPLUG_HOST_RESIDENCE_DEVICE or _HOST (with the host copy).
inline MemplugHostResidence residence(const Region &region) {
    auto r = detail::sized<MemplugHostResidence>();
    check(memplug_host_region_residence(region.get(), &r));
    return r;
}

/// True while the region's private bytes are offloaded.
inline bool is_offloaded(const Region &region) { return residence(region).kind == MEMPLUG_HOST_RESIDENCE_HOST; }

/// Gives the region a private copy of [offset, offset + len) of its shared
/// prefix, granule-aligned (memplug_host_region_privatise); the fence
/// completes once the private bytes are in place.
inline Fence privatise(Region &region, uint64_t offset, uint64_t len, const Stream &stream,
                       std::chrono::nanoseconds timeout) {
    MemplugHostFence f{};
    check(memplug_host_region_privatise(region.get(), offset, len, stream.get(), detail::timeout_ns(timeout), &f));
    return Fence(f);
}

} // namespace memplug

#endif
