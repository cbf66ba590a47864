//! Memory on the wire through UCX (cargo feature `ucx`, on by default):
//! register part of a region with a UCX context, connect to a peer over a
//! control socket, offer the range, pull or push between a remote range and
//! a local region, and deregister. The Rust crate `memplug-ucx` does the
//! work; this module is its C face (`docs/ARCHITECTURE.md`, "Memory on the
//! wire: UCX"), with the allocation forms in `ucx_alloc.rs` (same tables,
//! same header).
//!
//! The feature is on by default because it costs nothing at build time:
//! `libucp.so.0` is opened at run time, so a library built with it links
//! no UCX, and on a machine without UCX these functions return
//! `MEMPLUG_HOST_STATUS_UNSUPPORTED` saying how to install it. One build
//! of the library then serves every machine, and the header declares the
//! functions unconditionally but for `MEMPLUG_HOST_NO_UCX` (define it
//! when linking a library built without the feature).
//!
//! Its objects are not owned by a manager: a UCX context, a registration, a
//! peer and a transfer live in process-wide tables of their own (handles of
//! kind 15, which the manager tables never issue), since one UCX context
//! may serve regions of several managers. Destroy them before the manager
//! whose regions they use: a region's free waits for its registrations to
//! go (that is the residency guarantee).

use crate::callbacks::lock_region;
use crate::common::{MemplugHostMechanism, MemplugHostRegion};
use crate::error::{boundary, c_str, require_non_null, write_out, Error, Result};
use crate::handle::Kind;
use crate::manager_tables::{pin, same_manager, RegionEntry};
use crate::slot_table::{Key, LazyTable, Pinned, MAX_GEN, MAX_INDEX};
use crate::status::MemplugHostStatus;
use crate::status::MemplugHostStatus as S;
use memplug_host_dep::registry::Context;
use memplug_ucx::{Access, ErrorHandling, Peer, RemoteRange, Transfer, Ucx, UcxError};
use std::ffi::c_char;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A UCX context and its worker (`memplug_host_ucx_create`). Destroy with
/// `memplug_host_ucx_destroy`; registrations and peers made from it keep
/// it alive until they go.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemplugHostUcx {
    /// The handle's bits; 0 names nothing.
    pub id: u64,
}

/// A range of a region registered with UCX and pinned resident
/// (`memplug_host_ucx_register_region`). Deregister with
/// `memplug_host_ucx_deregister`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemplugHostUcxRegistration {
    /// The handle's bits; 0 names nothing.
    pub id: u64,
}

/// Another process reached over a control socket and a UCX endpoint
/// (`memplug_host_ucx_peer_connect`). Destroy with
/// `memplug_host_ucx_peer_destroy`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemplugHostUcxPeer {
    /// The handle's bits; 0 names nothing.
    pub id: u64,
}

/// A one-sided transfer in flight or done (`memplug_host_ucx_peer_pull_into_region`,
/// `memplug_host_ucx_peer_push_from_region`). Wait with
/// `memplug_host_ucx_transfer_wait`; release with
/// `memplug_host_ucx_transfer_release` (the region keeps its own record of
/// the transfer: its shrink and free wait for it either way).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemplugHostUcxTransfer {
    /// The handle's bits; 0 names nothing.
    pub id: u64,
}

/// A range a peer offered (`memplug_host_ucx_peer_next_offer`): pass it
/// back unchanged to pull, push and release. A fixed layout (no
/// `struct_size`): it never grows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemplugHostUcxRemoteRange {
    /// The offer's id on this connection.
    pub id: u64,
    /// The first byte's address in the peer's address space.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// The tag the peer gave it (`memplug_host_ucx_peer_offer`).
    pub tag: u64,
    /// 1 when the peer may be written (offered with
    /// `MEMPLUG_HOST_UCX_ACCESS_READ_WRITE`), else 0.
    pub writable: u32,
    /// Zero.
    pub reserved0: u32,
}

/// Peers may only read the range (`ucp_get_nbx`): a shared prefix.
pub const MEMPLUG_HOST_UCX_ACCESS_READ: u32 = 1;
/// Peers may read and write the range (`ucp_put_nbx` too).
pub const MEMPLUG_HOST_UCX_ACCESS_READ_WRITE: u32 = 2;

/// Peer-failure handling on (UCX's `UCP_ERR_HANDLING_MODE_PEER`): a dead
/// peer fails its transfers, a transfer past its deadline is cancelled.
/// On a machine without RDMA, UCX then carries the bytes over TCP.
pub const MEMPLUG_HOST_UCX_ERRORS_PEER: u32 = 0;
/// No peer-failure handling: shared memory between processes of one node
/// is eligible, but a transfer to a peer that died never completes (its
/// memory stays pinned). For peers whose life the caller controls.
pub const MEMPLUG_HOST_UCX_ERRORS_NONE: u32 = 1;

// ---- handles -------------------------------------------------------------

/// The kind field (the top 4 bits) of every handle of this module: the
/// manager tables' kinds stop below it (`handle.rs`), so a UCX handle
/// passed to any other function is refused as a wrong kind.
const UCX_KIND: u64 = 0xF;
const SUB_SHIFT: u32 = 56;
const GEN_SHIFT: u32 = 28;
/// Live objects of each type at once.
const LIMIT: u32 = 1 << 20;

pub(crate) struct RegistrationEntry(pub(crate) memplug_ucx::Registration);
struct PeerEntry(Mutex<Peer>);
pub(crate) struct TransferEntry(pub(crate) Transfer);

static CONTEXTS: LazyTable<Ucx> = LazyTable::new(LIMIT);
static REGISTRATIONS: LazyTable<RegistrationEntry> = LazyTable::new(LIMIT);
static PEERS: LazyTable<PeerEntry> = LazyTable::new(LIMIT);
static TRANSFERS: LazyTable<TransferEntry> = LazyTable::new(LIMIT);

/// An object type of this module: its table and its sub-kind (bits 56..60).
pub(crate) trait UcxObject: Sized + Send + Sync + 'static {
    const SUB: u64;
    const NAME: &'static str;
    fn table() -> &'static LazyTable<Self>;
}

macro_rules! ucx_object {
    ($t:ty, $sub:expr, $name:expr, $table:ident) => {
        impl UcxObject for $t {
            const SUB: u64 = $sub;
            const NAME: &'static str = $name;
            fn table() -> &'static LazyTable<Self> {
                &$table
            }
        }
    };
}
ucx_object!(Ucx, 1, "UCX context", CONTEXTS);
ucx_object!(RegistrationEntry, 2, "UCX registration", REGISTRATIONS);
ucx_object!(PeerEntry, 3, "UCX peer", PEERS);
ucx_object!(TransferEntry, 4, "UCX transfer", TRANSFERS);

fn key_of<T: UcxObject>(bits: u64) -> Result<Key> {
    if bits >> 60 != UCX_KIND || (bits >> SUB_SHIFT) & 0xF != T::SUB {
        return Err(Error::new(S::InvalidHandle, format!("{bits:#018x} is not a {} handle", T::NAME)));
    }
    let gen = ((bits >> GEN_SHIFT) & MAX_GEN as u64) as u32;
    let index = (bits & MAX_INDEX as u64) as u32;
    if gen == 0 || (bits >> (GEN_SHIFT + 22)) & 0x3F != 0 {
        return Err(Error::new(
            S::InvalidHandle,
            format!("{} handle {bits:#018x} was never issued", T::NAME),
        ));
    }
    Ok(Key { index, gen })
}

fn miss<T: UcxObject>(m: crate::slot_table::Miss, bits: u64) -> Error {
    match m {
        crate::slot_table::Miss::Stale => {
            Error::new(S::StaleHandle, format!("{} handle {bits:#018x} was destroyed", T::NAME))
        }
        crate::slot_table::Miss::Invalid => {
            Error::new(S::InvalidHandle, format!("{} handle {bits:#018x} was never issued", T::NAME))
        }
    }
}

pub(crate) fn get<T: UcxObject>(bits: u64) -> Result<Pinned<T>> {
    let key = key_of::<T>(bits)?;
    T::table().get().pin(key).map_err(|m| miss::<T>(m, bits))
}

pub(crate) fn insert<T: UcxObject>(value: T) -> Result<u64> {
    match T::table().get().insert(value, [0, 0]) {
        Ok((index, gen)) => {
            Ok((UCX_KIND << 60) | (T::SUB << SUB_SHIFT) | ((gen as u64) << GEN_SHIFT) | index as u64)
        }
        Err(v) => {
            drop(v);
            Err(Error::new(S::LimitReached, format!("too many live {} handles", T::NAME)))
        }
    }
}

/// Removes and drops the object (the zero handle: no-op).
fn remove<T: UcxObject>(bits: u64) -> Result<()> {
    if bits == 0 {
        return Ok(());
    }
    let key = key_of::<T>(bits)?;
    T::table().get().remove_drop(key).map_err(|m| miss::<T>(m, bits))
}

/// Takes the object out of its table to own it, waiting out brief pins.
fn take<T: UcxObject>(bits: u64) -> Result<T> {
    let key = key_of::<T>(bits)?;
    loop {
        match T::table().get().try_take(key) {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => std::thread::yield_now(),
            Err(m) => return Err(miss::<T>(m, bits)),
        }
    }
}

// ---- errors --------------------------------------------------------------

/// The status for each `UcxError`; the message keeps UCX's own words.
pub(crate) fn ucx_error(e: UcxError) -> Error {
    let status = match &e {
        UcxError::Unavailable(_) => S::Unsupported,
        UcxError::Ucx { .. } | UcxError::Protocol(_) => S::Internal,
        UcxError::Timeout { .. } => S::Timeout,
        // The other process (or the socket to it) is gone: the peer cannot
        // be reached, as a device that is unavailable.
        UcxError::PeerLost(_) | UcxError::Io(_) => S::DeviceUnavailable,
        UcxError::Revoked { .. } => S::InvalidState,
        UcxError::Busy(_) => S::Busy,
        UcxError::Invalid(_) => S::InvalidArgument,
        UcxError::Binding(_) => {
            let UcxError::Binding(b) = e else { unreachable!() };
            return Error::from(b);
        }
    };
    Error::new(status, e.to_string())
}

pub(crate) fn timeout(ns: u64) -> Duration {
    Duration::from_nanos(ns)
}

/// # Safety
/// `range` non-NULL (checked) and readable.
pub(crate) unsafe fn read_range(range: *const MemplugHostUcxRemoteRange) -> Result<RemoteRange> {
    require_non_null(range, "range")?;
    // SAFETY: the caller's contract.
    let r = unsafe { *range };
    Ok(RemoteRange { id: r.id, addr: r.addr, len: r.len, writable: r.writable != 0, tag: r.tag })
}

/// The `MEMPLUG_HOST_UCX_ACCESS_*` value as the crate's `Access`.
pub(crate) fn access_of(access: u32) -> Result<Access> {
    match access {
        MEMPLUG_HOST_UCX_ACCESS_READ => Ok(Access::Read),
        MEMPLUG_HOST_UCX_ACCESS_READ_WRITE => Ok(Access::ReadWrite),
        a => Err(Error::new(
            S::InvalidArgument,
            format!("access {a} is neither MEMPLUG_HOST_UCX_ACCESS_READ nor _READ_WRITE"),
        )),
    }
}

// ---- contexts ------------------------------------------------------------

/// Whether UCX can be used in this process: `MEMPLUG_HOST_STATUS_OK`, or
/// `MEMPLUG_HOST_STATUS_UNSUPPORTED` with a message saying why (no
/// `libucp.so.0`, too old) and how to install it. Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_ucx_available() -> MemplugHostStatus {
    boundary("memplug_host_ucx_available", || Ucx::available().map_err(ucx_error))
}

/// Creates a UCX context with RMA and one worker. Transports are UCX's
/// choice under its environment (`UCX_TLS`, `UCX_NET_DEVICES`), overridden
/// for this context only by `settings` (may be NULL): `NAME=VALUE` pairs
/// separated by `;`, names without the `UCX_` prefix, e.g.
/// `"TLS=tcp;NET_DEVICES=lo"`. A bad name or value is
/// `MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`.
///
/// Ownership: the caller owns the context (`memplug_host_ucx_destroy`).
/// Thread-safety: any thread; the context may be used from any thread.
///
/// # Safety
/// `settings` must be NULL or NUL-terminated; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_ucx_create(
    settings: *const c_char,
    out: *mut MemplugHostUcx,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_create", || {
        require_non_null(out, "out")?;
        // SAFETY: the caller's contract.
        let text = if settings.is_null() { "" } else { unsafe { c_str(settings, "settings") }? };
        let mut pairs = Vec::new();
        for item in text.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            let Some((name, value)) = item.split_once('=') else {
                return Err(Error::new(S::InvalidArgument, format!("setting {item:?} is not NAME=VALUE")));
            };
            pairs.push((name.trim(), value.trim()));
        }
        let ucx = Ucx::with_config(&pairs).map_err(ucx_error)?;
        let id = insert(ucx)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, MemplugHostUcx { id }) };
        Ok(())
    })
}

/// Releases the caller's context handle; registrations and peers made from
/// it keep the context until they go. The zero handle is a no-op.
/// Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_ucx_destroy(ucx: MemplugHostUcx) -> MemplugHostStatus {
    boundary("memplug_host_ucx_destroy", || remove::<Ucx>(ucx.id))
}

// ---- registration --------------------------------------------------------

/// Registers `len` bytes at `offset` of `region` with `ucx` and pins them
/// resident: until deregistered, a shrink over them is queued (the bytes
/// stay committed and charged), offload and privatise refuse with
/// `MEMPLUG_HOST_STATUS_BUSY` after their timeout, and the region's free
/// waits. `mechanism` is the region's mechanism (its loss deregisters).
/// `access` is `MEMPLUG_HOST_UCX_ACCESS_READ` or `_READ_WRITE` (refused over
/// a read-only shared prefix).
///
/// Refused: an empty range or one past the usable length, a bad `access`
/// (`MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`); a region and mechanism of
/// different managers (`MEMPLUG_HOST_STATUS_WRONG_MANAGER`).
///
/// Ownership: the caller owns the registration
/// (`memplug_host_ucx_deregister`). Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_ucx_register_region(
    ucx: MemplugHostUcx,
    mechanism: MemplugHostMechanism,
    region: MemplugHostRegion,
    offset: u64,
    len: u64,
    access: u32,
    out: *mut MemplugHostUcxRegistration,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_register_region", || {
        require_non_null(out, "out")?;
        let access = access_of(access)?;
        let u = get::<Ucx>(ucx.id)?;
        let (ctx, seat) = pin::<Arc<Context>>(mechanism.id)?;
        same_manager(seat, region.id, Kind::Region)?;
        let (e, _) = pin::<RegionEntry>(region.id)?;
        let mut l = lock_region(&e)?;
        let reg = u.register_region(&ctx, &mut *l.guard, offset, len, access).map_err(ucx_error)?;
        drop(l);
        let id = insert(RegistrationEntry(reg))?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, MemplugHostUcxRegistration { id }) };
        Ok(())
    })
}

/// Deregisters: the range is no longer pinned, and the handle is stale.
/// Refused with `MEMPLUG_HOST_STATUS_BUSY` (the handle stays valid) while a
/// peer holds the range's remote key: revoke it first
/// (`memplug_host_ucx_peer_revoke`) or wait for the peer's release. The
/// zero handle is a no-op. Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_ucx_deregister(registration: MemplugHostUcxRegistration) -> MemplugHostStatus {
    boundary("memplug_host_ucx_deregister", || {
        if registration.id == 0 {
            return Ok(());
        }
        {
            let r = get::<RegistrationEntry>(registration.id)?;
            let held = r.0.holders();
            if held > 0 {
                return Err(Error::new(
                    S::Busy,
                    format!(
                        "{held} peer(s) hold the remote key of {:#x} ({} B): revoke it or wait for their release",
                        r.0.addr(),
                        r.0.len()
                    ),
                ));
            }
        }
        let RegistrationEntry(reg) = take::<RegistrationEntry>(registration.id)?;
        // A peer took the key between the check and the take: dropping the
        // registration then leaves the unmap to the peer's release, and the
        // pin keeps the range resident until then.
        match reg.deregister() {
            Ok(()) => Ok(()),
            Err((reg, e)) => {
                drop(reg);
                Err(ucx_error(e))
            }
        }
    })
}

/// Releases the caller's registration handle without waiting for peers:
/// the range is deregistered now when no peer holds its key, otherwise
/// when the last holder releases it, is revoked or is lost — until then it
/// stays registered and pinned (the region's free waits). What a C++
/// destructor calls. The zero handle is a no-op. Thread-safety: any
/// thread.
#[no_mangle]
pub extern "C" fn memplug_host_ucx_registration_release(
    registration: MemplugHostUcxRegistration,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_registration_release", || remove::<RegistrationEntry>(registration.id))
}

// ---- peers ---------------------------------------------------------------

/// Connects to the process at the other end of `fd`, a connected stream
/// socket (Unix, or TCP between nodes) that must reach a trusted process:
/// both sides call this, exchange UCX worker addresses over it (waiting up
/// to `timeout_ns` for the other's) and make an endpoint. `errors` is
/// `MEMPLUG_HOST_UCX_ERRORS_PEER` or `_NONE`, the same on both sides.
///
/// Ownership: on success the peer owns `fd` (closed by
/// `memplug_host_ucx_peer_destroy`); on failure it stays the caller's,
/// open. Thread-safety: any thread; calls on one peer are serialised.
///
/// # Safety
/// `out` must be NULL or writable; `fd` must not be closed by anyone else
/// after a success.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_ucx_peer_connect(
    ucx: MemplugHostUcx,
    fd: i32,
    errors: u32,
    timeout_ns: u64,
    out: *mut MemplugHostUcxPeer,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_peer_connect", || {
        require_non_null(out, "out")?;
        let mode = match errors {
            MEMPLUG_HOST_UCX_ERRORS_PEER => ErrorHandling::Peer,
            MEMPLUG_HOST_UCX_ERRORS_NONE => ErrorHandling::None,
            m => {
                return Err(Error::new(
                    S::InvalidArgument,
                    format!("errors {m} is neither MEMPLUG_HOST_UCX_ERRORS_PEER nor _NONE"),
                ))
            }
        };
        let u = get::<Ucx>(ucx.id)?;
        let stream = stream_of(fd)?;
        let peer = Peer::connect_with(&u, stream, timeout(timeout_ns), mode).map_err(ucx_error)?;
        let id = insert(PeerEntry(Mutex::new(peer)))?;
        // The peer works on a duplicate; the caller's descriptor is the
        // peer's now, and closed here so that exactly one stays open.
        // SAFETY: `fd` is the caller's open descriptor, handed over.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, MemplugHostUcxPeer { id }) };
        Ok(())
    })
}

/// A duplicate of `fd` as a control stream: Unix or TCP, by its domain;
/// anything else (not a socket, a datagram socket) is refused.
fn stream_of(fd: i32) -> Result<Box<dyn memplug_ucx::ControlStream>> {
    let opt = |name: libc::c_int| -> Result<libc::c_int> {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: valid out-pointers of the sizes given.
        let rc = unsafe {
            libc::getsockopt(fd, libc::SOL_SOCKET, name, (&mut v as *mut libc::c_int).cast(), &mut len)
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            return Err(Error::new(S::InvalidArgument, format!("fd {fd} is not a socket: {e}")));
        }
        Ok(v)
    };
    if opt(libc::SO_TYPE)? != libc::SOCK_STREAM {
        return Err(Error::new(S::InvalidArgument, format!("fd {fd} is not a stream socket")));
    }
    let domain = opt(libc::SO_DOMAIN)?;
    // SAFETY: a valid descriptor (getsockopt succeeded on it).
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        let e = std::io::Error::last_os_error();
        return Err(Error::new(S::Internal, format!("duplicating fd {fd}: {e}")));
    }
    // SAFETY: a fresh descriptor this function owns.
    let owned = unsafe { OwnedFd::from_raw_fd(dup) };
    match domain {
        libc::AF_UNIX => Ok(Box::new(std::os::unix::net::UnixStream::from(owned))),
        libc::AF_INET | libc::AF_INET6 => Ok(Box::new(std::net::TcpStream::from(owned))),
        d => {
            Err(Error::new(S::InvalidArgument, format!("fd {fd} is a socket of domain {d}, not Unix or TCP")))
        }
    }
}

/// Says goodbye to the peer (after up to a second for this side's
/// transfers), closes the endpoint and the socket, and gives back every
/// hold the peer had on this side's registrations. The zero handle is a
/// no-op. Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_ucx_peer_destroy(peer: MemplugHostUcxPeer) -> MemplugHostStatus {
    boundary("memplug_host_ucx_peer_destroy", || remove::<PeerEntry>(peer.id))
}

pub(crate) fn with_peer<R>(peer: MemplugHostUcxPeer, f: impl FnOnce(&mut Peer) -> Result<R>) -> Result<R> {
    let p = get::<PeerEntry>(peer.id)?;
    let mut guard = p.0.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut guard)
}

/// Offers `registration` to the peer with `tag` (what the range is, for
/// the peer); `out_id` receives the offer's id. The peer may read it (and
/// write it, when registered `_READ_WRITE`) until it releases it or
/// `memplug_host_ucx_peer_revoke` succeeds; until then it cannot be
/// deregistered. Thread-safety: any thread.
///
/// # Safety
/// `out_id` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_ucx_peer_offer(
    peer: MemplugHostUcxPeer,
    registration: MemplugHostUcxRegistration,
    tag: u64,
    out_id: *mut u64,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_peer_offer", || {
        require_non_null(out_id, "out_id")?;
        let r = get::<RegistrationEntry>(registration.id)?;
        let id = with_peer(peer, |p| p.offer(&r.0, tag).map_err(ucx_error))?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(out_id, id) };
        Ok(())
    })
}

/// Waits up to `timeout_ns` for the next range the peer offers
/// (`MEMPLUG_HOST_STATUS_TIMEOUT` when none came). Thread-safety: any
/// thread.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_ucx_peer_next_offer(
    peer: MemplugHostUcxPeer,
    timeout_ns: u64,
    out: *mut MemplugHostUcxRemoteRange,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_peer_next_offer", || {
        require_non_null(out, "out")?;
        let r = with_peer(peer, |p| p.next_offer(timeout(timeout_ns)).map_err(ucx_error))?;
        let range = MemplugHostUcxRemoteRange {
            id: r.id,
            addr: r.addr,
            len: r.len,
            tag: r.tag,
            writable: r.writable as u32,
            reserved0: 0,
        };
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, range) };
        Ok(())
    })
}

/// Serves the peer for up to `timeout_ns`: progress for its reads and
/// writes of this side's memory (TCP needs it; shared memory does not) and
/// its control messages (releases, revokes). `out_left` receives whether
/// the peer has left (said goodbye, or was lost); a timeout is not an
/// error. Thread-safety: any thread.
///
/// # Safety
/// `out_left` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_ucx_peer_serve(
    peer: MemplugHostUcxPeer,
    timeout_ns: u64,
    out_left: *mut bool,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_peer_serve", || {
        require_non_null(out_left, "out_left")?;
        let left = with_peer(peer, |p| match p.serve(timeout(timeout_ns)) {
            Ok(_) => Ok(true),
            Err(UcxError::Timeout { .. }) => Ok(false),
            Err(e) => Err(ucx_error(e)),
        })?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(out_left, left) };
        Ok(())
    })
}

/// Gives `range` back to its owner after waiting (up to `timeout_ns`) for
/// this side's transfers on it; the owner may deregister it afterwards.
/// Thread-safety: any thread.
///
/// # Safety
/// `range` must be NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_ucx_peer_release(
    peer: MemplugHostUcxPeer,
    range: *const MemplugHostUcxRemoteRange,
    timeout_ns: u64,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_peer_release", || {
        // SAFETY: the caller's contract.
        let r = unsafe { read_range(range) }?;
        with_peer(peer, |p| p.release(&r, timeout(timeout_ns)).map_err(ucx_error))
    })
}

/// Asks the peer to stop using the range offered as `offer_id` and waits up
/// to `timeout_ns` for its acknowledgement (after its transfers on it);
/// then the registration may be deregistered. On
/// `MEMPLUG_HOST_STATUS_TIMEOUT` the range stays held and resident.
/// Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_ucx_peer_revoke(
    peer: MemplugHostUcxPeer,
    offer_id: u64,
    timeout_ns: u64,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_peer_revoke", || {
        with_peer(peer, |p| p.revoke(offer_id, timeout(timeout_ns)).map_err(ucx_error))
    })
}

// ---- transfers -----------------------------------------------------------

/// The direction of `transfer_region` (and `ucx_alloc`'s transfers).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Way {
    Pull,
    Push,
}

/// Offsets and length of a transfer: `local` in the region or allocation,
/// `remote` in the peer's range.
pub(crate) struct Span {
    pub(crate) local: u64,
    pub(crate) remote: u64,
    pub(crate) len: u64,
}

/// # Safety
/// `range` NULL or readable, `out` NULL or writable.
unsafe fn transfer_region(
    way: Way,
    peer: MemplugHostUcxPeer,
    region: MemplugHostRegion,
    range: *const MemplugHostUcxRemoteRange,
    span: Span,
    out: *mut MemplugHostUcxTransfer,
) -> Result<()> {
    require_non_null(out, "out")?;
    // SAFETY: the caller's contract.
    let r = unsafe { read_range(range) }?;
    let (e, _) = pin::<RegionEntry>(region.id)?;
    let t = with_peer(peer, |p| {
        let mut l = lock_region(&e)?;
        let region = &mut *l.guard;
        match way {
            Way::Pull => p.pull_into_region(region, span.local, &r, span.remote, span.len),
            Way::Push => p.push_from_region(region, span.local, &r, span.remote, span.len),
        }
        .map_err(ucx_error)
    })?;
    let id = insert(TransferEntry(t))?;
    // SAFETY: checked non-NULL.
    unsafe { write_out(out, MemplugHostUcxTransfer { id }) };
    Ok(())
}

/// Reads `len` bytes at `src_offset` of the peer's `range` into `region` at
/// `dst_offset`. When the destination reaches past the region's usable
/// length, the region grows first: charged to its pool before any byte
/// moves (`MEMPLUG_HOST_STATUS_OUT_OF_BUDGET`: nothing moved, the region as
/// it was). The transfer is recorded on the region: its shrink, offload and
/// free wait for it. Refused as well: a destination past the reservation
/// or over a read-only prefix, a range out of bounds
/// (`MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`); a range released or revoked
/// (`MEMPLUG_HOST_STATUS_INVALID_STATE`); a lost peer
/// (`MEMPLUG_HOST_STATUS_DEVICE_UNAVAILABLE`).
///
/// Ownership: the caller owns the transfer handle
/// (`memplug_host_ucx_transfer_release`). Thread-safety: any thread.
///
/// # Safety
/// `range` must be NULL or readable; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_ucx_peer_pull_into_region(
    peer: MemplugHostUcxPeer,
    region: MemplugHostRegion,
    dst_offset: u64,
    range: *const MemplugHostUcxRemoteRange,
    src_offset: u64,
    len: u64,
    out: *mut MemplugHostUcxTransfer,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_peer_pull_into_region", || {
        let span = Span { local: dst_offset, remote: src_offset, len };
        // SAFETY: the caller's contract.
        unsafe { transfer_region(Way::Pull, peer, region, range, span, out) }
    })
}

/// Writes `len` bytes of `region` at `src_offset` into the peer's writable
/// `range` at `dst_offset`. The region's shrink, offload and free wait for
/// the transfer. Errors as for `memplug_host_ucx_peer_pull_into_region`;
/// a range offered read-only is `MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`.
///
/// # Safety
/// `range` must be NULL or readable; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_ucx_peer_push_from_region(
    peer: MemplugHostUcxPeer,
    region: MemplugHostRegion,
    src_offset: u64,
    range: *const MemplugHostUcxRemoteRange,
    dst_offset: u64,
    len: u64,
    out: *mut MemplugHostUcxTransfer,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_peer_push_from_region", || {
        let span = Span { local: src_offset, remote: dst_offset, len };
        // SAFETY: the caller's contract.
        unsafe { transfer_region(Way::Push, peer, region, range, span, out) }
    })
}

/// Waits up to `timeout_ns` for a transfer: `MEMPLUG_HOST_STATUS_OK` once
/// it completed, `_DEVICE_UNAVAILABLE` when it failed (the peer died, the
/// endpoint failed), `_TIMEOUT` past the deadline — with
/// `MEMPLUG_HOST_UCX_ERRORS_PEER` the transfer is then cancelled, so the
/// local memory is free of UCX either way. A pushed range is complete at
/// the peer after `memplug_host_ucx_peer_release`. Thread-safety: any
/// thread.
#[no_mangle]
pub extern "C" fn memplug_host_ucx_transfer_wait(
    transfer: MemplugHostUcxTransfer,
    timeout_ns: u64,
) -> MemplugHostStatus {
    boundary("memplug_host_ucx_transfer_wait", || {
        let t = get::<TransferEntry>(transfer.id)?;
        t.0.wait(timeout(timeout_ns)).map_err(ucx_error)
    })
}

/// Releases the caller's transfer handle (the transfer goes on; the region
/// still waits for it). The zero handle is a no-op. Thread-safety: any
/// thread.
#[no_mangle]
pub extern "C" fn memplug_host_ucx_transfer_release(transfer: MemplugHostUcxTransfer) -> MemplugHostStatus {
    boundary("memplug_host_ucx_transfer_release", || remove::<TransferEntry>(transfer.id))
}
