// memplug_cache.hpp: the C++ wrapper of caching bindings (memplug_host.h,
// C API 1.2), beside memplug.hpp and in its style: move-only owners whose
// destructors give back, memplug::Error on every failure.
//
//   auto cache = memplug::Cache::create(manager, mechanism, pool,
//                                       memplug::CacheOptions{}.with_class(MEMPLUG_HOST_CLASS_ACTIVATIONS));
//   memplug::CachedAllocation a = cache.allocate(bytes, 256, stream_id);
//   ... a.free_on(stream_id, {&fence});   // or let it go: reusable at once
//
// A block freed on a stream is reused at once by requests on that stream
// and by others only once its fences complete. Idle blocks stay charged to
// the pool under the cache's own holder and are given back first under
// pressure (Cache::trim gives them back on demand).
#ifndef MEMPLUG_CACHE_HPP
#define MEMPLUG_CACHE_HPP

#include "memplug.hpp"

namespace memplug {

/// A block of a caching binding; the destructor gives it back to the cache
/// (reusable by anyone at once), free_on() gives it back behind fences.
class CachedAllocation : public detail::Owned<MemplugHostCachedAllocation, memplug_host_cached_free> {
  public:
    CachedAllocation() noexcept = default;
    CachedAllocation(MemplugHostCachedAllocation h, uint64_t addr) noexcept : Owned(h), addr_(addr) {}
    CachedAllocation(CachedAllocation &&) noexcept = default;
    CachedAllocation &operator=(CachedAllocation &&) noexcept = default;

    uint64_t addr() const noexcept { return addr_; }
    template <class T> T *data() const noexcept { return reinterpret_cast<T *>(static_cast<uintptr_t>(addr_)); }
    /// Its address and the size requested.
    MemplugHostAllocationInfo info() const {
        auto i = detail::sized<MemplugHostAllocationInfo>();
        check(memplug_host_cached_allocation_info(h_, &i));
        return i;
    }
    /// Gives the block back behind `fences` on `stream` (0: no stream):
    /// reused at once on `stream`, by others once the fences complete.
    void free_on(uint64_t stream, const std::vector<const Fence *> &fences) {
        auto hs = handles_of(fences);
        check(memplug_host_cached_free_on(h_, stream, hs.data(), hs.size()));
        release();
    }

  private:
    uint64_t addr_ = 0;
};

/// How a cache is made: its binding's class, wait and placement
/// (BindingOptions without a holder: the cache registers its own), its
/// holder's name and priority, its size limits and its idle policy (0:
/// defaults; see MemplugHostCacheOptions).
struct CacheOptions {
    BindingOptions binding{};
    std::string holder_name = "cache";
    uint32_t priority = 0;
    uint64_t max_block = 0;
    uint64_t min_alignment = 0;
    /// The most bytes kept idle (0: a quarter of the pool; UINT64_MAX: no
    /// cap; 1: keep nothing).
    uint64_t max_idle_bytes = 0;
    /// Blocks idle longer are given back (0: no age).
    std::chrono::nanoseconds max_idle_age{0};
    /// A fraction of the pool's capacity a miss keeps the pool under by
    /// giving idle blocks back first (0: never).
    double gc_threshold = 0.0;

    CacheOptions &with_class(uint32_t c) {
        binding.with_class(c);
        return *this;
    }
    CacheOptions &with_holder_name(std::string n) {
        holder_name = std::move(n);
        return *this;
    }
    CacheOptions &with_priority(uint32_t p) noexcept {
        priority = p;
        return *this;
    }
    CacheOptions &with_max_block(uint64_t bytes) noexcept {
        max_block = bytes;
        return *this;
    }
    CacheOptions &with_max_idle_bytes(uint64_t bytes) noexcept {
        max_idle_bytes = bytes;
        return *this;
    }
    CacheOptions &with_max_idle_age(std::chrono::nanoseconds age) noexcept {
        max_idle_age = age;
        return *this;
    }
    CacheOptions &with_gc_threshold(double fraction) noexcept {
        gc_threshold = fraction;
        return *this;
    }
};

/// A caching binding (memplug_host_cache_create); destroyed by the
/// destructor (its idle blocks are freed once every block handed out is
/// back).
class Cache : public detail::Owned<MemplugHostCache, memplug_host_cache_destroy> {
  public:
    using Owned::Owned;

    static Cache create(const Manager &m, const Mechanism &mech, const Pool &pool, const CacheOptions &o = {}) {
        if (o.binding.holder != nullptr) {
            throw Error(MEMPLUG_HOST_STATUS_INVALID_ARGUMENT, "a cache registers its own holder");
        }
        auto b = detail::sized<MemplugHostBindingOptions>();
        b.alloc_class = o.binding.alloc_class;
        b.wait_ns = static_cast<uint64_t>(o.binding.wait.count());
        b.hints = o.binding.hints;
        b.export_types = o.binding.export_types;
        b.page_size = o.binding.page_size;
        b.location_kind = o.binding.location.kind;
        b.location_id = o.binding.location.id;
        auto c = detail::sized<MemplugHostCacheOptions>();
        c.priority = o.priority;
        c.max_block = o.max_block;
        c.min_alignment = o.min_alignment;
        c.max_idle_bytes = o.max_idle_bytes;
        c.max_idle_age_ns = static_cast<uint64_t>(o.max_idle_age.count());
        c.gc_threshold = o.gc_threshold;
        MemplugHostCache h{};
        check(memplug_host_cache_create(m.get(), mech.get(), pool.get(), &b, o.holder_name.c_str(), &c, &h));
        return Cache(h);
    }

    /// `size` bytes for work on `stream` (0: the host's own use).
    CachedAllocation allocate(uint64_t size, uint64_t alignment = 256, uint64_t stream = 0) const {
        MemplugHostCachedAllocation a{};
        uint64_t addr = 0;
        check(memplug_host_cache_allocate(h_, size, alignment, stream, &a, &addr));
        return CachedAllocation(a, addr);
    }
    /// Frees idle blocks until `bytes` are given back (all by default);
    /// returns the bytes given back.
    uint64_t trim(uint64_t bytes = UINT64_MAX) const {
        uint64_t released = 0;
        check(memplug_host_cache_trim(h_, bytes, &released));
        return released;
    }
    /// Applies the idle policy now (age, cap, threshold); returns the
    /// bytes given back.
    uint64_t collect() const {
        uint64_t released = 0;
        check(memplug_host_cache_collect(h_, &released));
        return released;
    }
    MemplugHostCacheStats stats() const {
        auto s = detail::sized<MemplugHostCacheStats>();
        check(memplug_host_cache_stats(h_, &s));
        return s;
    }
};

} // namespace memplug

#endif // MEMPLUG_CACHE_HPP
