//! For each check of the catalogue (`catalog.rs`): the clause of
//! `include/memplug.h` it covers and what its failure usually means, for
//! `docs/conformance-checks.md` ([`crate::checks_markdown`]). An entry
//! keyed by a check's name wins over the entry of its group (the part of
//! the name before the dot); every group has one.

/// One entry: a check's name, or a group.
pub(crate) struct Meaning {
    pub key: &'static str,
    /// The header's words the check holds the plugin to (a struct, slot,
    /// constant or rule of `include/memplug.h`).
    pub clause: &'static str,
    /// The mistake that usually makes it fail.
    pub failure: &'static str,
}

const fn m(key: &'static str, clause: &'static str, failure: &'static str) -> Meaning {
    Meaning { key, clause, failure }
}

/// Group entries first, then checks.
pub(crate) const MEANINGS: &[Meaning] = &[
    // ---- groups ----
    m(
        "load",
        "MEMPLUG_ENTRY_SYMBOL_V1, MemplugEntryV1",
        "the library does not load (an unresolved symbol, another architecture) or does not export \
         memplug_plugin_v1 (no MEMPLUG_EXPORT, or a C++ name without extern \"C\")",
    ),
    m(
        "exports",
        "MEMPLUG_EXPORT: build plugins with -fvisibility=hidden so nothing else is exported",
        "built without -fvisibility=hidden, or a helper marked MEMPLUG_EXPORT",
    ),
    m(
        "negotiation",
        "MemplugEntryV1, MemplugHostInfo, MemplugNegotiation (the agreed minor: at most the smaller maximum, at \
         least the larger minimum); rules: struct_size prefixes",
        "the agreed minor taken from MEMPLUG_ABI_MINOR instead of both ranges, or the host info read as a \
         fixed-size struct",
    ),
    m(
        "descriptor",
        "MemplugPlugin, MemplugMechanism (each flag agrees with its table), MemplugNegotiation::plugin (the \
         descriptor of the agreed minor), MemplugProperties",
        "one static descriptor for every minor (a later minor's bits shown to an older host), or a flag without \
         its table",
    ),
    m(
        "allocator",
        "MemplugAllocator (properties, allocate, deallocate, memory_info), MemplugRequest, MemplugBlock",
        "a request field left unchecked (alignment, size, flags), or a block describing other memory than was made",
    ),
    m(
        "structs",
        "rules: a reader copies min(struct_size, sizeof); out-parameters are written only on success, never past \
         the struct_size the caller set",
        "a struct copied with the plugin's sizeof instead of the caller's struct_size, or an output written \
         before the call knows it succeeds",
    ),
    m(
        "identity",
        "MemplugObjectRef; MEMPLUG_STATUS_WRONG_MECHANISM, MEMPLUG_STATUS_WRONG_DEVICE, \
         MEMPLUG_STATUS_UNKNOWN_ALLOCATION",
        "an object looked up by its handle (or address) alone, without its mechanism id, device, object id, \
         address and size checked",
    ),
    m(
        "virtual_backing",
        "MemplugVirtualBacking (reserve, commit, decommit, committed_bytes, release)",
        "page state not kept per page (a double commit accepted, committed_bytes estimated), or a range not \
         checked against its reservation",
    ),
    m(
        "shared_mapping",
        "MemplugSharedMapping (create, map, unmap, retain, release; export_fd and import_fd since 1.1; \
         export_handle and import_handle since 1.2)",
        "references not counted per mapping, or a mapping not checked against the state of its range",
    ),
    m(
        "claims",
        "MEMPLUG_ATTR_* (a mechanism claims only what every object it makes has), the 1.2 memory descriptor of \
         MemplugProperties",
        "an attribute claimed for the device in general that this mechanism's memory does not have",
    ),
    m(
        "sync",
        "MemplugSync (stream_create, stream_destroy, enqueue_host_fn, fence_record, fence_query, fence_wait, \
         fence_destroy)",
        "a fence that does not track its stream's position, or a stream queue that does not run in order",
    ),
    m(
        "ordering",
        "MEMPLUG_CAP_QUEUED_BINDING (commit_on, decommit_on, map_on, unmap_on), MemplugSync::stream_wait_fence, \
         stream_adopt_typed, MemplugPeerAccess (1.2)",
        "a queued change made at the call instead of in stream order, or its fence recorded before the change",
    ),
    m(
        "copy",
        "MemplugSync::copy, MemplugProperties::copy_kinds, MEMPLUG_COPY_* (1.3)",
        "the copy made at the call instead of in stream order, or a refusal found after something was enqueued",
    ),
    m(
        "concurrency",
        "rules: Threads (every slot may be called from any thread, concurrently with any other slot)",
        "a table (handles, free list, counters) without a lock: two calls at once give one slot to two objects \
         or lose a count",
    ),
    m(
        "loss",
        "MEMPLUG_STATUS_DEVICE_LOST, MemplugHostServices::report_device_lost (1.2), \
         MemplugSync::enqueue_host_fn (exactly once)",
        "the loss latched per slot instead of per mechanism, reported to a host that did not offer services, or \
         DEVICE_LOST (15) answered to a host below 1.2",
    ),
    m(
        "lifecycle",
        "MemplugPlugin::live_objects (the host refuses to unload while it is non-zero), MemplugPlugin::unload",
        "a kind of object not counted (streams, fences, physical objects), or one leaked by a slot that failed \
         half-way",
    ),
    m(
        "messages",
        "MemplugMessageSink (written on the calling thread, before the slot returns, at most \
         MEMPLUG_MESSAGE_MAX bytes)",
        "a message written from a worker thread, after the slot returned, or with a length past its text",
    ),
    // ---- checks ----
    m(
        "negotiation.host_size_respected",
        "MemplugHostInfo::services (present when struct_size is at least MEMPLUG_HOST_INFO_SIZE_1_2)",
        "host->services read without looking at host->struct_size",
    ),
    m(
        "negotiation.null_arguments",
        "MemplugEntryV1",
        "the host info or the answer used before it is checked for NULL",
    ),
    m(
        "descriptor.minor_0_is_1_0",
        "MemplugNegotiation::plugin: the descriptor of the agreed minor, no capability bit a later minor defines",
        "one static descriptor for every minor, or properties written with the plugin's sizeof",
    ),
    m(
        "descriptor.minor_1_is_1_1",
        "MemplugNegotiation::plugin: the descriptor of the agreed minor, no capability bit a later minor defines",
        "one static descriptor for every minor, or properties written with the plugin's sizeof",
    ),
    m(
        "descriptor.identity_stable",
        "MemplugMechanism::identity (plugin-owned, immutable, valid until unload)",
        "the identity rebuilt or updated in place by later calls",
    ),
    m(
        "allocator.block_size_sane",
        "MemplugBlock::size (bytes actually obtained; a host refuses a block that claims far more than asked)",
        "the block's size taken from the device's reservation granularity or left uninitialised",
    ),
    m(
        "identity.double_free",
        "MemplugAllocator::deallocate (refuses already freed allocations and changes nothing)",
        "a handle without a generation: a freed handle is accepted again once its slot is reused",
    ),
    m(
        "identity.no_overlap",
        "MemplugBlock::addr",
        "one address given to two live objects (a free list that hands out a block twice)",
    ),
    m(
        "shared_mapping.export_is_fresh_fd",
        "MemplugSharedMapping::export_fd: a descriptor made for this call, never one the plugin keeps, closes \
         later or shares",
        "the object's own descriptor handed out, a dup the plugin keeps and closes later, or a number that is \
         not the plugin's",
    ),
    m(
        "shared_mapping.import_lent_fd",
        "import_fd and import_handle: the caller keeps fd; a descriptor the mechanism cannot use is \
         INVALID_ARGUMENT",
        "the lent descriptor closed by the plugin, or any file (an ordinary file, a pipe) taken as memory",
    ),
    m(
        "shared_mapping.typed_export_refusals",
        "MemplugSharedMapping::export_handle and import_handle: a kind not offered is UNSUPPORTED",
        "a handle kind looked at after the descriptor it carries, or not at all",
    ),
    m(
        "claims.read_only_enforced",
        "MEMPLUG_ATTR_READ_ONLY_ENFORCED",
        "a read-only view mapped writable",
    ),
    m("claims.zero_filled", "MEMPLUG_ATTR_ZERO_FILLED", "freed memory handed out again without clearing"),
    m(
        "claims.pinned_locked",
        "MEMPLUG_ATTR_PINNED (never paged out or moved)",
        "PINNED claimed for memory that is not locked (mlock, or a driver's own pinning)",
    ),
    m(
        "sync.streams",
        "MemplugSync::stream_destroy (blocks until the work already submitted has run)",
        "stream_destroy that returns before its queue ran, or throws the queue away",
    ),
    m(
        "sync.enqueue_refusal",
        "MemplugSync::enqueue_host_fn: exactly once when it returns OK, never when it returns a failure",
        "a refused host function still run (or kept and run later)",
    ),
    m(
        "sync.wait_forever",
        "MemplugSync::fence_wait: UINT64_MAX waits without limit",
        "the deadline computed as now + timeout_ns in 64 bits, which wraps",
    ),
    m(
        "sync.fence_after_stream_destroy",
        "MemplugSync::stream_destroy: fences recorded on it stay valid and complete",
        "fences freed with their stream",
    ),
    m(
        "sync.fence_monotonic",
        "MemplugSync::fence_query: monotonic, once complete it stays complete",
        "a fence compared with a counter that is reset or reused",
    ),
    m(
        "ordering.release_waits_for_work",
        "MemplugVirtualBacking::decommit_on: it must not race device work still using the range",
        "the range taken away at the call, with the fence recorded after it",
    ),
    m(
        "ordering.peer_access",
        "MemplugPeerAccess::can_access_peer and set_peer_access",
        "an access answer with WRITE without READ, or left unwritten on OK",
    ),
    m(
        "loss.host_fns_run_once",
        "MemplugSync::enqueue_host_fn: exactly once when it returns OK, a loss or not",
        "host functions queued before the loss dropped when it is latched",
    ),
    m(
        "loss.none_below_1_2",
        "MEMPLUG_STATUS_DEVICE_LOST: a plugin that agreed on a minor below 1.2 never returns it",
        "the lost status not chosen by the agreed minor (a host below 1.2 reads 15 as INTERNAL)",
    ),
    m(
        "loss.unknown_mechanism",
        "MemplugHostServices::report_device_lost: an id the plugin did not publish is WRONG_MECHANISM",
        "a loss reported for an id the plugin never published",
    ),
    m(
        "messages.sink_after_return",
        "MemplugMessageSink: host-owned, valid only for the duration of the call it is passed to",
        "a sink pointer kept (by a worker or in a struct) and written after the slot returned",
    ),
    m(
        "messages.null_sink",
        "MemplugMessageSink: may be NULL, in which case the plugin writes nothing",
        "the sink used without a NULL check",
    ),
    m(
        "lifecycle.unload_ready",
        "MemplugPlugin::live_objects, unload",
        "an object leaked, so live_objects never returns to 0 (often after a concurrency check corrupted a count)",
    ),
];

/// The entry of `name`: its own, else its group's.
pub(crate) fn meaning_of(name: &str) -> Option<&'static Meaning> {
    let group = name.split('.').next().unwrap_or(name);
    MEANINGS.iter().find(|m| m.key == name).or_else(|| MEANINGS.iter().find(|m| m.key == group))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CHECKS;

    #[test]
    fn every_check_has_a_meaning_and_every_entry_names_a_check_or_a_group() {
        for c in CHECKS {
            assert!(meaning_of(c.name).is_some(), "{} has no entry (nor its group)", c.name);
        }
        for e in MEANINGS {
            let known = CHECKS.iter().any(|c| c.name == e.key || c.name.split('.').next() == Some(e.key));
            assert!(known, "entry {} names no check or group", e.key);
            assert!(!e.clause.is_empty() && !e.failure.is_empty(), "{}", e.key);
        }
        assert_eq!(meaning_of("sync.wait_forever").unwrap().key, "sync.wait_forever");
        assert_eq!(meaning_of("sync.in_order").unwrap().key, "sync");
    }
}
