// memplug_node.hpp: the C++ wrapper of one budget across processes
// (memplug_host.h, C API 1.3), beside memplug.hpp and in its style:
// move-only owners whose destructors give back, memplug::Error on every
// failure, the C structs as the answers.
//
//   auto node = memplug::NodeAuthority::start(manager, "/tmp/n.sock", {{"cpu0", 8ull << 30}});
//   auto pool = manager.create_pool("cpu0", 0);          // capacity: what is leased
//   auto link = memplug::NodeLink::join(manager, "/tmp/n.sock", {{"cpu0", &pool, 1}});
//   ... allocations past the held budget lease chunks; other processes'
//   ... pressure reaches this pool's holders as ordinary tickets
//   MemplugHostNodeLinkStats s = link.stats();
//
// Destroying a link leaves the node (idle budget goes back); destroying an
// authority stops it (members keep what they hold and rejoin the next one).
#ifndef MEMPLUG_NODE_HPP
#define MEMPLUG_NODE_HPP

#include "memplug.hpp"

#include <chrono>
#include <initializer_list>
#include <string>
#include <vector>

namespace memplug {

namespace detail {
/// The text protocol of memplug_host_stats_json: asks the size, then the
/// text; asks again if it grew in between.
template <class F> std::string node_text(F call) {
    for (int tries = 0;; tries++) {
        size_t need = 0;
        MemplugHostStatus s = call(nullptr, 0, &need);
        if (s == MEMPLUG_HOST_STATUS_OK) return std::string();
        if (s != MEMPLUG_HOST_STATUS_BUFFER_TOO_SMALL) check(s);
        std::string text(need, '\0');
        size_t written = 0;
        s = call(&text[0], text.size(), &written);
        if (s == MEMPLUG_HOST_STATUS_OK) {
            text.resize(written);
            return text;
        }
        if (s != MEMPLUG_HOST_STATUS_BUFFER_TOO_SMALL || tries == 3) check(s);
    }
}
} // namespace detail

/// One pool to join: its name at the authority, the pool (of the same
/// manager), its holders' priority against other processes', and the
/// classes of memory it holds (`node_classes({MEMPLUG_HOST_CLASS_KV})`; 0:
/// any): among processes of one priority, the authority presses those that
/// declared a request's class first, then the others.
struct NodeDevice {
    std::string device;
    const Pool *pool = nullptr;
    uint32_t priority = 0;
    uint32_t classes = 0;
};

/// A `NodeDevice::classes` mask of `classes` (`MEMPLUG_HOST_CLASS_*`).
inline uint32_t node_classes(std::initializer_list<uint32_t> classes) {
    uint32_t mask = 0;
    for (uint32_t c : classes) mask |= c < 32 ? (1u << c) : 0u;
    return mask;
}

/// A device an authority governs and its capacity in bytes.
struct NodeCapacity {
    std::string device;
    uint64_t capacity = 0;
};

/// A manager's pools joined to a node authority; the destructor leaves.
class NodeLink : public detail::Owned<MemplugHostNodeLink, memplug_host_node_link_leave> {
  public:
    using Owned::Owned;

    /// memplug_host_manager_join_node: zero fields of `options` (or its
    /// default) take the library's defaults.
    static NodeLink join(const Manager &manager, const std::string &socket, const std::vector<NodeDevice> &devices,
                         MemplugHostNodeJoinOptions options = detail::sized<MemplugHostNodeJoinOptions>()) {
        std::vector<MemplugHostNodeDevice> c;
        for (const auto &d : devices) {
            MemplugHostNodeDevice e{};
            e.device = d.device.c_str();
            e.pool = d.pool != nullptr ? d.pool->get() : MemplugHostPool{};
            e.priority = d.priority;
            e.classes = d.classes;
            c.push_back(e);
        }
        MemplugHostNodeLink l{};
        check(memplug_host_manager_join_node(manager.get(), socket.c_str(), c.data(), c.size(), &options, &l));
        return NodeLink(l);
    }
    /// This process's side of the books.
    MemplugHostNodeLinkStats stats() const {
        auto s = detail::sized<MemplugHostNodeLinkStats>();
        check(memplug_host_node_link_stats(h_, &s));
        return s;
    }
    bool connected() const { return stats().connected != 0; }
    /// The authority's last refusal to this link ("" for none).
    std::string last_error() const {
        return detail::node_text([&](char *b, size_t n, size_t *w) { return memplug_host_node_link_last_error(h_, b, n, w); });
    }
    /// The authority's books (JSON, or Prometheus text), asked over the link.
    std::string status(bool prometheus = false, std::chrono::milliseconds timeout = std::chrono::seconds(5)) const {
        uint32_t f = prometheus ? MEMPLUG_HOST_NODE_STATUS_PROMETHEUS : MEMPLUG_HOST_NODE_STATUS_JSON;
        uint64_t ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count());
        return detail::node_text(
            [&](char *b, size_t n, size_t *w) { return memplug_host_node_link_status(h_, f, ns, b, n, w); });
    }
};

/// A node authority served by this process; the destructor stops it.
class NodeAuthority : public detail::Owned<MemplugHostNodeAuthority, memplug_host_node_authority_stop> {
  public:
    using Owned::Owned;

    /// memplug_host_manager_start_node_authority.
    static NodeAuthority start(const Manager &manager, const std::string &socket,
                               const std::vector<NodeCapacity> &devices,
                               MemplugHostNodeAuthorityOptions options =
                                   detail::sized<MemplugHostNodeAuthorityOptions>()) {
        std::vector<MemplugHostNodeCapacity> c;
        for (const auto &d : devices) c.push_back(MemplugHostNodeCapacity{d.device.c_str(), d.capacity});
        MemplugHostNodeAuthority a{};
        check(memplug_host_manager_start_node_authority(manager.get(), socket.c_str(), c.data(), c.size(), &options,
                                                        &a));
        return NodeAuthority(a);
    }
    /// The books: JSON, or Prometheus text.
    std::string status(bool prometheus = false) const {
        uint32_t f = prometheus ? MEMPLUG_HOST_NODE_STATUS_PROMETHEUS : MEMPLUG_HOST_NODE_STATUS_JSON;
        return detail::node_text(
            [&](char *b, size_t n, size_t *w) { return memplug_host_node_authority_status(h_, f, b, n, w); });
    }
};

} // namespace memplug

#endif
