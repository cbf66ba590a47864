// memplug.hpp: header-only C++17 RAII wrapper of the memplug host C API
// (memplug_host.h). No library of its own: link libmemplug_host.
//
// * Owners are move-only; their destructors free, release or destroy (and
//   ignore the status: destructors never throw).
// * Every failing call throws memplug::Error, carrying the status code and
//   the library's message.
// * Callbacks are std::function; an exception escaping one is caught at the
//   C boundary (a pressure callback then answers 0, a grow update refuses,
//   a fence query answers "not complete") — nothing unwinds through C.
// * Handles stay reachable with get() for calls this wrapper does not cover.
// * Lifecycle (Mechanism::state/retire/declare_lost/subscribe,
//   Manager::replace/terminate): a subscription is an RAII Subscription
//   whose callback gets a LifecycleEvent copied out of the C event (so it
//   may be kept); it runs on the thread that delivers the transition.
// * What a mechanism says of its memory and device (C API 1.1, plugin ABI
//   1.2): Mechanism::descriptor() (a Descriptor), identity() (empty when
//   none was published), typed_export(); Manager::select_needing with
//   MemoryNeeds; placement in BindingOptions (with_page_size,
//   with_location, with_export_types, with_uninitialized_ok).
// * Typed export of shared prefixes (C API 1.1): Prefix::export_handle
//   returns an RAII ExportedHandle (closes its fd / Windows handle);
//   Binding::import_prefix makes a prefix of the importer's, charged to its
//   pool. Stream::wait_fence orders a stream behind another stream's fence;
//   Mechanism::can_access_peer asks about peer access (UNSUPPORTED, thrown,
//   without MEMPLUG_CAP_PEER_ACCESS) and Region::set_peer_access gives it
//   to a range; Region::grow_on grows a region on a stream and returns the
//   commit's Fence (UNSUPPORTED without MEMPLUG_CAP_QUEUED_BINDING);
//   Mechanism::adopt_stream wraps a runtime's native stream, naming its
//   API (memplug_host_stream_adopt_typed).
#ifndef MEMPLUG_HPP
#define MEMPLUG_HPP

#include "memplug_host.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if !defined(_WIN32)
#include <unistd.h>
#endif

namespace memplug {

/// A failed call: the status code and the message of the library.
class Error : public std::runtime_error {
  public:
    Error(MemplugHostStatus code, const std::string &message) : std::runtime_error(message), code_(code) {}
    /// The MEMPLUG_HOST_STATUS_* code.
    MemplugHostStatus code() const noexcept { return code_; }
    /// The code's name, e.g. "MEMPLUG_HOST_STATUS_OUT_OF_BUDGET".
    const char *code_name() const noexcept { return memplug_host_status_name(code_); }

  private:
    MemplugHostStatus code_;
};

/// This thread's last error message.
inline std::string last_error_message() {
    std::string s(memplug_host_last_error_message(nullptr, 0), '\0');
    if (!s.empty()) memplug_host_last_error_message(&s[0], s.size() + 1);
    return s;
}

/// Throws memplug::Error unless `s` is MEMPLUG_HOST_STATUS_OK.
inline void check(MemplugHostStatus s) {
    if (s != MEMPLUG_HOST_STATUS_OK) {
        throw Error(s, std::string(memplug_host_status_name(s)) + ": " + last_error_message());
    }
}

namespace detail {

template <class T> T sized() {
    T v{};
    v.struct_size = sizeof(T);
    return v;
}

/// A move-only owner of one handle; `Free` releases it.
template <class H, MemplugHostStatus (*Free)(H)> class Owned {
  public:
    Owned() noexcept = default;
    explicit Owned(H h) noexcept : h_(h) {}
    Owned(const Owned &) = delete;
    Owned &operator=(const Owned &) = delete;
    Owned(Owned &&o) noexcept : h_(o.release()) {}
    Owned &operator=(Owned &&o) noexcept {
        if (this != &o) {
            reset();
            h_ = o.release();
        }
        return *this;
    }
    ~Owned() { reset(); }

    /// The handle (still owned).
    H get() const noexcept { return h_; }
    explicit operator bool() const noexcept { return h_.id != 0; }
    /// Gives up ownership without freeing.
    H release() noexcept {
        H h = h_;
        h_ = H{};
        return h;
    }
    /// Frees now (status ignored, as in the destructor).
    void reset() noexcept {
        if (h_.id != 0) (void)Free(h_);
        h_ = H{};
    }
    /// Frees now and throws on failure.
    void close() {
        H h = release();
        if (h.id != 0) check(Free(h));
    }

  protected:
    H h_{};
};

} // namespace detail

/// Where memory lives: a MEMPLUG_LOCATION_* kind and the NUMA node or tier
/// it names (0 for the other kinds).
struct Location {
    uint32_t kind = MEMPLUG_LOCATION_ANY;
    uint32_t id = 0;

    /// No preference (needs, placement) / not said (descriptors).
    static constexpr Location any() noexcept { return Location{}; }
    /// On the mechanism's device.
    static constexpr Location device() noexcept { return Location{MEMPLUG_LOCATION_DEVICE, 0}; }
    /// In host memory, no particular node.
    static constexpr Location host() noexcept { return Location{MEMPLUG_LOCATION_HOST, 0}; }
    /// In host memory on NUMA node `node`.
    static constexpr Location numa_node(uint32_t node) noexcept { return Location{MEMPLUG_LOCATION_NUMA_NODE, node}; }
    /// In memory tier `tier` (0 the fastest).
    static constexpr Location tier(uint32_t index) noexcept { return Location{MEMPLUG_LOCATION_TIER, index}; }

    friend constexpr bool operator==(Location a, Location b) noexcept { return a.kind == b.kind && a.id == b.id; }
    friend constexpr bool operator!=(Location a, Location b) noexcept { return !(a == b); }
};

/// What a mechanism says of its memory (memplug_host_mechanism_descriptor,
/// the plugin ABI 1.2 descriptor): all "not said" (zero, false) for a
/// plugin that agreed on an older minor.
struct Descriptor {
    /// 0 (same as the granularity) or a power-of-two multiple of it.
    uint64_t recommended_granularity = 0;
    /// Bit k set: pages of 2^k bytes can back its memory.
    uint64_t page_sizes = 0;
    /// MEMPLUG_ATTR_* bits every object has.
    uint32_t attributes = 0;
    /// MEMPLUG_HANDLE_* kinds its physical objects can be exported as.
    uint32_t export_types = 0;
    Location location{};
    /// Physical objects map at any granularity-aligned offset.
    bool maps_at_offsets = false;

    /// True when it claims every attribute in `attrs`.
    bool has(uint32_t attrs) const noexcept { return (attributes & attrs) == attrs; }
    /// True when `kind` (one MEMPLUG_HANDLE_* bit) is offered.
    bool exports_as(uint32_t kind) const noexcept { return kind != 0 && (export_types & kind) == kind; }
    /// True for 0 (the mechanism's choice) or a power of two it publishes.
    bool accepts_page_size(uint64_t bytes) const noexcept {
        return bytes == 0 || ((bytes & (bytes - 1)) == 0 && (page_sizes & bytes) != 0);
    }

    static Descriptor from_c(const MemplugHostDescriptor &d) noexcept {
        Descriptor v;
        v.recommended_granularity = d.recommended_granularity;
        v.page_sizes = d.page_sizes;
        v.attributes = d.attributes;
        v.export_types = d.export_types;
        v.location = Location{d.location_kind, d.location_id};
        v.maps_at_offsets = d.maps_at_offsets != 0;
        return v;
    }
};

/// What a caller needs of a mechanism's memory (Manager::select_needing):
/// every attribute in `attributes`, memory at `location` (any: anywhere),
/// pages of `page_size` bytes (0: any).
struct MemoryNeeds {
    uint32_t attributes = 0;
    Location location{};
    uint64_t page_size = 0;

    MemplugHostMemoryNeeds to_c() const noexcept {
        MemplugHostMemoryNeeds n{};
        n.struct_size = sizeof n;
        n.attributes = attributes;
        n.location_kind = location.kind;
        n.location_id = location.id;
        n.page_size = page_size;
        return n;
    }
};

class Fence;
class Stream;

inline std::vector<MemplugHostFence> handles_of(const std::vector<const Fence *> &fences);

/// A fence: recorded on a plugin stream, or made of runtime callbacks.
class Fence : public detail::Owned<MemplugHostFence, memplug_host_fence_release> {
  public:
    using Owned::Owned;

    /// Wraps a runtime fence: `query` says whether the work completed
    /// (never blocks). The host polls it to wait. Called from any thread.
    static Fence from_query(MemplugHostManager m, const std::string &name, std::function<bool()> query) {
        auto *fn = new std::function<bool()>(std::move(query));
        MemplugHostFence f{};
        MemplugHostStatus s = memplug_host_fence_from_callbacks(m, name.c_str(), &Fence::query_tramp, nullptr,
                                                               &Fence::release_tramp, fn, &f);
        if (s != MEMPLUG_HOST_STATUS_OK) delete fn;
        check(s);
        return Fence(f);
    }

    /// True when complete; never blocks.
    bool query() const {
        bool done = false;
        check(memplug_host_fence_query(h_, &done));
        return done;
    }
    /// Waits up to `timeout`; true when complete.
    bool wait(std::chrono::nanoseconds timeout) const {
        bool done = false;
        check(memplug_host_fence_wait(h_, static_cast<uint64_t>(timeout.count()), &done));
        return done;
    }

  private:
    static bool query_tramp(void *ud) noexcept {
        try {
            return (*static_cast<std::function<bool()> *>(ud))();
        } catch (...) {
            return false;
        }
    }
    static void release_tramp(void *ud) noexcept { delete static_cast<std::function<bool()> *>(ud); }
};

inline std::vector<MemplugHostFence> handles_of(const std::vector<const Fence *> &fences) {
    std::vector<MemplugHostFence> hs;
    hs.reserve(fences.size());
    for (const Fence *f : fences) hs.push_back(f->get());
    return hs;
}

/// An allocation; freed by the destructor (now) or by free_after().
class Allocation : public detail::Owned<MemplugHostAllocation, memplug_host_allocation_free> {
  public:
    Allocation() noexcept = default;
    Allocation(MemplugHostAllocation h, uint64_t addr) noexcept : Owned(h), addr_(addr) {}
    Allocation(Allocation &&) noexcept = default;
    Allocation &operator=(Allocation &&) noexcept = default;

    uint64_t addr() const noexcept { return addr_; }
    template <class T> T *data() const noexcept { return reinterpret_cast<T *>(static_cast<uintptr_t>(addr_)); }
    MemplugHostAllocationInfo info() const {
        auto i = detail::sized<MemplugHostAllocationInfo>();
        check(memplug_host_allocation_info(h_, &i));
        return i;
    }
    /// Frees once every fence has completed (never waits for the device).
    void free_after(const std::vector<const Fence *> &fences) {
        auto hs = handles_of(fences);
        check(memplug_host_allocation_free_after(h_, hs.data(), hs.size()));
        release();
    }
    /// True when it went with a lost device (memplug_host_allocation_is_lost):
    /// its memory is gone; destroying it calls no plugin and refunds nothing.
    bool is_lost() const {
        bool lost = false;
        check(memplug_host_allocation_is_lost(h_, &lost));
        return lost;
    }

  private:
    uint64_t addr_ = 0;
};

/// A typed handle to memory (MemplugHostHandle) the caller owns: the
/// destructor closes an fd kind's descriptor. (A MEMPLUG_HANDLE_WIN32
/// handle is not closed: this header does not include <windows.h>;
/// release() it and CloseHandle it.) Move-only; release() gives the C
/// struct up without closing.
class ExportedHandle {
  public:
    ExportedHandle() noexcept = default;
    explicit ExportedHandle(const MemplugHostHandle &h) noexcept : h_(h) {}
    ExportedHandle(const ExportedHandle &) = delete;
    ExportedHandle &operator=(const ExportedHandle &) = delete;
    ExportedHandle(ExportedHandle &&o) noexcept : h_(o.release()) {}
    ExportedHandle &operator=(ExportedHandle &&o) noexcept {
        if (this != &o) {
            reset();
            h_ = o.release();
        }
        return *this;
    }
    ~ExportedHandle() { reset(); }

    /// The MEMPLUG_HANDLE_* kind (0 when empty).
    uint32_t kind() const noexcept { return h_.kind; }
    /// The descriptor of the fd kinds (-1 otherwise); still owned.
    int fd() const noexcept { return h_.fd; }
    /// The C struct (still owned), for memplug_host_binding_import_prefix.
    const MemplugHostHandle &get() const noexcept { return h_; }
    explicit operator bool() const noexcept { return h_.kind != 0; }
    /// Gives up ownership without closing.
    MemplugHostHandle release() noexcept {
        MemplugHostHandle h = h_;
        h_ = empty();
        return h;
    }
    /// Closes now.
    void reset() noexcept {
#if !defined(_WIN32)
        if ((h_.kind & (MEMPLUG_HANDLE_OPAQUE_FD | MEMPLUG_HANDLE_DMABUF_FD | MEMPLUG_HANDLE_MEMFD)) != 0 &&
            h_.fd >= 0) {
            (void)::close(h_.fd);
        }
#endif
        h_ = empty();
    }

  private:
    static MemplugHostHandle empty() noexcept {
        MemplugHostHandle h{};
        h.struct_size = sizeof(MemplugHostHandle);
        h.fd = -1;
        return h;
    }
    MemplugHostHandle h_ = empty();
};

class Prefix : public detail::Owned<MemplugHostPrefix, memplug_host_prefix_release> {
  public:
    using Owned::Owned;
    /// Its memory as a new handle of `kind` (one MEMPLUG_HANDLE_* bit;
    /// memplug_host_prefix_export_handle), for Binding::import_prefix here
    /// or in another process. Charges nothing.
    ExportedHandle export_handle(uint32_t kind) const {
        auto h = detail::sized<MemplugHostHandle>();
        h.fd = -1;
        check(memplug_host_prefix_export_handle(h_, kind, &h));
        return ExportedHandle(h);
    }
    MemplugHostPrefixInfo info() const {
        auto i = detail::sized<MemplugHostPrefixInfo>();
        check(memplug_host_prefix_info(h_, &i));
        return i;
    }
    /// True when it went with a lost device (memplug_host_prefix_is_lost).
    bool is_lost() const {
        bool lost = false;
        check(memplug_host_prefix_is_lost(h_, &lost));
        return lost;
    }
};

/// A virtual region at a stable address; freed by the destructor.
class Region : public detail::Owned<MemplugHostRegion, memplug_host_region_free> {
  public:
    using Owned::Owned;
    using Update = std::function<bool(uint64_t addr, uint64_t len)>;

    MemplugHostRegionInfo info() const {
        auto i = detail::sized<MemplugHostRegionInfo>();
        check(memplug_host_region_info(h_, &i));
        return i;
    }
    uint64_t addr() const { return info().addr; }
    /// Grows to at least `len` usable bytes; `update` sees the new view and
    /// may refuse (then the region is unchanged and Error is thrown with
    /// MEMPLUG_HOST_STATUS_CALLBACK_REFUSED).
    void grow(uint64_t len, Update update = nullptr) {
        if (!update) {
            check(memplug_host_region_grow(h_, len, nullptr, nullptr));
            return;
        }
        check(memplug_host_region_grow(h_, len, &Region::grow_tramp, &update));
    }
    void shrink(uint64_t len, const std::vector<const Fence *> &fences = {}) {
        auto hs = handles_of(fences);
        check(memplug_host_region_shrink(h_, len, hs.data(), hs.size()));
    }
    void map_prefix(const Prefix &p) { check(memplug_host_region_map_prefix(h_, p.get())); }
    /// Grows to at least `len` usable bytes as a queue operation on
    /// `stream` (memplug_host_region_grow_on): charged now; the returned
    /// fence completes once the new range is usable. Throws Error
    /// (MEMPLUG_HOST_STATUS_UNSUPPORTED) without MEMPLUG_CAP_QUEUED_BINDING.
    Fence grow_on(uint64_t len, const Stream &stream);
    /// Sets what `peer` may do with [offset, offset + len) of the region:
    /// MEMPLUG_ACCESS_* bits, 0 to revoke
    /// (memplug_host_region_set_peer_access). Throws Error
    /// (MEMPLUG_HOST_STATUS_UNSUPPORTED) without MEMPLUG_CAP_PEER_ACCESS.
    void set_peer_access(uint64_t offset, uint64_t len, MemplugDevice peer, uint32_t access) {
        check(memplug_host_region_set_peer_access(h_, offset, len, peer, access));
    }
    /// True when it went with a lost device (memplug_host_region_is_lost).
    bool is_lost() const {
        bool lost = false;
        check(memplug_host_region_is_lost(h_, &lost));
        return lost;
    }
    void free_after(const std::vector<const Fence *> &fences) {
        auto hs = handles_of(fences);
        check(memplug_host_region_free_after(h_, hs.data(), hs.size()));
        release();
    }

  private:
    static bool grow_tramp(void *ud, uint64_t addr, uint64_t len) noexcept {
        try {
            return (*static_cast<Update *>(ud))(addr, len);
        } catch (...) {
            return false;
        }
    }
};

/// Allocates through one mechanism, charged to one pool, holder and class.
class Binding : public detail::Owned<MemplugHostBinding, memplug_host_binding_destroy> {
  public:
    using Owned::Owned;
    using Init = std::function<void(uint64_t addr, uint64_t len)>;

    Allocation allocate(uint64_t size, uint64_t alignment = 16) const {
        MemplugHostAllocation a{};
        uint64_t addr = 0;
        check(memplug_host_allocate(h_, size, alignment, &a, &addr));
        return Allocation(a, addr);
    }
    /// The mechanism this binding allocates through (after
    /// Manager::replace, a binding asked of the old mechanism is made on
    /// the new one).
    MemplugHostMechanismInfo mechanism_info() const {
        auto i = detail::sized<MemplugHostMechanismInfo>();
        check(memplug_host_binding_mechanism_info(h_, &i));
        return i;
    }
    Region reserve(uint64_t max_bytes) const {
        MemplugHostRegion r{};
        check(memplug_host_region_reserve(h_, max_bytes, &r));
        return Region(r);
    }
    /// A shared prefix filled once by `init` through a writable view.
    Prefix create_prefix(uint64_t size, Init init = nullptr) const {
        MemplugHostPrefix p{};
        if (init) {
            check(memplug_host_prefix_create(h_, size, &Binding::init_tramp, &init, &p));
        } else {
            check(memplug_host_prefix_create(h_, size, nullptr, nullptr, &p));
        }
        return Prefix(p);
    }
    /// A prefix of `size` bytes backed by the memory `h` names
    /// (memplug_host_binding_import_prefix), charged once to this binding's
    /// pool. The handle stays the caller's.
    Prefix import_prefix(const MemplugHostHandle &h, uint64_t size) const {
        MemplugHostPrefix p{};
        check(memplug_host_binding_import_prefix(h_, &h, size, &p));
        return Prefix(p);
    }
    Prefix import_prefix(const ExportedHandle &h, uint64_t size) const { return import_prefix(h.get(), size); }

  private:
    static void init_tramp(void *ud, uint64_t addr, uint64_t len) noexcept {
        try {
            (*static_cast<Init *>(ud))(addr, len);
        } catch (...) {
        }
    }
};

/// A plugin stream: host functions run in order; fences follow them.
class Stream : public detail::Owned<MemplugHostStream, memplug_host_stream_destroy> {
  public:
    using Owned::Owned;
    void enqueue(std::function<void()> fn) {
        auto *f = new std::function<void()>(std::move(fn));
        MemplugHostStatus s = memplug_host_stream_enqueue(h_, &Stream::run_tramp, f);
        if (s != MEMPLUG_HOST_STATUS_OK) delete f;
        check(s);
    }
    Fence record() const {
        MemplugHostFence f{};
        check(memplug_host_fence_record(h_, &f));
        return Fence(f);
    }
    /// Later work on this stream waits for `f`, a fence recorded on a
    /// stream of the same mechanism (memplug_host_stream_wait_fence); the
    /// caller does not wait.
    void wait_fence(const Fence &f) const { check(memplug_host_stream_wait_fence(h_, f.get())); }
    /// Queues a copy of `len` bytes from `src` to `dst` after the work
    /// before it (plugin ABI 1.3, memplug_host_stream_copy); record a fence
    /// after it to know when it is done. The caller keeps both ranges
    /// alive and untouched until then.
    void copy(uint64_t dst, uint64_t src, uint64_t len) const { check(memplug_host_stream_copy(h_, dst, src, len)); }

  private:
    static void run_tramp(void *ud) noexcept {
        std::unique_ptr<std::function<void()>> f(static_cast<std::function<void()> *>(ud));
        try {
            (*f)();
        } catch (...) {
        }
    }
};

inline Fence Region::grow_on(uint64_t len, const Stream &stream) {
    MemplugHostFence f{};
    check(memplug_host_region_grow_on(h_, len, stream.get(), &f));
    return Fence(f);
}

/// The name of a life state, e.g. "MEMPLUG_HOST_LIFE_STATE_LOST".
inline const char *life_state_name(MemplugHostLifeState s) noexcept { return memplug_host_life_state_name(s); }

/// What one binding of a lost context held (a copy of a
/// MemplugHostLossNotice).
struct LossNotice {
    /// The pool the binding charges.
    std::string pool;
    /// The holder it charges (Holder::id()); 0 for none.
    uint64_t holder_id = 0;
    uint32_t alloc_class = MEMPLUG_HOST_CLASS_OTHER;
    uint64_t objects = 0;
    uint64_t bytes = 0;
    uint64_t quarantined_bytes = 0;
};

/// One transition of a mechanism's context, copied out of the C event:
/// valid after the callback returns.
struct LifecycleEvent {
    MemplugHostSubscription subscription{};
    /// "plugin/mechanism".
    std::string context;
    MemplugHostLifeState from = MEMPLUG_HOST_LIFE_STATE_ACTIVE;
    MemplugHostLifeState to = MEMPLUG_HOST_LIFE_STATE_ACTIVE;
    /// Why the context left ACTIVE, when a reason was given.
    std::optional<std::string> reason;
    /// On entering LOST: one per binding that held something.
    std::vector<LossNotice> notices;
    /// On entering TERMINATED: what was settled.
    std::optional<MemplugHostSettlement> settlement;

    static LifecycleEvent from_c(const MemplugHostLifecycleEvent &e) {
        LifecycleEvent v;
        v.subscription = e.subscription;
        v.context.assign(e.context, e.context_len);
        v.from = e.from;
        v.to = e.to;
        if (e.reason) v.reason = std::string(e.reason, e.reason_len);
        for (size_t i = 0; i < e.notice_count; i++) {
            // Stepped by notice_size: a later library's notice may be longer.
            const auto *n = reinterpret_cast<const MemplugHostLossNotice *>(
                reinterpret_cast<const char *>(e.notices) + i * e.notice_size);
            LossNotice c;
            c.pool.assign(n->pool_name, n->pool_name_len);
            c.holder_id = n->holder_id;
            c.alloc_class = n->alloc_class;
            c.objects = n->objects;
            c.bytes = n->bytes;
            c.quarantined_bytes = n->quarantined_bytes;
            v.notices.push_back(std::move(c));
        }
        if (e.settlement) v.settlement = *e.settlement;
        return v;
    }
};

/// A subscription to a mechanism's lifecycle events
/// (Mechanism::subscribe); ended by the destructor, which returns only when
/// no call of the callback runs on another thread. The callback runs on
/// the thread that delivers the transition (see MemplugHostLifecycleFn:
/// from inside it, poll, terminate, replace, retire and declare_lost throw
/// memplug::Error with MEMPLUG_HOST_STATUS_REENTRANT). An exception leaving
/// the callback is caught and ignored. The callback may destroy its own
/// Subscription.
class Subscription {
  public:
    using Callback = std::function<void(const LifecycleEvent &)>;

    Subscription() noexcept = default;
    Subscription(MemplugHostMechanism m, Callback cb) : box_(new Box{std::make_shared<Callback>(std::move(cb))}) {
        check(memplug_host_mechanism_subscribe(m, &Subscription::tramp, box_.get(), &h_));
    }
    Subscription(Subscription &&o) noexcept : h_(o.h_), box_(std::move(o.box_)) { o.h_ = MemplugHostSubscription{}; }
    Subscription &operator=(Subscription &&o) noexcept {
        if (this != &o) {
            reset();
            h_ = o.h_;
            box_ = std::move(o.box_);
            o.h_ = MemplugHostSubscription{};
        }
        return *this;
    }
    Subscription(const Subscription &) = delete;
    Subscription &operator=(const Subscription &) = delete;
    ~Subscription() { reset(); }

    MemplugHostSubscription get() const noexcept { return h_; }
    explicit operator bool() const noexcept { return h_.id != 0; }
    /// Unsubscribes (waits for callbacks running on other threads), then
    /// frees the callback (a call running on this thread keeps its own
    /// reference until it returns).
    void reset() noexcept {
        if (h_.id != 0) (void)memplug_host_mechanism_unsubscribe(h_);
        h_ = MemplugHostSubscription{};
        box_.reset();
    }

  private:
    struct Box {
        std::shared_ptr<Callback> fn;
    };
    static void tramp(void *ud, const MemplugHostLifecycleEvent *e) noexcept {
        try {
            // A reference of its own: the callback may destroy its Subscription.
            std::shared_ptr<Callback> fn = static_cast<Box *>(ud)->fn;
            (*fn)(LifecycleEvent::from_c(*e));
        } catch (...) {
        }
    }
    MemplugHostSubscription h_{};
    std::unique_ptr<Box> box_;
};

class Mechanism : public detail::Owned<MemplugHostMechanism, memplug_host_mechanism_release> {
  public:
    using Owned::Owned;
    MemplugHostMechanismInfo info() const {
        auto i = detail::sized<MemplugHostMechanismInfo>();
        check(memplug_host_mechanism_info(h_, &i));
        return i;
    }
    /// What it says of its memory (memplug_host_mechanism_descriptor).
    Descriptor descriptor() const {
        auto d = detail::sized<MemplugHostDescriptor>();
        check(memplug_host_mechanism_descriptor(h_, &d));
        return Descriptor::from_c(d);
    }
    /// Its device's identity (memplug_host_mechanism_identity); empty when
    /// the plugin published none.
    std::optional<MemplugHostDeviceIdentity> identity() const {
        auto i = detail::sized<MemplugHostDeviceIdentity>();
        MemplugHostStatus st = memplug_host_mechanism_identity(h_, &i);
        if (st == MEMPLUG_HOST_STATUS_NOT_FOUND) return std::nullopt;
        check(st);
        return i;
    }
    /// True when it exports physical objects as typed handles
    /// (MEMPLUG_CAP_TYPED_EXPORT; the kinds are descriptor().export_types).
    bool typed_export() const { return (info().capabilities & MEMPLUG_CAP_TYPED_EXPORT) != 0; }
    /// True when other devices can be given access to its memory
    /// (MEMPLUG_CAP_PEER_ACCESS).
    bool peer_access() const { return (info().capabilities & MEMPLUG_CAP_PEER_ACCESS) != 0; }
    /// The MEMPLUG_COPY_* address spaces its stream copy copies between (0:
    /// no copy; memplug_host_mechanism_copy_kinds).
    uint32_t copy_kinds() const {
        uint32_t k = 0;
        check(memplug_host_mechanism_copy_kinds(h_, &k));
        return k;
    }
    /// The MEMPLUG_ACCESS_* bits `peer` can be given (0: none;
    /// memplug_host_mechanism_can_access_peer). Throws Error
    /// (MEMPLUG_HOST_STATUS_UNSUPPORTED) without peer access.
    uint32_t can_access_peer(MemplugDevice peer) const {
        uint32_t access = 0;
        check(memplug_host_mechanism_can_access_peer(h_, peer, &access));
        return access;
    }
    Stream create_stream() const {
        MemplugHostStream s{};
        check(memplug_host_stream_create(h_, &s));
        return Stream(s);
    }
    /// Wraps a runtime's native stream made by the API of device kind
    /// `native_kind` (MEMPLUG_DEVICE_*; memplug_host_stream_adopt_typed).
    /// The native stream stays the runtime's and must outlive the Stream.
    /// Throws Error (MEMPLUG_HOST_STATUS_UNSUPPORTED) when the plugin does
    /// not adopt that kind.
    Stream adopt_stream(uint32_t native_kind, void *native) const {
        MemplugHostStream s{};
        check(memplug_host_stream_adopt_typed(h_, native_kind, native, &s));
        return Stream(s);
    }

    /// Where its context is in its life.
    MemplugHostLifeState state() const {
        MemplugHostLifeState s = MEMPLUG_HOST_LIFE_STATE_ACTIVE;
        check(memplug_host_mechanism_state(h_, &s));
        return s;
    }
    /// Why it left ACTIVE ("" while active).
    std::string reason() const {
        size_t n = 0;
        check(memplug_host_mechanism_reason(h_, nullptr, 0, &n));
        std::string r(n, '\0');
        if (n != 0) check(memplug_host_mechanism_reason(h_, &r[0], n + 1, &n));
        r.resize(std::min(n, r.size()));
        return r;
    }
    /// Starts an orderly end (memplug_host_mechanism_retire): no new
    /// binding or object; what exists keeps working.
    void retire(const std::string &reason) const { check(memplug_host_mechanism_retire(h_, reason.c_str())); }
    /// Declares its context lost (memplug_host_mechanism_declare_lost); true
    /// when this call moved it to LOST.
    bool declare_lost(const std::string &reason) const {
        bool moved = false;
        check(memplug_host_mechanism_declare_lost(h_, reason.c_str(), &moved));
        return moved;
    }
    /// The settlement, once its context has terminated; empty before.
    std::optional<MemplugHostSettlement> settlement() const {
        auto s = detail::sized<MemplugHostSettlement>();
        MemplugHostStatus st = memplug_host_mechanism_settlement(h_, &s);
        if (st == MEMPLUG_HOST_STATUS_NOT_READY) return std::nullopt;
        check(st);
        return s;
    }
    /// Calls `cb` with every later transition of its context.
    Subscription subscribe(Subscription::Callback cb) const { return Subscription(h_, std::move(cb)); }
};

/// A holder registered with a pool; its callback answers pressure tickets
/// with the bytes it released. Unregistered by the destructor.
class Holder {
  public:
    using Callback = std::function<uint64_t(const MemplugHostPressureTicket &)>;

    Holder() noexcept = default;
    Holder(MemplugHostPool pool, const std::string &name, uint32_t priority, Callback cb)
        : cb_(new Callback(std::move(cb))) {
        check(memplug_host_holder_register(pool, name.c_str(), priority, &Holder::tramp, cb_.get(), &h_));
    }
    Holder(Holder &&o) noexcept : h_(o.h_), cb_(std::move(o.cb_)) { o.h_ = MemplugHostHolder{}; }
    Holder &operator=(Holder &&o) noexcept {
        if (this != &o) {
            reset();
            h_ = o.h_;
            cb_ = std::move(o.cb_);
            o.h_ = MemplugHostHolder{};
        }
        return *this;
    }
    Holder(const Holder &) = delete;
    Holder &operator=(const Holder &) = delete;
    ~Holder() { reset(); }

    MemplugHostHolder get() const noexcept { return h_; }
    /// The governor's id of the holder, as loss notices name it.
    uint64_t id() const {
        uint64_t v = 0;
        check(memplug_host_holder_id(h_, &v));
        return v;
    }
    MemplugHostHolderStats stats() const {
        auto s = detail::sized<MemplugHostHolderStats>();
        check(memplug_host_holder_stats(h_, &s));
        return s;
    }
    /// Unregisters (waits for callbacks running on other threads), then
    /// frees the callback.
    void reset() noexcept {
        if (h_.id != 0) (void)memplug_host_holder_unregister(h_);
        h_ = MemplugHostHolder{};
        cb_.reset();
    }

  private:
    static uint64_t tramp(void *ud, const MemplugHostPressureTicket *t) noexcept {
        try {
            return (*static_cast<Callback *>(ud))(*t);
        } catch (...) {
            return 0;
        }
    }
    MemplugHostHolder h_{};
    std::unique_ptr<Callback> cb_;
};

/// A budget pool handle (owned). Pools form trees: a child pool's charges
/// count against it and every ancestor (Manager::create_child_pool).
class Pool : public detail::Owned<MemplugHostPool, memplug_host_pool_release> {
  public:
    using Owned::Owned;
    /// Its place in the tree: ids, parent, depth, capacity, use, the
    /// children's share (memplug_host_pool_info).
    MemplugHostPoolInfo info() const {
        auto i = detail::sized<MemplugHostPoolInfo>();
        check(memplug_host_pool_info(h_, &i));
        return i;
    }
    /// Changes the capacity (memplug_host_pool_set_capacity): raising always
    /// works; lowering below what is live first asks the holders under this
    /// pool, then throws memplug::Error with MEMPLUG_HOST_STATUS_BUSY (its
    /// message says how many bytes are live) and leaves the capacity as it was.
    void set_capacity(uint64_t capacity) const { check(memplug_host_pool_set_capacity(h_, capacity)); }
    /// A new handle to the parent pool; throws MEMPLUG_HOST_STATUS_NOT_FOUND
    /// for a pool without a parent.
    Pool parent() const {
        MemplugHostPool p{};
        check(memplug_host_pool_parent(h_, &p));
        return Pool(p);
    }
    MemplugHostPoolStats stats() const {
        auto s = detail::sized<MemplugHostPoolStats>();
        check(memplug_host_pool_stats(h_, &s));
        return s;
    }
    MemplugHostClassStats class_stats(uint32_t alloc_class) const {
        auto s = detail::sized<MemplugHostClassStats>();
        check(memplug_host_pool_class_stats(h_, alloc_class, &s));
        return s;
    }
    Holder register_holder(const std::string &name, uint32_t priority, Holder::Callback cb) const {
        return Holder(h_, name, priority, std::move(cb));
    }
};

/// Options of a binding: its class, holder and wait, and (C API 1.1) its
/// placement — how its memory is asked for, sent to plugins that agreed on
/// ABI 1.2 (a plugin that cannot place memory so refuses the binding's
/// allocations, prefixes and regions). Set the fields, or chain the
/// builders: BindingOptions{}.with_class(MEMPLUG_HOST_CLASS_KV).with_page_size(4096).
struct BindingOptions {
    uint32_t alloc_class = MEMPLUG_HOST_CLASS_OTHER;
    const Holder *holder = nullptr;
    std::chrono::nanoseconds wait{0};
    /// MEMPLUG_HINT_* bits.
    uint32_t hints = 0;
    /// Pages of this many bytes (a power of two the mechanism publishes);
    /// 0: the mechanism's choice.
    uint64_t page_size = 0;
    /// Where the memory should live; any: no preference.
    Location location{};
    /// MEMPLUG_HANDLE_* kinds the memory will be exported as.
    uint32_t export_types = 0;

    BindingOptions &with_class(uint32_t c) noexcept {
        alloc_class = c;
        return *this;
    }
    /// `h` must outlive the bind() call (not the binding).
    BindingOptions &with_holder(const Holder &h) noexcept {
        holder = &h;
        return *this;
    }
    BindingOptions &with_wait(std::chrono::nanoseconds w) noexcept {
        wait = w;
        return *this;
    }
    /// The memory need not be zeroed (MEMPLUG_HINT_UNINITIALIZED_OK): only
    /// for memory the caller overwrites before reading.
    BindingOptions &with_uninitialized_ok() noexcept {
        hints |= MEMPLUG_HINT_UNINITIALIZED_OK;
        return *this;
    }
    BindingOptions &with_page_size(uint64_t bytes) noexcept {
        page_size = bytes;
        return *this;
    }
    BindingOptions &with_location(Location l) noexcept {
        location = l;
        return *this;
    }
    BindingOptions &with_export_types(uint32_t kinds) noexcept {
        export_types = kinds;
        return *this;
    }
};

/// A process memory manager; destroyed (with everything it issued) by the
/// destructor. Declare it before the objects made through it, so they are
/// destroyed first.
class Manager : public detail::Owned<MemplugHostManager, memplug_host_manager_destroy> {
  public:
    using Owned::Owned;

    /// Creates a manager, after checking the library implements this
    /// header's C API.
    static Manager create() {
        check(MEMPLUG_HOST_CHECK_API());
        MemplugHostManager m{};
        check(memplug_host_manager_create(&m));
        return Manager(m);
    }
    void load_plugin(const std::string &path) { check(memplug_host_manager_load_plugin(h_, path.c_str())); }
    /// Loads with options: `check_overlaps` is one `MEMPLUG_HOST_OVERLAPS_*`
    /// value (which blocks are checked against the live ones), `sha256` an
    /// expected digest ("" for none).
    void load_plugin(const std::string &path, uint32_t check_overlaps, bool allow_writable_by_others = false,
                     const std::string &sha256 = "") {
        MemplugHostLoadOptions o{};
        o.struct_size = sizeof o;
        o.check_overlaps = check_overlaps;
        o.allow_writable_by_others = allow_writable_by_others ? 1u : 0u;
        o.expected_sha256 = sha256.empty() ? nullptr : sha256.c_str();
        check(memplug_host_manager_load_plugin_with(h_, path.c_str(), &o));
    }
    void unload_plugin(const std::string &name) { check(memplug_host_manager_unload_plugin(h_, name.c_str())); }
    Mechanism select(MemplugDevice device, uint32_t required_caps) const {
        MemplugHostMechanism m{};
        check(memplug_host_manager_select(h_, device, required_caps, &m));
        return Mechanism(m);
    }
    /// The first mechanism serving `device` with the capabilities and
    /// meeting `needs` (memplug_host_manager_select_needing); throws
    /// MEMPLUG_HOST_STATUS_UNSUPPORTED naming what each candidate lacks.
    Mechanism select_needing(MemplugDevice device, uint32_t required_caps, const MemoryNeeds &needs) const {
        MemplugHostMemoryNeeds n = needs.to_c();
        MemplugHostMechanism m{};
        check(memplug_host_manager_select_needing(h_, device, required_caps, &n, &m));
        return Mechanism(m);
    }
    Mechanism find_mechanism(const std::string &name) const {
        MemplugHostMechanism m{};
        check(memplug_host_manager_find_mechanism(h_, name.c_str(), &m));
        return Mechanism(m);
    }
    Pool create_pool(const std::string &name, uint64_t capacity) const {
        MemplugHostPool p{};
        check(memplug_host_pool_create(h_, name.c_str(), capacity, &p));
        return Pool(p);
    }
    /// A pool under `parent` (memplug_host_pool_create_child): its charges
    /// must fit in it and in every ancestor. The child keeps its parent
    /// alive; `parent` may be destroyed first.
    Pool create_child_pool(const Pool &parent, const std::string &name, uint64_t capacity) const {
        MemplugHostPool p{};
        check(memplug_host_pool_create_child(h_, parent.get(), name.c_str(), capacity, &p));
        return Pool(p);
    }
    Binding bind(const Mechanism &m, const Pool &p, const BindingOptions &o = {}) const {
        auto opts = detail::sized<MemplugHostBindingOptions>();
        opts.alloc_class = o.alloc_class;
        opts.holder = o.holder ? o.holder->get() : MemplugHostHolder{};
        opts.wait_ns = static_cast<uint64_t>(o.wait.count());
        opts.hints = o.hints;
        opts.export_types = o.export_types;
        opts.page_size = o.page_size;
        opts.location_kind = o.location.kind;
        opts.location_id = o.location.id;
        MemplugHostBinding b{};
        check(memplug_host_binding_create(h_, m.get(), p.get(), &opts, &b));
        return Binding(b);
    }
    Fence fence_from_query(const std::string &name, std::function<bool()> query) const {
        return Fence::from_query(h_, name, std::move(query));
    }
    MemplugHostPollReport poll() const {
        auto r = detail::sized<MemplugHostPollReport>();
        check(memplug_host_manager_poll(h_, &r));
        return r;
    }
    /// Waits up to `timeout` for queued frees; returns how many are left.
    uint64_t drain(std::chrono::nanoseconds timeout) const {
        uint64_t left = 0;
        check(memplug_host_manager_drain(h_, static_cast<uint64_t>(timeout.count()), &left));
        return left;
    }
    /// Replaces `old` by `successor` (same device;
    /// memplug_host_manager_replace): `old` retires and bindings asked of it
    /// are made on `successor`; with `unload_old_plugin`, `old`'s plugin is
    /// unloaded once all its contexts have terminated (a later poll).
    void replace(const Mechanism &old, const Mechanism &successor, const std::string &reason,
                 bool unload_old_plugin = false) const {
        check(memplug_host_manager_replace(h_, old.get(), successor.get(), reason.c_str(), unload_old_plugin));
    }
    /// Terminates a lost or retiring mechanism's context within `timeout`
    /// and returns what was settled (memplug_host_manager_terminate; throws
    /// MEMPLUG_HOST_STATUS_TIMEOUT / _BUSY / _INVALID_STATE).
    MemplugHostSettlement terminate(const Mechanism &m, std::chrono::nanoseconds timeout) const {
        auto s = detail::sized<MemplugHostSettlement>();
        check(memplug_host_manager_terminate(h_, m.get(), static_cast<uint64_t>(timeout.count()), &s));
        return s;
    }
    /// The number of mechanisms of every loaded plugin.
    size_t mechanism_count() const {
        size_t n = 0;
        check(memplug_host_manager_mechanism_count(h_, &n));
        return n;
    }
};

} // namespace memplug

#endif // MEMPLUG_HPP
