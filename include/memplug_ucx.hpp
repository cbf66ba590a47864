// memplug_ucx.hpp: the C++ wrapper of memory on the wire through UCX
// (memplug_host_ucx_* of memplug_host.h), beside memplug.hpp and in its
// style: memplug::Error on every failure, move-only owners of the handles.
//
//   memplug::Ucx ucx("TLS=tcp;NET_DEVICES=lo");              // or Ucx() for UCX_* from the environment
//   memplug::UcxPeer peer(ucx, socket_fd, MEMPLUG_HOST_UCX_ERRORS_PEER, 10s);
//   // owner: register part of a region (pinned resident) and offer it
//   memplug::UcxRegistration reg(ucx, mechanism, region, 0, len, MEMPLUG_HOST_UCX_ACCESS_READ);
//   uint64_t id = peer.offer(reg, /*tag=*/7);
//   // other process: pull it into a region of its own (grown and charged first)
//   MemplugHostUcxRemoteRange r = peer.next_offer(10s);
//   peer.pull_into(region, 0, r, 0, r.len).wait(10s);
//   peer.release(r, 10s);                                    // now the owner may deregister
//
// Allocations take the same calls: UcxRegistration(ucx, mechanism,
// allocation, access) registers a whole allocation (its free waits while
// registered), UcxRegistration(ucx, mechanism, allocation, offset, len,
// access) a part of it (the whole allocation pinned), and pull_into /
// push_from take an Allocation in place of a Region (its bytes were charged
// when allocated: nothing grows). A CachedAllocation of a caching binding
// (memplug_cache.hpp) takes the same forms: while registered or with a transfer in flight,
// a block freed is handed to no other request and not given back to the
// mechanism until deregistered or complete.
//
// The objects are not owned by a manager: destroy them before the manager
// whose regions they use (a region's free waits for its registrations).
#ifndef MEMPLUG_UCX_HPP
#define MEMPLUG_UCX_HPP

#include "memplug.hpp"
#include "memplug_cache.hpp"

#if defined(MEMPLUG_HOST_UCX)

#include <chrono>

namespace memplug {

namespace detail {
inline uint64_t ucx_ns(std::chrono::nanoseconds t) noexcept {
    return t.count() < 0 ? 0 : static_cast<uint64_t>(t.count());
}
} // namespace detail

/// Whether UCX can be used here (libucp.so.0 found and recent enough);
/// `why` receives the reason when not.
inline bool ucx_available(std::string *why = nullptr) {
    MemplugHostStatus s = memplug_host_ucx_available();
    if (s != MEMPLUG_HOST_STATUS_OK && why) *why = last_error_message();
    return s == MEMPLUG_HOST_STATUS_OK;
}

/// A UCX context and worker (memplug_host_ucx_create).
class Ucx : public detail::Owned<MemplugHostUcx, memplug_host_ucx_destroy> {
  public:
    using Owned::Owned;
    /// `settings`: "NAME=VALUE;..." without the UCX_ prefix, or nullptr.
    explicit Ucx(const char *settings = nullptr) {
        MemplugHostUcx u{};
        check(memplug_host_ucx_create(settings, &u));
        h_ = u;
    }
};

/// A registered, resident range of a region (memplug_host_ucx_register_region).
/// The destructor releases the handle (memplug_host_ucx_registration_release:
/// deregistered now, or when the last peer holding the key gives it back);
/// deregister() deregisters now or throws.
class UcxRegistration : public detail::Owned<MemplugHostUcxRegistration, memplug_host_ucx_registration_release> {
  public:
    using Owned::Owned;
    UcxRegistration(const Ucx &ucx, const Mechanism &mechanism, const Region &region, uint64_t offset, uint64_t len,
                    uint32_t access) {
        MemplugHostUcxRegistration r{};
        check(memplug_host_ucx_register_region(ucx.get(), mechanism.get(), region.get(), offset, len, access, &r));
        h_ = r;
    }
    /// All of `allocation` (memplug_host_ucx_register_allocation): its free
    /// returns but the bytes stay allocated and charged until deregistered.
    UcxRegistration(const Ucx &ucx, const Mechanism &mechanism, const Allocation &allocation, uint32_t access) {
        MemplugHostUcxRegistration r{};
        check(memplug_host_ucx_register_allocation(ucx.get(), mechanism.get(), allocation.get(), access, &r));
        h_ = r;
    }
    /// `len` bytes at `offset` of `allocation`
    /// (memplug_host_ucx_register_allocation_range): the whole allocation is
    /// pinned. Throws Error (INVALID_ARGUMENT) for a part of length 0, past
    /// the end or overflowing.
    UcxRegistration(const Ucx &ucx, const Mechanism &mechanism, const Allocation &allocation, uint64_t offset,
                    uint64_t len, uint32_t access) {
        MemplugHostUcxRegistration r{};
        check(memplug_host_ucx_register_allocation_range(ucx.get(), mechanism.get(), allocation.get(), offset, len,
                                                         access, &r));
        h_ = r;
    }
    /// The bytes asked for of a cached block
    /// (memplug_host_ucx_register_cached_allocation): freed while
    /// registered, the block goes to no other request and stays charged.
    UcxRegistration(const Ucx &ucx, const Mechanism &mechanism, const CachedAllocation &block, uint32_t access) {
        MemplugHostUcxRegistration r{};
        check(memplug_host_ucx_register_cached_allocation(ucx.get(), mechanism.get(), block.get(), access, &r));
        h_ = r;
    }
    /// A part of a cached block (memplug_host_ucx_register_cached_allocation_range).
    UcxRegistration(const Ucx &ucx, const Mechanism &mechanism, const CachedAllocation &block, uint64_t offset,
                    uint64_t len, uint32_t access) {
        MemplugHostUcxRegistration r{};
        check(memplug_host_ucx_register_cached_allocation_range(ucx.get(), mechanism.get(), block.get(), offset, len,
                                                                access, &r));
        h_ = r;
    }
    /// Throws Error (MEMPLUG_HOST_STATUS_BUSY, still registered) while a
    /// peer holds the key.
    void deregister() {
        check(memplug_host_ucx_deregister(h_));
        h_ = MemplugHostUcxRegistration{};
    }
};

/// A transfer in flight or done; its region waits for it either way.
class UcxTransfer : public detail::Owned<MemplugHostUcxTransfer, memplug_host_ucx_transfer_release> {
  public:
    using Owned::Owned;
    /// Throws Error: TIMEOUT past the deadline, DEVICE_UNAVAILABLE when the
    /// peer or endpoint failed.
    void wait(std::chrono::nanoseconds timeout) { check(memplug_host_ucx_transfer_wait(h_, detail::ucx_ns(timeout))); }
};

/// The other process (memplug_host_ucx_peer_connect); the destructor says
/// goodbye and closes the socket.
class UcxPeer : public detail::Owned<MemplugHostUcxPeer, memplug_host_ucx_peer_destroy> {
  public:
    using Owned::Owned;
    /// Takes `fd` (a connected Unix or TCP stream socket) on success.
    UcxPeer(const Ucx &ucx, int fd, uint32_t errors, std::chrono::nanoseconds timeout) {
        MemplugHostUcxPeer p{};
        check(memplug_host_ucx_peer_connect(ucx.get(), fd, errors, detail::ucx_ns(timeout), &p));
        h_ = p;
    }
    uint64_t offer(const UcxRegistration &reg, uint64_t tag) {
        uint64_t id = 0;
        check(memplug_host_ucx_peer_offer(h_, reg.get(), tag, &id));
        return id;
    }
    MemplugHostUcxRemoteRange next_offer(std::chrono::nanoseconds timeout) {
        MemplugHostUcxRemoteRange r{};
        check(memplug_host_ucx_peer_next_offer(h_, detail::ucx_ns(timeout), &r));
        return r;
    }
    /// True once the peer has left; false when `timeout` passed first.
    bool serve(std::chrono::nanoseconds timeout) {
        bool left = false;
        check(memplug_host_ucx_peer_serve(h_, detail::ucx_ns(timeout), &left));
        return left;
    }
    UcxTransfer pull_into(const Region &region, uint64_t dst_offset, const MemplugHostUcxRemoteRange &range,
                          uint64_t src_offset, uint64_t len) {
        MemplugHostUcxTransfer t{};
        check(memplug_host_ucx_peer_pull_into_region(h_, region.get(), dst_offset, &range, src_offset, len, &t));
        return UcxTransfer(t);
    }
    UcxTransfer push_from(const Region &region, uint64_t src_offset, const MemplugHostUcxRemoteRange &range,
                          uint64_t dst_offset, uint64_t len) {
        MemplugHostUcxTransfer t{};
        check(memplug_host_ucx_peer_push_from_region(h_, region.get(), src_offset, &range, dst_offset, len, &t));
        return UcxTransfer(t);
    }
    /// Into an allocation (memplug_host_ucx_peer_pull_into_allocation):
    /// refused (INVALID_ARGUMENT) past its end; its free waits for the transfer.
    UcxTransfer pull_into(const Allocation &allocation, uint64_t dst_offset, const MemplugHostUcxRemoteRange &range,
                          uint64_t src_offset, uint64_t len) {
        MemplugHostUcxTransfer t{};
        check(memplug_host_ucx_peer_pull_into_allocation(h_, allocation.get(), dst_offset, &range, src_offset, len,
                                                         &t));
        return UcxTransfer(t);
    }
    UcxTransfer push_from(const Allocation &allocation, uint64_t src_offset, const MemplugHostUcxRemoteRange &range,
                          uint64_t dst_offset, uint64_t len) {
        MemplugHostUcxTransfer t{};
        check(memplug_host_ucx_peer_push_from_allocation(h_, allocation.get(), src_offset, &range, dst_offset, len,
                                                         &t));
        return UcxTransfer(t);
    }
    /// Into a cached block (memplug_host_ucx_peer_pull_into_cached_allocation):
    /// freed before the transfer completes, the block goes to no other request.
    UcxTransfer pull_into(const CachedAllocation &block, uint64_t dst_offset,
                          const MemplugHostUcxRemoteRange &range, uint64_t src_offset, uint64_t len) {
        MemplugHostUcxTransfer t{};
        check(memplug_host_ucx_peer_pull_into_cached_allocation(h_, block.get(), dst_offset, &range, src_offset, len, &t));
        return UcxTransfer(t);
    }
    UcxTransfer push_from(const CachedAllocation &block, uint64_t src_offset,
                          const MemplugHostUcxRemoteRange &range, uint64_t dst_offset, uint64_t len) {
        MemplugHostUcxTransfer t{};
        check(memplug_host_ucx_peer_push_from_cached_allocation(h_, block.get(), src_offset, &range, dst_offset, len, &t));
        return UcxTransfer(t);
    }
    void release(const MemplugHostUcxRemoteRange &range, std::chrono::nanoseconds timeout) {
        check(memplug_host_ucx_peer_release(h_, &range, detail::ucx_ns(timeout)));
    }
    void revoke(uint64_t offer_id, std::chrono::nanoseconds timeout) {
        check(memplug_host_ucx_peer_revoke(h_, offer_id, detail::ucx_ns(timeout)));
    }
};

} // namespace memplug

#endif // MEMPLUG_HOST_UCX
#endif
