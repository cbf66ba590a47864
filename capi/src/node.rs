//! One budget for every process on a device, from C (API 1.3): a
//! manager's root pools joined to a node authority (`memplug node serve`,
//! crate `memplug-node`), the link's statistics and the authority's books,
//! leaving; and an authority embedded in a C program.
//!
//! A joined pool's capacity is what the authority leased to this process
//! for its device: a grant inside it never leaves the process, a request
//! past it asks the authority (which may press other processes with
//! pressure tickets), and a ticket from the authority lowers the pool's
//! capacity, its holders asked exactly as for an in-process ticket. If the
//! authority goes away, the pools keep what they hold and the link joins
//! the next authority on the same socket.
//!
//! Links and authorities are handles of the manager that made them
//! (`Kind::Node`, one kind for both so the handle's four kind bits keep a
//! number free); destroying the manager leaves and stops them. The types
//! live here, not in `types.rs`, so that this API stands apart.

use crate::common::{MemplugHostManager, MemplugHostPool};
use crate::error::{boundary, c_str, require_non_null, Error, Result};
use crate::handle::Kind;
use crate::manager_tables::{self, pin, pin_manager, remove_drop, same_manager, PoolEntry};
use crate::observe::text_call;
use crate::status::MemplugHostStatus;
use crate::status::MemplugHostStatus as S;
use crate::struct_size::{read_sized, write_sized};
use memplug_node::{Authority, AuthorityConfig, LinkDevice, LinkOptions, NodeLink};
use memplug_sdk::prefix::Prefixed;
use std::ffi::c_char;
use std::io;
use std::time::Duration;

/// A process's link to a node authority (`memplug_host_manager_join_node`).
/// The zero handle names nothing.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemplugHostNodeLink {
    /// The handle's bits.
    pub id: u64,
}

/// A node authority served by this process
/// (`memplug_host_manager_start_node_authority`). The zero handle names
/// nothing.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemplugHostNodeAuthority {
    /// The handle's bits.
    pub id: u64,
}

/// One pool joined to the node: an element of the array
/// `memplug_host_manager_join_node` reads.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugHostNodeDevice {
    /// The device's name at the authority (`"cpu0"`, `"cuda0"`;
    /// NUL-terminated, read during the call only).
    pub device: *const c_char,
    /// A pool of the same manager (best a root pool created with capacity
    /// 0): its capacity becomes what the authority leases. A pool joins
    /// once for its life.
    pub pool: MemplugHostPool,
    /// Its holders' priority against other processes' on this device:
    /// lower gives way first.
    pub priority: u32,
    /// The classes of memory the pool holds: bit `1u <<
    /// MEMPLUG_HOST_CLASS_*` for each (0: any class). Among processes of
    /// one priority, the authority presses those that declared a request's
    /// class first, then the others (classes order, never exclude).
    /// Bits above `MEMPLUG_HOST_NODE_ALL_CLASSES` are
    /// `MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`.
    pub classes: u32,
}

/// Every class a `MemplugHostNodeDevice::classes` mask can name: bit
/// `1u << MEMPLUG_HOST_CLASS_*` for each of the five.
pub const MEMPLUG_HOST_NODE_ALL_CLASSES: u32 = 0x1f;

/// A C class mask (bits of `MEMPLUG_HOST_CLASS_*`) as the node's mask
/// (bits of `AllocationClass` discriminants: the two numberings differ —
/// `MEMPLUG_HOST_CLASS_OTHER` is 0 in C, `AllocationClass::Other` is 4).
fn node_classes(c_mask: u32) -> Result<u8> {
    let mut mask = 0u8;
    for bit in 0..32 {
        if c_mask & (1 << bit) != 0 {
            mask |= 1 << crate::binding::class_of(bit)? as u8;
        }
    }
    Ok(mask)
}

/// How a link behaves. Zeroed (with `struct_size` set), or NULL, it asks
/// for the defaults.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostNodeJoinOptions {
    /// `sizeof(MemplugHostNodeJoinOptions)`.
    pub struct_size: u32,
    /// Idle chunks kept per device before the rest goes back (0: the
    /// default, 1).
    pub keep_idle_chunks: u32,
    /// How often idle chunks go back and a lost authority is retried, in
    /// nanoseconds (0: the default, 20 ms; at least 1 ms).
    pub tick_ns: u64,
    /// How long a lease may press other processes for a request that has
    /// no deadline of its own, in nanoseconds (0: the default, 500 ms).
    pub press_without_deadline_ns: u64,
}

/// Size of `MemplugHostNodeJoinOptions` in API 1.3, where it first appeared.
pub const MEMPLUG_HOST_NODE_JOIN_OPTIONS_SIZE_1_3: u32 = 24;

/// A link's statistics: this process's side of the authority's books.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostNodeLinkStats {
    /// `sizeof(MemplugHostNodeLinkStats)`.
    pub struct_size: u32,
    /// 1 while an authority is connected, else 0 (the pools keep what
    /// they hold and the link joins the next authority).
    pub connected: u32,
    /// The bytes budget moves in (0 before the first join).
    pub chunk: u64,
    /// The bytes the joined pools hold (the sum of their capacities: what
    /// the authority counts as this process's).
    pub held: u64,
    /// The bytes of it in use.
    pub used: u64,
    /// Lease requests sent to the authority.
    pub leases_asked: u64,
    /// Lease requests granted.
    pub leases_granted: u64,
    /// Lease requests refused, unanswered or unsent.
    pub leases_refused: u64,
    /// Bytes obtained by leases.
    pub bytes_leased: u64,
    /// Idle bytes given back.
    pub bytes_returned: u64,
    /// Pressure tickets from the authority answered.
    pub tickets_answered: u64,
    /// Bytes those tickets released.
    pub bytes_released: u64,
    /// Times the link joined an authority (more than 1: an authority
    /// restarted and was rejoined).
    pub joins: u64,
}

/// Size of `MemplugHostNodeLinkStats` in API 1.3, where it first appeared.
pub const MEMPLUG_HOST_NODE_LINK_STATS_SIZE_1_3: u32 = 96;

/// One device an authority governs: an element of the array
/// `memplug_host_manager_start_node_authority` reads.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugHostNodeCapacity {
    /// The device's name (NUL-terminated, read during the call only).
    pub device: *const c_char,
    /// Its capacity in bytes, shared by every process that joins.
    pub capacity: u64,
}

/// A quota on a user's processes (`MEMPLUG_HOST_NODE_QUOTA_USER`).
pub const MEMPLUG_HOST_NODE_QUOTA_USER: u32 = 0;
/// A quota on a group's processes, by their primary group
/// (`MEMPLUG_HOST_NODE_QUOTA_GROUP`).
pub const MEMPLUG_HOST_NODE_QUOTA_GROUP: u32 = 1;

/// One quota an authority enforces: an element of the array
/// `MemplugHostNodeAuthorityOptions::quotas` points at. The most bytes (all
/// devices together) the processes of user `id` (`kind`
/// `MEMPLUG_HOST_NODE_QUOTA_USER`) or of primary group `id`
/// (`MEMPLUG_HOST_NODE_QUOTA_GROUP`) may lease, as `memplug node serve
/// --quota UID=BYTES` / `--group-quota GID=BYTES` set. A member under both
/// a user's and a group's quota gets the smaller room; a lease refused by
/// one says which quota bound.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemplugHostNodeQuota {
    /// `MEMPLUG_HOST_NODE_QUOTA_USER` or `_GROUP`.
    pub kind: u32,
    /// The user or group id (as the kernel gives it at connect).
    pub id: u32,
    /// The most bytes they may lease.
    pub bytes: u64,
}

/// How an authority is set up. Zeroed (with `struct_size` set), or NULL,
/// it asks for the defaults.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugHostNodeAuthorityOptions {
    /// `sizeof(MemplugHostNodeAuthorityOptions)`.
    pub struct_size: u32,
    /// The socket file's mode, which decides who may join (0: 0600, the
    /// owner only).
    pub mode: u32,
    /// Budget moves in multiples of this many bytes (0: 2 MiB).
    pub chunk: u64,
    /// How long a member has to answer a ticket before it is skipped and
    /// reported, in nanoseconds (0: 2 s).
    pub ticket_timeout_ns: u64,
    /// How long after it starts the authority leases nothing, so that the
    /// members of a previous authority on the socket rejoin and declare
    /// what they hold first, in nanoseconds (0: 250 ms; 1: none to speak
    /// of). A lease asked meanwhile waits for it within its own wait.
    pub rejoin_grace_ns: u64,
    /// `quota_count` quotas (NULL with 0: none), read during the call
    /// only. A kind other than `MEMPLUG_HOST_NODE_QUOTA_USER`/`_GROUP`, or
    /// an id listed twice for one kind, is `MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`.
    pub quotas: *const MemplugHostNodeQuota,
    /// The number of elements at `quotas` (at most 65536).
    pub quota_count: usize,
}

impl Default for MemplugHostNodeAuthorityOptions {
    fn default() -> Self {
        MemplugHostNodeAuthorityOptions {
            struct_size: 0,
            mode: 0,
            chunk: 0,
            ticket_timeout_ns: 0,
            rejoin_grace_ns: 0,
            quotas: std::ptr::null(),
            quota_count: 0,
        }
    }
}

/// Size of `MemplugHostNodeAuthorityOptions` in API 1.3 (the quotas were
/// appended while 1.3 was open: its first 32 bytes are still read, with
/// no quotas).
pub const MEMPLUG_HOST_NODE_AUTHORITY_OPTIONS_SIZE_1_3: u32 = 48;
/// The size it first had (no quotas), the shortest accepted.
const AUTHORITY_OPTIONS_FIRST_SIZE: u32 = 32;

/// Status text as JSON (`memplug_host_node_link_status`,
/// `memplug_host_node_authority_status`).
pub const MEMPLUG_HOST_NODE_STATUS_JSON: u32 = 0;
/// Status text as Prometheus text.
pub const MEMPLUG_HOST_NODE_STATUS_PROMETHEUS: u32 = 1;

// SAFETY (all three): `#[repr(C)]`, `Copy`, all-zero valid (a zeroed
// `quotas` is NULL with no elements); sizes asserted.
unsafe impl Prefixed for MemplugHostNodeJoinOptions {
    const SIZE_1_0: u32 = MEMPLUG_HOST_NODE_JOIN_OPTIONS_SIZE_1_3;
}
unsafe impl Prefixed for MemplugHostNodeLinkStats {
    const SIZE_1_0: u32 = MEMPLUG_HOST_NODE_LINK_STATS_SIZE_1_3;
}
unsafe impl Prefixed for MemplugHostNodeAuthorityOptions {
    const SIZE_1_0: u32 = AUTHORITY_OPTIONS_FIRST_SIZE;
}
const _: () = {
    use std::mem::size_of;
    assert!(size_of::<MemplugHostNodeJoinOptions>() == MEMPLUG_HOST_NODE_JOIN_OPTIONS_SIZE_1_3 as usize);
    assert!(size_of::<MemplugHostNodeLinkStats>() == MEMPLUG_HOST_NODE_LINK_STATS_SIZE_1_3 as usize);
    assert!(
        size_of::<MemplugHostNodeAuthorityOptions>() == MEMPLUG_HOST_NODE_AUTHORITY_OPTIONS_SIZE_1_3 as usize
    );
    assert!(size_of::<MemplugHostNodeDevice>() == 24);
    assert!(size_of::<MemplugHostNodeCapacity>() == 16);
    assert!(size_of::<MemplugHostNodeQuota>() == 16);
    assert!(
        std::mem::offset_of!(MemplugHostNodeAuthorityOptions, quotas)
            == AUTHORITY_OPTIONS_FIRST_SIZE as usize
    );
};

/// What a `Kind::Node` handle holds.
pub(crate) enum NodeEntry {
    Link(NodeLink),
    Authority(Authority),
}

/// An I/O error of the node as a status: the reason is kept in the message.
fn io_error(what: &str, e: io::Error) -> Error {
    use io::ErrorKind as K;
    let status = match e.kind() {
        K::NotFound | K::ConnectionRefused => S::NotFound,
        K::AlreadyExists | K::AddrInUse => S::AlreadyExists,
        K::TimedOut | K::WouldBlock => S::Timeout,
        K::InvalidInput => S::InvalidArgument,
        // The authority refused the join (an unknown device, a quota).
        K::PermissionDenied => S::CallbackRefused,
        _ => S::DeviceUnavailable,
    };
    Error::new(status, format!("{what}: {e}"))
}

fn duration_or(ns: u64, default: Duration) -> Duration {
    if ns == 0 {
        default
    } else {
        Duration::from_nanos(ns)
    }
}

/// A C array of `count` elements (NULL only with `count` 0) as a slice.
///
/// # Safety
/// `p` is NULL or readable for `count` elements.
unsafe fn array<'a, T>(p: *const T, count: usize, what: &str) -> Result<&'a [T]> {
    if count == 0 {
        return Err(Error::new(S::InvalidArgument, format!("{what}: at least one device is needed")));
    }
    if count > 1024 {
        return Err(Error::new(S::OutOfRange, format!("{what}: {count} devices (at most 1024)")));
    }
    require_non_null(p, what)?;
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, count) })
}

fn link_of<R>(link: MemplugHostNodeLink, f: impl FnOnce(&NodeLink) -> Result<R>) -> Result<R> {
    let (e, _) = pin::<NodeEntry>(link.id)?;
    match &*e {
        NodeEntry::Link(l) => f(l),
        NodeEntry::Authority(_) => {
            Err(Error::new(S::InvalidHandle, "the handle names a node authority, not a node link"))
        }
    }
}

fn authority_of<R>(a: MemplugHostNodeAuthority, f: impl FnOnce(&Authority) -> Result<R>) -> Result<R> {
    let (e, _) = pin::<NodeEntry>(a.id)?;
    match &*e {
        NodeEntry::Authority(x) => f(x),
        NodeEntry::Link(_) => {
            Err(Error::new(S::InvalidHandle, "the handle names a node link, not an authority"))
        }
    }
}

fn format_flag(format: u32) -> Result<bool> {
    match format {
        MEMPLUG_HOST_NODE_STATUS_JSON => Ok(false),
        MEMPLUG_HOST_NODE_STATUS_PROMETHEUS => Ok(true),
        f => Err(Error::new(
            S::InvalidArgument,
            format!("format {f} is not MEMPLUG_HOST_NODE_STATUS_JSON (0) or _PROMETHEUS (1)"),
        )),
    }
}

/// Joins `device_count` pools of `manager` (`devices`) to the node
/// authority at `socket_path`, a Unix socket (`memplug node serve --socket
/// P`, or `memplug_host_manager_start_node_authority`). Each pool's
/// capacity is first lowered to what it uses, which is declared to the
/// authority as held; from then on it is what the authority leases, in
/// chunks. `options` may be NULL (the defaults).
///
/// Refusals, each leaving every pool as it was: `MEMPLUG_HOST_STATUS_NOT_FOUND`
/// when nothing serves `socket_path`; `_CALLBACK_REFUSED` when the
/// authority refused the join (a device it does not govern, a quota; the
/// message has its reason); `_ALREADY_EXISTS` when a pool is already
/// joined (a pool joins once for its life) or appears twice;
/// `_INVALID_ARGUMENT` for no devices, an empty device name, a `classes`
/// naming no class, a short `struct_size` or a path too long for a socket
/// (about 107 bytes); `_WRONG_MANAGER` for a pool of another manager;
/// `_DEVICE_UNAVAILABLE` for other socket errors (the message has them).
/// A join waits at most 5 s for the authority's answer (`_TIMEOUT`).
///
/// Ownership: the caller owns the link (`memplug_host_node_link_leave`;
/// destroying the manager leaves too). Thread-safety: any thread.
///
/// # Safety
/// `socket_path` NULL or NUL-terminated; `devices` NULL or readable for
/// `device_count` elements, each `device` NULL or NUL-terminated;
/// `options` NULL or readable for its `struct_size`; `out_link` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_manager_join_node(
    manager: MemplugHostManager,
    socket_path: *const c_char,
    devices: *const MemplugHostNodeDevice,
    device_count: usize,
    options: *const MemplugHostNodeJoinOptions,
    out_link: *mut MemplugHostNodeLink,
) -> MemplugHostStatus {
    boundary("memplug_host_manager_join_node", || {
        // SAFETY: the caller's contract.
        let path = unsafe { c_str(socket_path, "socket_path") }?;
        require_non_null(out_link, "out_link")?;
        // SAFETY: the caller's contract.
        let devices = unsafe { array(devices, device_count, "devices") }?;
        let mut opts = LinkOptions::default();
        if !options.is_null() {
            // SAFETY: non-NULL; the caller's contract covers the size.
            let o = unsafe { read_sized(options, "MemplugHostNodeJoinOptions") }?;
            if o.keep_idle_chunks != 0 {
                opts.keep_idle_chunks = u64::from(o.keep_idle_chunks);
            }
            opts.tick = duration_or(o.tick_ns, opts.tick).max(Duration::from_millis(1));
            opts.press_without_deadline =
                duration_or(o.press_without_deadline_ns, opts.press_without_deadline);
        }
        let (_m, seat) = pin_manager(manager.id)?;
        let mut specs: Vec<LinkDevice> = Vec::with_capacity(devices.len());
        for (i, d) in devices.iter().enumerate() {
            // SAFETY: the caller's contract.
            let name = unsafe { c_str(d.device, "devices[].device") }?;
            if name.is_empty() {
                return Err(Error::new(
                    S::InvalidArgument,
                    format!("devices[{i}]: the device name is empty"),
                ));
            }
            if d.classes & !MEMPLUG_HOST_NODE_ALL_CLASSES != 0 {
                return Err(Error::new(
                    S::InvalidArgument,
                    format!(
                        "devices[{i}]: classes {:#x} name no class (MEMPLUG_HOST_NODE_ALL_CLASSES is {:#x})",
                        d.classes, MEMPLUG_HOST_NODE_ALL_CLASSES
                    ),
                ));
            }
            same_manager(seat, d.pool.id, Kind::Pool)?;
            let (p, _) = pin::<PoolEntry>(d.pool.id)?;
            if specs.iter().any(|s| std::sync::Arc::ptr_eq(&s.pool, &p.pool)) {
                return Err(Error::new(S::AlreadyExists, format!("devices[{i}]: the pool is listed twice")));
            }
            specs.push(LinkDevice {
                device: name.to_owned(),
                pool: p.pool.clone(),
                priority: d.priority,
                classes: node_classes(d.classes)?,
            });
        }
        let link = NodeLink::join(path, specs, opts)
            .map_err(|e| io_error(&format!("could not join the node at {path}"), e))?;
        // SAFETY: `out_link` was checked non-NULL.
        unsafe {
            manager_tables::issue(seat, NodeEntry::Link(link), [0, 0], out_link, |id| MemplugHostNodeLink {
                id,
            })
        }
    })
}

/// This process's side of the authority's books now: whether it is
/// connected, what the joined pools hold and use, and what the link did.
///
/// Thread-safety: any thread.
///
/// # Safety
/// `out_stats` NULL or writable for its `struct_size`.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_node_link_stats(
    link: MemplugHostNodeLink,
    out_stats: *mut MemplugHostNodeLinkStats,
) -> MemplugHostStatus {
    boundary("memplug_host_node_link_stats", || {
        require_non_null(out_stats, "out_stats")?;
        let s = link_of(link, |l| Ok(l.stats()))?;
        let v = MemplugHostNodeLinkStats {
            struct_size: 0,
            connected: u32::from(s.connected),
            chunk: s.chunk,
            held: s.held,
            used: s.used,
            leases_asked: s.leases_asked,
            leases_granted: s.leases_granted,
            leases_refused: s.leases_refused,
            bytes_leased: s.bytes_leased,
            bytes_returned: s.bytes_returned,
            tickets_answered: s.tickets_answered,
            bytes_released: s.bytes_released,
            joins: s.joins,
        };
        // SAFETY: non-NULL; the caller's contract covers the size.
        unsafe { write_sized(out_stats, v, "MemplugHostNodeLinkStats") }
    })
}

/// The authority's last refusal or error to this link (who was asked for
/// room and what each answered), under the text protocol of
/// `memplug_host_stats_json`; an empty text when there was none.
///
/// # Safety
/// `buf` NULL or writable for `cap` bytes; `written` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_node_link_last_error(
    link: MemplugHostNodeLink,
    buf: *mut c_char,
    cap: usize,
    written: *mut usize,
) -> MemplugHostStatus {
    // SAFETY: the caller's contract.
    unsafe {
        text_call("memplug_host_node_link_last_error", buf, cap, written, || {
            link_of(link, |l| Ok(l.last_error().unwrap_or_default()))
        })
    }
}

/// Asks the authority for its books (every process's leases and tickets;
/// `format`: `MEMPLUG_HOST_NODE_STATUS_JSON` or `_PROMETHEUS`), waiting at
/// most `timeout_ns` (`MEMPLUG_HOST_STATUS_TIMEOUT`; `_DEVICE_UNAVAILABLE`
/// while no authority is connected). The text protocol is
/// `memplug_host_stats_json`'s; a retry with a larger buffer asks again.
///
/// # Safety
/// `buf` NULL or writable for `cap` bytes; `written` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_node_link_status(
    link: MemplugHostNodeLink,
    format: u32,
    timeout_ns: u64,
    buf: *mut c_char,
    cap: usize,
    written: *mut usize,
) -> MemplugHostStatus {
    // SAFETY: the caller's contract.
    unsafe {
        text_call("memplug_host_node_link_status", buf, cap, written, || {
            let prometheus = format_flag(format)?;
            link_of(link, |l| {
                l.status(prometheus, Duration::from_nanos(timeout_ns))
                    .map_err(|e| io_error("no status from the node authority", e))
            })
        })
    }
}

/// Leaves the node: idle budget goes back to the authority; what the pools
/// still use stays counted by the authority until this process exits (or
/// the pools' capacities are the authority's no more: they keep what they
/// hold, and ask nobody for more). The zero handle is a no-op. Waits at
/// most a tick for the link's threads.
///
/// Thread-safety: any thread; a call on the link still running (a status
/// waiting for its answer) finishes first, and the link leaves after it.
#[no_mangle]
pub extern "C" fn memplug_host_node_link_leave(link: MemplugHostNodeLink) -> MemplugHostStatus {
    boundary("memplug_host_node_link_leave", || {
        if link.id != 0 {
            link_of(link, |_| Ok(()))?;
        }
        remove_drop::<NodeEntry>(link.id)
    })
}

/// Serves a node authority in this process on `socket_path`, governing
/// `device_count` devices (`devices`: names and capacities), as `memplug
/// node serve` does; other processes (and this one) join it with
/// `memplug_host_manager_join_node`. A stale socket file of a dead
/// authority is replaced. `options` may be NULL (the defaults).
///
/// Per-user and per-group quotas come in `options->quotas` (as `memplug
/// node serve --quota`/`--group-quota`): a lease that would take a user's
/// or a group's processes past theirs is refused, and the refusal (the
/// member's `memplug_host_node_link_last_error`) names the quota.
///
/// Refusals: `MEMPLUG_HOST_STATUS_ALREADY_EXISTS` when an authority already
/// serves the path; `_INVALID_ARGUMENT` for no devices, an empty or
/// repeated name, a short `struct_size`, a mode above 0777, a quota of an
/// unknown kind or repeated, or a path too long for a socket;
/// `_NULL_ARGUMENT` for NULL `quotas` with a `quota_count`;
/// `_OUT_OF_RANGE` for more than 65536 quotas; `_DEVICE_UNAVAILABLE` for
/// other socket errors.
///
/// Ownership: the caller owns the handle (`memplug_host_node_authority_stop`;
/// destroying the manager stops it too). Thread-safety: any thread.
///
/// # Safety
/// `socket_path` NULL or NUL-terminated; `devices` NULL or readable for
/// `device_count` elements, each `device` NULL or NUL-terminated;
/// `options` NULL or readable for its `struct_size`, its `quotas` NULL or
/// readable for `quota_count` elements; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_manager_start_node_authority(
    manager: MemplugHostManager,
    socket_path: *const c_char,
    devices: *const MemplugHostNodeCapacity,
    device_count: usize,
    options: *const MemplugHostNodeAuthorityOptions,
    out: *mut MemplugHostNodeAuthority,
) -> MemplugHostStatus {
    boundary("memplug_host_manager_start_node_authority", || {
        // SAFETY: the caller's contract.
        let path = unsafe { c_str(socket_path, "socket_path") }?;
        require_non_null(out, "out")?;
        // SAFETY: the caller's contract.
        let caps = unsafe { array(devices, device_count, "devices") }?;
        let mut list: Vec<(String, u64)> = Vec::with_capacity(caps.len());
        for (i, c) in caps.iter().enumerate() {
            // SAFETY: the caller's contract.
            let name = unsafe { c_str(c.device, "devices[].device") }?;
            if name.is_empty() || list.iter().any(|(n, _)| n == name) {
                return Err(Error::new(
                    S::InvalidArgument,
                    format!("devices[{i}]: the name {name:?} is empty or repeated"),
                ));
            }
            list.push((name.to_owned(), c.capacity));
        }
        let mut config = AuthorityConfig::new(path, list);
        if !options.is_null() {
            // SAFETY: non-NULL; the caller's contract covers the size.
            let o = unsafe { read_sized(options, "MemplugHostNodeAuthorityOptions") }?;
            if o.mode > 0o777 {
                return Err(Error::new(S::InvalidArgument, format!("mode {:#o} is above 0777", o.mode)));
            }
            if o.mode != 0 {
                config.mode = o.mode;
            }
            if o.chunk != 0 {
                config.chunk = o.chunk;
            }
            config.ticket_timeout = duration_or(o.ticket_timeout_ns, config.ticket_timeout);
            config.rejoin_grace = duration_or(o.rejoin_grace_ns, config.rejoin_grace);
            // SAFETY: the caller's contract covers `quotas`.
            let (users, groups) = unsafe { quotas(&o) }?;
            config.quotas = users;
            config.group_quotas = groups;
        }
        let (_m, seat) = pin_manager(manager.id)?;
        let a = Authority::start(config).map_err(|e| io_error(&format!("could not serve {path}"), e))?;
        // SAFETY: `out` was checked non-NULL.
        unsafe {
            manager_tables::issue(seat, NodeEntry::Authority(a), [0, 0], out, |id| MemplugHostNodeAuthority {
                id,
            })
        }
    })
}

/// Ids and their bytes, as `AuthorityConfig` takes them.
type Quotas = Vec<(u32, u64)>;

/// The user and group quotas of `o` (none when its `struct_size` stops
/// before them: `read_sized` zeroed them).
///
/// # Safety
/// `o.quotas` NULL or readable for `o.quota_count` elements.
unsafe fn quotas(o: &MemplugHostNodeAuthorityOptions) -> Result<(Quotas, Quotas)> {
    let (mut users, mut groups) = (Vec::new(), Vec::new());
    if o.quota_count == 0 {
        return Ok((users, groups));
    }
    if o.quota_count > 65536 {
        return Err(Error::new(S::OutOfRange, format!("{} quotas (at most 65536)", o.quota_count)));
    }
    require_non_null(o.quotas, "quotas")?;
    // SAFETY: the caller's contract.
    let list = unsafe { std::slice::from_raw_parts(o.quotas, o.quota_count) };
    for (i, q) in list.iter().enumerate() {
        let (to, what) = match q.kind {
            MEMPLUG_HOST_NODE_QUOTA_USER => (&mut users, "user"),
            MEMPLUG_HOST_NODE_QUOTA_GROUP => (&mut groups, "group"),
            k => {
                return Err(Error::new(
                    S::InvalidArgument,
                    format!("quotas[{i}]: kind {k} is not MEMPLUG_HOST_NODE_QUOTA_USER (0) or _GROUP (1)"),
                ))
            }
        };
        // A repeat is a mistake to report, not a silent override.
        if to.iter().any(|(id, _)| *id == q.id) {
            return Err(Error::new(
                S::InvalidArgument,
                format!("quotas[{i}]: {what} {} has a quota already", q.id),
            ));
        }
        to.push((q.id, q.bytes));
    }
    Ok((users, groups))
}

/// The authority's books (`format`: `MEMPLUG_HOST_NODE_STATUS_JSON` or
/// `_PROMETHEUS`) under the text protocol of `memplug_host_stats_json`:
/// per device capacity, leased and free; per member its pid, leases,
/// tickets received, answered and skipped; `"books_exact"`.
///
/// # Safety
/// `buf` NULL or writable for `cap` bytes; `written` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_node_authority_status(
    authority: MemplugHostNodeAuthority,
    format: u32,
    buf: *mut c_char,
    cap: usize,
    written: *mut usize,
) -> MemplugHostStatus {
    // SAFETY: the caller's contract.
    unsafe {
        text_call("memplug_host_node_authority_status", buf, cap, written, || {
            let prometheus = format_flag(format)?;
            authority_of(authority, |a| Ok(if prometheus { a.status_prometheus() } else { a.status_json() }))
        })
    }
}

/// Stops serving: the socket file is removed and every connection closed;
/// the members keep what they hold and rejoin the next authority on the
/// same path. The zero handle is a no-op.
///
/// Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_node_authority_stop(authority: MemplugHostNodeAuthority) -> MemplugHostStatus {
    boundary("memplug_host_node_authority_stop", || {
        if authority.id != 0 {
            authority_of(authority, |_| Ok(()))?;
        }
        remove_drop::<NodeEntry>(authority.id)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use memplug_host_dep::governor::AllocationClass;

    /// C numbers the classes otherwise than Rust: a mask is translated bit
    /// by bit, never passed through.
    #[test]
    fn a_c_class_mask_names_the_same_classes_at_the_node() {
        let kv = 1 << crate::common::MEMPLUG_HOST_CLASS_KV;
        assert_eq!(node_classes(kv).unwrap(), 1 << AllocationClass::Kv as u8);
        let other = 1 << crate::common::MEMPLUG_HOST_CLASS_OTHER;
        assert_eq!(node_classes(other).unwrap(), 1 << AllocationClass::Other as u8);
        assert_eq!(node_classes(MEMPLUG_HOST_NODE_ALL_CLASSES).unwrap(), memplug_node::wire::ALL_CLASSES);
        assert_eq!(node_classes(0).unwrap(), 0);
    }
}
