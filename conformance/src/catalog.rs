//! The list of checks: every name a report can carry, in the order a run
//! reports them, with what each verifies (`memplug_conformance::CHECKS`).

/// One entry of the check list.
#[derive(Clone, Copy, Debug)]
pub struct CheckInfo {
    pub name: &'static str,
    /// Whether it runs once per mechanism.
    pub per_mechanism: bool,
    pub verifies: &'static str,
}

impl CheckInfo {
    /// The clause of `include/memplug.h` the check holds a plugin to
    /// (`meanings.rs`).
    pub fn clause(&self) -> &'static str {
        crate::meanings::meaning_of(self.name).map_or("", |m| m.clause)
    }

    /// What a failure of the check usually means (`meanings.rs`).
    pub fn failure_means(&self) -> &'static str {
        crate::meanings::meaning_of(self.name).map_or("", |m| m.failure)
    }
}

const fn plugin_wide(name: &'static str, verifies: &'static str) -> CheckInfo {
    CheckInfo { name, per_mechanism: false, verifies }
}

const fn per_mechanism(name: &'static str, verifies: &'static str) -> CheckInfo {
    CheckInfo { name, per_mechanism: true, verifies }
}

/// Every check, in the order a run reports them. Names are stable.
pub const CHECKS: &[CheckInfo] = &[
    plugin_wide("load.open", "the file opens as a shared library with every symbol resolved (RTLD_NOW)"),
    plugin_wide("load.entry_symbol", "memplug_plugin_v1 is defined"),
    plugin_wide(
        "exports.only_entry_symbols",
        "the dynamic symbol table exports nothing but memplug_plugin_v<N> entry symbols",
    ),
    plugin_wide(
        "negotiation.accepts_host",
        "a host speaking 1.0..=1.<newest> (a 1.2 host info with the kit's services table) gets OK, a \
         descriptor, an agreed minor in the common range, and nothing written past the host's struct_size",
    ),
    plugin_wide(
        "negotiation.host_range_above",
        "a host whose minors all lie above the plugin's is refused with VERSION_MISMATCH",
    ),
    plugin_wide(
        "negotiation.host_range_below",
        "a host range ending at the plugin's oldest minor agrees on it; one ending below it is refused \
         with VERSION_MISMATCH",
    ),
    plugin_wide(
        "negotiation.host_range_wider",
        "a host range reaching past the plugin's newest minor agrees on a minor the plugin speaks",
    ),
    plugin_wide(
        "negotiation.refuses_wrong_major",
        "hosts saying major 0 or 2 are refused with VERSION_MISMATCH",
    ),
    plugin_wide(
        "negotiation.short_host_struct",
        "host info shorter than ABI 1.0 (struct_size 0, 12) is refused with INVALID_ARGUMENT",
    ),
    plugin_wide(
        "negotiation.long_host_struct",
        "host info longer than the plugin knows, garbage after the fields the kit knows, is accepted",
    ),
    plugin_wide(
        "negotiation.host_size_respected",
        "a 24-byte (ABI 1.0/1.1) host info offering up to 1.1 or 1.<newest>, ending at an inaccessible page, \
         is negotiated without a read past its struct_size: no 1.2 services field is looked for (probed in a \
         child)",
    ),
    plugin_wide(
        "negotiation.short_out",
        "an answer struct shorter than ABI 1.0 is refused with INVALID_ARGUMENT and not written past",
    ),
    plugin_wide(
        "negotiation.null_arguments",
        "NULL host info or NULL answer is refused with INVALID_ARGUMENT (probed in a child)",
    ),
    plugin_wide(
        "descriptor.plugin",
        "plugin struct_size, major 1, minor range, name, version, live_objects, mechanism list",
    ),
    plugin_wide(
        "descriptor.mechanisms",
        "every mechanism: struct_size, name (NUL-terminated UTF-8), non-zero id; ids and names unique",
    ),
    per_mechanism(
        "descriptor.capabilities",
        "allocator flag and pointer present; every optional flag agrees with its pointer; \
         MEMPLUG_CAP_SHARED_EXPORT only with shared mapping and an agreed minor >= 1, \
         MEMPLUG_CAP_TYPED_EXPORT only with shared mapping and an agreed minor >= 2; no bit the plugin's \
         newest minor does not define",
    ),
    per_mechanism(
        "descriptor.minor_0_is_1_0",
        "negotiated with a host speaking only 1.0, the mechanism's descriptor sets no capability bit outside \
         1.0's (MEMPLUG_CAP_SHARED_EXPORT, MEMPLUG_CAP_TYPED_EXPORT, unknown ones), and properties asked at the \
         1.0 size write nothing past it",
    ),
    per_mechanism(
        "descriptor.minor_1_is_1_1",
        "negotiated with a host speaking 1.0..=1.1, the mechanism's descriptor sets no capability bit 1.2 \
         added (MEMPLUG_CAP_TYPED_EXPORT), and properties asked at the 1.1 size write nothing of the 1.2 \
         memory descriptor past it",
    ),
    per_mechanism(
        "descriptor.device",
        "the device kind is one the agreed minor defines: 1.0's CPU and CUDA below 1.2; at 1.2 every DLPack \
         kind or one in the vendor range",
    ),
    per_mechanism(
        "descriptor.vtables",
        "each published sub-vtable is at least its 1.0 size with every required slot non-NULL",
    ),
    per_mechanism(
        "descriptor.properties",
        "properties (at the 1.2 size when the agreed minor is 2): OK, alignments and granularity powers of \
         two, min <= max, nothing written past struct_size",
    ),
    per_mechanism(
        "descriptor.memory_descriptor",
        "ABI 1.2: properties write the memory descriptor, and it is self-consistent: recommended_granularity \
         zero or a power-of-two multiple of the granularity; page sizes this kernel offers (CPU) or plausible, \
         the smallest no larger than the granularity; attributes, export kinds and flags of known bits, \
         HOST_COHERENT only when host-visible; export kinds only with shared mapping and an export slot, \
         at least one with MEMPLUG_CAP_TYPED_EXPORT, a descriptor kind with MEMPLUG_CAP_SHARED_EXPORT; \
         location kind known or a vendor's, its id zero where it names nothing, an existing NUMA node",
    ),
    per_mechanism(
        "descriptor.identity",
        "ABI 1.2, when the mechanism points at an identity: struct_size >= 48, only known valid bits, fields \
         not named in valid zero, a non-nil UUID, a PCI address in range, an existing NUMA node (a CPU \
         device's ordinal)",
    ),
    per_mechanism(
        "descriptor.identity_stable",
        "ABI 1.2, when the mechanism points at an identity: its bytes stay the same through properties, allocate \
         and deallocate, reserve and release (plugin-owned and immutable until unload)",
    ),
    per_mechanism(
        "descriptor.page_size_requests",
        "ABI 1.2: allocate, reserve and create naming a page size the mechanism does not publish, or no power \
         of two, are refused with INVALID_ARGUMENT and make nothing; naming the smallest one it publishes they \
         are served",
    ),
    per_mechanism(
        "allocator.usable",
        "an allocation is at least the size asked, non-NULL, readable and writable (CPU), and frees",
    ),
    per_mechanism(
        "allocator.alignment",
        "every power of two from 1 to max_alignment is honoured (and min_alignment always)",
    ),
    per_mechanism(
        "allocator.bad_alignment",
        "alignments 0, 3 and 2 * max_alignment are refused with INVALID_ARGUMENT, nothing allocated",
    ),
    per_mechanism("allocator.zero_size", "size 0 is refused with INVALID_ARGUMENT, nothing allocated"),
    per_mechanism(
        "allocator.huge_size",
        "sizes 2^62, 2^63 and 2^64-1 are refused with OUT_OF_MEMORY or INVALID_ARGUMENT, no crash",
    ),
    per_mechanism(
        "allocator.unknown_flags",
        "request flags unknown to 1.0 are refused with INVALID_ARGUMENT",
    ),
    per_mechanism(
        "allocator.memory_info",
        "memory_info, when published, is OK with 0 < total and free <= total (a published slot must not \
         answer UNSUPPORTED)",
    ),
    per_mechanism(
        "allocator.class_tags",
        "ABI 1.1: requests tagged with every class, and an unknown class, are served alike",
    ),
    per_mechanism(
        "allocator.block_size_sane",
        "allocate (4 KiB), reserve and create report request <= size <= round_up(request, max(granularity, \
         max_alignment, 4096)) + max(granularity, 2 MiB)",
    ),
    per_mechanism(
        "structs.short_host_structs",
        "requests, object references and outputs shorter than 1.0 are refused with INVALID_ARGUMENT and \
         change nothing",
    ),
    per_mechanism(
        "structs.long_host_structs",
        "requests and object references longer than 1.0, garbage after the prefix, are accepted",
    ),
    per_mechanism(
        "identity.wrong_mechanism",
        "a reference naming another mechanism id is refused with WRONG_MECHANISM; live_objects unchanged",
    ),
    per_mechanism(
        "identity.wrong_device",
        "a reference or request naming another device is refused with WRONG_DEVICE; live_objects unchanged",
    ),
    per_mechanism(
        "identity.unknown_allocation",
        "forged handles, never-issued handles and altered object ids are refused with UNKNOWN_ALLOCATION",
    ),
    per_mechanism(
        "identity.double_free",
        "freeing twice is refused with UNKNOWN_ALLOCATION; live_objects unchanged",
    ),
    per_mechanism(
        "identity.reservation",
        "reservations: forged, foreign and released references are refused with their codes",
    ),
    per_mechanism(
        "identity.no_overlap",
        "64 live allocations of mixed sizes and 4 live reservations: no two address ranges overlap (and, on \
         CPU devices, no two show the same memory)",
    ),
    per_mechanism(
        "virtual_backing.reserve",
        "reserve: granularity-aligned address, size rounded up to the granularity, nothing committed; \
         zero and huge sizes refused",
    ),
    per_mechanism(
        "virtual_backing.accounting",
        "committed_bytes is exact through commits, decommits and release",
    ),
    per_mechanism(
        "virtual_backing.residency",
        "committed pages are mapped read-write and resident once touched; decommitted pages are \
         inaccessible and not resident; a recommit reads zeros (CPU devices)",
    ),
    per_mechanism(
        "virtual_backing.out_of_range",
        "ranges past the end, overflowing, unaligned or empty are refused with OUT_OF_RANGE; committed_bytes \
         unchanged",
    ),
    per_mechanism(
        "virtual_backing.invalid_state",
        "double commit and decommit of uncommitted pages are refused with INVALID_STATE; nothing changes",
    ),
    per_mechanism(
        "virtual_backing.release_drops_mappings",
        "releasing a reservation that still has shared mappings drops their references: the object's own \
         release then brings live_objects back",
    ),
    per_mechanism(
        "shared_mapping.create",
        "create: size rounded up, address zero, zero and huge sizes refused; release frees it",
    ),
    per_mechanism(
        "shared_mapping.coherence",
        "a write through one view is read through another, including at an object offset (at 1.2 only with \
         MEMPLUG_PROP_MAPS_AT_OFFSETS: objects are otherwise mapped whole)",
    ),
    per_mechanism(
        "shared_mapping.read_only",
        "a read-only view reads the object, and a write through it kills a forked child with SIGSEGV or \
         SIGBUS",
    ),
    per_mechanism(
        "shared_mapping.invalid_state",
        "mapping over committed or mapped pages is refused with INVALID_STATE; unmapping what is not a \
         mapping is refused",
    ),
    per_mechanism(
        "shared_mapping.mapped_not_committed",
        "committed_bytes counts what commit committed and never a mapped range, before and after unmap",
    ),
    per_mechanism(
        "shared_mapping.out_of_range",
        "object or reservation ranges out of bounds are refused with OUT_OF_RANGE",
    ),
    per_mechanism(
        "shared_mapping.unknown_access",
        "access other than READ or READ|WRITE is refused with INVALID_ARGUMENT",
    ),
    per_mechanism(
        "shared_mapping.references",
        "an object lives while created, retained or mapped references remain; a release too many is \
         refused",
    ),
    per_mechanism(
        "shared_mapping.export_import",
        "ABI 1.1 MEMPLUG_CAP_SHARED_EXPORT: an exported descriptor imports as an object showing the same \
         memory; bad descriptors, oversized imports and forged exports are refused",
    ),
    per_mechanism(
        "shared_mapping.export_is_fresh_fd",
        "ABI 1.1: each export_fd is a new descriptor (never 0, 1 or 2): two differ, closing one leaves the \
         other usable, and it stays open on the same memory after the object's release and further calls",
    ),
    per_mechanism(
        "shared_mapping.physical_identity",
        "map, retain, release and export_fd of a physical object naming another mechanism, another device, \
         a forged handle, another object id or size, or a released object are refused with their codes; \
         nothing changes",
    ),
    per_mechanism(
        "shared_mapping.typed_export",
        "ABI 1.2 MEMPLUG_CAP_TYPED_EXPORT: for each kind export_types offers, an object made exportable as it \
         exports as a handle of that kind (a MEMFD a new /memfd: descriptor, two exports two descriptors), \
         nothing written past the handle's struct_size, and imports as an object showing the same memory",
    ),
    per_mechanism(
        "shared_mapping.typed_export_refusals",
        "ABI 1.2 MEMPLUG_CAP_TYPED_EXPORT: export_handle of a kind not offered (or unknown) is UNSUPPORTED, of \
         no kind or two kinds refused, of a forged object UNKNOWN_ALLOCATION; import_handle of a kind not \
         offered UNSUPPORTED, of a descriptor kind with fd -1 INVALID_ARGUMENT; nothing made",
    ),
    per_mechanism(
        "shared_mapping.export_kinds_requested",
        "ABI 1.2: create naming an export kind the mechanism does not offer is refused with UNSUPPORTED and \
         makes nothing; naming one it offers is served",
    ),
    per_mechanism(
        "shared_mapping.import_lent_fd",
        "ABI 1.1 import_fd and ABI 1.2 import_handle (each descriptor kind offered): an ordinary file on disk and a \
         pipe are refused, never imported as memory; an exported descriptor imports; after every import, refused \
         or not, the descriptor the kit lent is still open on the same file (the plugin keeps a dup, never closes \
         the caller's)",
    ),
    per_mechanism(
        "claims.read_only_enforced",
        "ABI 1.2, MEMPLUG_ATTR_READ_ONLY_ENFORCED claimed (host-visible memory): a read-only view of a physical \
         object is mapped without write access and a write through it kills a forked child with SIGSEGV or \
         SIGBUS, leaving the object unchanged",
    ),
    per_mechanism(
        "claims.zero_filled",
        "ABI 1.2, MEMPLUG_ATTR_ZERO_FILLED claimed (host-visible memory): new allocations (also reusing freed, \
         dirtied memory), committed and recommitted ranges and new physical objects read as zero",
    ),
    per_mechanism(
        "claims.page_size_used",
        "ABI 1.2, a CPU mechanism claiming pages larger than the base page: a reservation made with each such \
         page size (up to 64 MiB), committed and touched, is backed by pages of that size (/proc/self/smaps: \
         KernelPageSize, or transparent huge pages)",
    ),
    per_mechanism(
        "claims.placement_used",
        "ABI 1.2, a host-visible mechanism located at a NUMA node: every page of an allocation and of a commit, \
         written, lives on that node (get_mempolicy MPOL_F_NODE|MPOL_F_ADDR)",
    ),
    per_mechanism(
        "claims.pinned_locked",
        "ABI 1.2, MEMPLUG_ATTR_PINNED claimed (host-visible memory): an allocation and a commit are mlocked (`lo` \
         in their areas' VmFlags in /proc/self/smaps) and every page is resident before anything touched it",
    ),
    per_mechanism(
        "sync.streams",
        "streams are created and destroyed; destroy waits for submitted work; a second destroy is refused",
    ),
    per_mechanism("sync.in_order", "host functions run in the order they were enqueued"),
    per_mechanism(
        "sync.fence_orders",
        "a fence behind a sleeping host function is NOT_READY until the function ran, then OK",
    ),
    per_mechanism(
        "sync.wait_timeout",
        "waiting on a fence behind blocked work returns TIMEOUT after about the timeout, then OK",
    ),
    per_mechanism(
        "sync.unknown_fence",
        "a fence handle never recorded, or already destroyed, is refused with UNKNOWN_ALLOCATION",
    ),
    per_mechanism(
        "sync.stream_adopt",
        "stream_adopt, when published, refuses a NULL native stream, or adopts it as a working stream (NULL is a \
         stream in CUDA: the legacy default stream) on which a fence completes",
    ),
    per_mechanism(
        "sync.fence_after_stream_destroy",
        "fences recorded on a stream stay valid after stream_destroy, report complete, and destroy",
    ),
    per_mechanism(
        "sync.wait_forever",
        "fence_wait(UINT64_MAX) on a fence behind ~50 ms of work returns OK, never TIMEOUT (under a \
         watchdog)",
    ),
    per_mechanism(
        "sync.fence_monotonic",
        "once a fence reported complete (query or wait) every later query reports complete, also while later \
         work on its stream is blocked",
    ),
    per_mechanism(
        "sync.enqueue_refusal",
        "a host function whose enqueue_host_fn was refused (stream 0, never made, forged, destroyed) never \
         runs; an accepted one runs exactly once",
    ),
    per_mechanism(
        "ordering.commit_on",
        "ABI 1.2 MEMPLUG_CAP_QUEUED_BINDING: commit_on and decommit_on on a stream return fences (counted live) \
         that complete, after which committed_bytes is exact and (host-visible memory) the range is read-write, \
         then inaccessible",
    ),
    per_mechanism(
        "ordering.map_on",
        "ABI 1.2 MEMPLUG_CAP_QUEUED_BINDING with shared mapping: map_on and unmap_on return fences that complete, \
         after which (host-visible memory) the mapping is read-write, then gone",
    ),
    per_mechanism(
        "ordering.release_waits_for_work",
        "ABI 1.2 MEMPLUG_CAP_QUEUED_BINDING, host memory: decommit_on (and unmap_on, with shared mapping) queued \
         behind a host function holding the stream leaves the range mapped read-write with its bytes while the \
         function holds it, and takes it away once its fence completes",
    ),
    per_mechanism(
        "ordering.queued_refusals",
        "ABI 1.2 MEMPLUG_CAP_QUEUED_BINDING: commit_on, decommit_on, map_on and unmap_on of ranges past the end, \
         straddling it or overflowing are OUT_OF_RANGE and a NULL out_fence INVALID_ARGUMENT, answered while the \
         stream is held, with no fence made and, once it drains, nothing committed",
    ),
    per_mechanism(
        "ordering.stream_wait_fence",
        "ABI 1.2, when stream_wait_fence is published: work enqueued on stream B after a wait on stream A's fence \
         does not run (B's fence NOT_READY) while A is held by a host function, and runs once A is released; a \
         fence never recorded is refused",
    ),
    per_mechanism(
        "ordering.stream_adopt_typed",
        "ABI 1.2, when stream_adopt_typed is published: a native kind no minor defines is UNSUPPORTED and makes \
         nothing",
    ),
    per_mechanism(
        "ordering.peer_access",
        "ABI 1.2 MEMPLUG_CAP_PEER_ACCESS: can_access_peer answers OK having written only READ/WRITE bits, never \
         WRITE without READ (or WRONG_DEVICE) for the device itself and others; set_peer_access refuses ranges out of a reservation with OUT_OF_RANGE \
         and unknown access bits",
    ),
    per_mechanism(
        "copy.kinds",
        "ABI 1.3: properties asked at the 1.3 size say copy_kinds non-zero exactly when the copy slot is \
         published, with no bit a minor the kit knows does not define, written within struct_size; without \
         HOST, a copy from host memory is UNSUPPORTED",
    ),
    per_mechanism(
        "copy.bytes_exact",
        "ABI 1.3, when copy is published with DEVICE: a copy between two allocations at an odd offset and \
         length moves exactly those bytes and no byte around them (seen directly in CPU memory, else through \
         host memory with copies from and to it: MEMPLUG_COPY_HOST)",
    ),
    per_mechanism(
        "copy.ordering_host_fns",
        "ABI 1.3, when copy is published: on a stream held by a host function, a host function enqueued before \
         the copy writes its source and one after it reads its destination: nothing is copied while the \
         stream is held, and the reader sees the bytes the writer wrote",
    ),
    per_mechanism(
        "copy.ordering_fences",
        "ABI 1.3, when copy is published: a fence recorded after a copy on a held stream is not complete while \
         it is held, and once it completes the destination holds the copied bytes",
    ),
    per_mechanism(
        "copy.bounds",
        "ABI 1.3, when copy is published: ranges running past the end of an allocation (dst, src, both) and \
         into an uncommitted granule of a reservation are OUT_OF_RANGE, answered while the stream is held; the \
         committed granule is copied",
    ),
    per_mechanism(
        "copy.overlap",
        "ABI 1.3, when copy is published: ranges sharing a byte (either order, one byte, equal) are \
         INVALID_ARGUMENT; adjacent ranges are copied",
    ),
    per_mechanism(
        "copy.len_zero",
        "ABI 1.3, when copy is published: copies of 0 bytes (equal addresses, the end of an allocation) are OK \
         and change nothing; a copy on a destroyed stream is UNKNOWN_ALLOCATION",
    ),
    per_mechanism(
        "concurrency.allocator",
        "several threads allocating and freeing at once: every call succeeds (an OUT_OF_MEMORY is asked \
         again up to 3 times, 1 to 4 ms later, in every storm: running short for a moment is not a race), \
         no two live blocks overlap, live_objects balances",
    ),
    per_mechanism(
        "concurrency.virtual_backing",
        "several threads reserving, committing, decommitting and releasing at once balance",
    ),
    per_mechanism(
        "concurrency.sync",
        "several threads with their own streams and fences at once complete and balance",
    ),
    per_mechanism(
        "concurrency.shared_mapping",
        "several threads creating, mapping into their own reservations, unmapping, retaining and releasing \
         physical objects at once: every call succeeds, live_objects balances",
    ),
    per_mechanism(
        "loss.reported_through_services",
        "ABI 1.2, with a device-loss test trigger exported (LOSS_TRIGGERS), on a fresh instance: triggering the \
         loss delivers a report through the kit's services naming the mechanism, with a UTF-8 (pointer, length) \
         reason, and no report of a mechanism the plugin does not publish",
    ),
    per_mechanism(
        "loss.every_slot_device_lost",
        "ABI 1.2, with a test trigger: after the reported loss every published slot of the mechanism, called \
         with objects made before it, answers DEVICE_LOST (none OK), writes no output, runs no host function, \
         and nothing crashes or hangs",
    ),
    per_mechanism(
        "loss.host_fns_run_once",
        "ABI 1.2, with sync and a test trigger: host functions enqueue_host_fn accepted (OK) behind a held stream \
         before the loss each run exactly once once the stream is released after it (within the fence timeout)",
    ),
    per_mechanism(
        "loss.none_below_1_2",
        "with a test trigger, on a fresh instance negotiated with a host speaking only 1.0..=1.1 (a 24-byte host \
         info, no services): after the loss is triggered no slot answers DEVICE_LOST (15), a status ABI 1.2 \
         added that such a host reads as INTERNAL (DEVICE_UNAVAILABLE says the same to it), and no service is \
         called",
    ),
    per_mechanism(
        "lifecycle.live_objects",
        "live_objects counts every allocation, reservation, physical object, stream and fence exactly",
    ),
    plugin_wide(
        "loss.negotiation_reports",
        "a fresh instance negotiating with a 1.2 host calls no service during the entry (answered \
         INVALID_STATE), or re-reports once it returned or keeps the mechanism working; no service at a minor \
         below 1.2; reports name only published mechanisms, with valid reasons",
    ),
    plugin_wide(
        "loss.unknown_mechanism",
        "ABI 1.2, with a test trigger: triggering an id the plugin does not publish is refused, reports nothing \
         and latches no mechanism (the trigger then works for a published one)",
    ),
    plugin_wide("messages.present", "every refused call explained itself through the sink"),
    plugin_wide(
        "messages.bounded",
        "every message is at most MEMPLUG_MESSAGE_MAX bytes of UTF-8 with a non-NULL pointer",
    ),
    plugin_wide("messages.calling_thread", "every message was written on the thread that made the call"),
    plugin_wide(
        "messages.sink_after_return",
        "no message was written into a sink after the call that passed it returned (the kit keeps every sink \
         valid and records such writes)",
    ),
    plugin_wide(
        "messages.null_sink",
        "refused calls with a NULL sink, or a sink whose write is NULL, do not crash (probed in a child)",
    ),
    plugin_wide("structs.writes_within_size", "no call wrote an output past the struct_size the host set"),
    plugin_wide("structs.out_untouched_on_failure", "no failed call changed its output"),
    plugin_wide(
        "lifecycle.unload_ready",
        "live_objects is 0 once everything the kit made is released (then unload is called)",
    ),
];

/// `docs/conformance-checks.md`: every check of [`CHECKS`], in run order,
/// grouped by the part before its dot, with what it asserts. Generated
/// from this list (so it cannot drift: `conformance/tests/checks_doc.rs`
/// compares it with the committed file; `MEMPLUG_BLESS=1` rewrites it).
pub fn checks_markdown() -> String {
    let mut s = String::from(
        "# The conformance kit's checks\n\n\
         <!-- Generated from conformance/src/catalog.rs (memplug_conformance::checks_markdown) by \
         `MEMPLUG_BLESS=1 cargo test -p memplug-conformance --test checks_doc`; do not edit by hand. -->\n\n\
         Every check `memplug conformance PLUGIN` runs, in the order a report lists them, with what it \
         asserts, the clause of `include/memplug.h` it holds the plugin to, and the mistake that usually \
         makes it fail. A check runs once for the plugin (*plugin-wide*) or once per mechanism. A check is \
         skipped, saying why, only where the plugin lacks what it tests (a capability, a slot, a claim, a \
         minor), the host cannot see it (memory of a device that is not host-visible), or there is no \
         library file (`memplug conformance` on the copy of the CPU plugin linked into it: `load.open`, \
         `exports.only_entry_symbols`, `loss.*`); \
         [`conformance-json.md`](conformance-json.md) describes the report, \
         [`../abi-tests/MISBEHAVIOURS.md`](../abi-tests/MISBEHAVIOURS.md) the planted mistakes each check \
         catches.\n",
    );
    let mut group = "";
    for c in CHECKS {
        let g = c.name.split('.').next().unwrap_or("");
        if g != group {
            group = g;
            s += &format!(
                "\n## `{g}.*`\n\n| check | runs | asserts | header clause | a failure usually means |\n\
                 | --- | --- | --- | --- | --- |\n"
            );
        }
        let runs = if c.per_mechanism { "per mechanism" } else { "plugin-wide" };
        s += &format!(
            "| `{}` | {runs} | {} | {} | {} |\n",
            c.name,
            escape(c.verifies),
            escape(c.clause()),
            escape(c.failure_means())
        );
    }
    s
}

/// Markdown table cell text: `|` and the angle brackets of `<N>` or `<=`
/// escaped (a bare `<N>` would be read as an HTML tag).
fn escape(s: &str) -> String {
    s.replace('|', "\\|").replace('<', "&lt;").replace('>', "&gt;")
}
