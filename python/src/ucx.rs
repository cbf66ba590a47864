//! Memory on the wire through UCX (`memplug-ucx`): `Ucx` (a context and
//! worker), `UcxRegistration` (part of a region registered and pinned
//! resident), `UcxPeer` (another process, over a connected socket),
//! `UcxRemoteRange` (what the peer offered) and `UcxTransfer` (a get or put
//! in flight). A pull lands in a `Region` at its own address, charged to
//! its pool first, or in an `Allocation` (charged when allocated), so a
//! DLPack consumer (NumPy) reads it without a copy. A registered
//! allocation's free waits for its deregistration; a transfer's fence is
//! recorded as a use of the allocation, so its exports wait for the bytes
//! to land and its free for the transfer. A `CachedAllocation` (a caching
//! binding's block) takes every allocation form: registered, or with a
//! transfer in flight, its `free()` keeps the block from every other
//! request (on the stream it was freed on too) and from trim and pressure
//! until the deregistration or the transfer's completion.
//!
//! UCX is opened at run time: without it `Ucx()` raises `Unsupported`
//! saying how to install it (`Ucx.unavailable()` says why, or `None`).
//! Every wait releases the GIL.

use crate::errors::{self, raise, MemplugError};
use crate::manager::Context;
use crate::memory::{Allocation, CachedAllocation};
use crate::region::Region;
use crate::streams::secs;
use crate::tensor::Uses;
use memplug_host::{CachedAllocation as HostCached, OwnedAllocation, SharedFence};
use memplug_ucx::{
    Access, ControlStream, ErrorHandling, LocalAllocation, Peer, RemoteRange, Transfer, UcxError,
};
use pyo3::prelude::*;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

/// A `UcxError` as the exception memplug raises for the same refusal.
fn error(e: UcxError) -> PyErr {
    let text = e.to_string();
    match e {
        UcxError::Binding(b) => errors::binding(b),
        UcxError::Unavailable(_) => errors::unsupported(text),
        UcxError::Invalid(_) => errors::invalid(text),
        UcxError::Revoked { .. } => errors::state(text),
        UcxError::Busy(_) => raise::<MemplugError>("BUSY", text, &[]),
        UcxError::Timeout { .. } => raise::<MemplugError>("TIMEOUT", text, &[]),
        // The other process (or the socket to it) is gone: unreachable.
        UcxError::PeerLost(_) | UcxError::Io(_) => raise::<MemplugError>("DEVICE_UNAVAILABLE", text, &[]),
        UcxError::Ucx { .. } | UcxError::Protocol(_) => raise::<MemplugError>("INTERNAL", text, &[]),
    }
}

/// A UCX context with RMA and one worker. Transports come from UCX's
/// environment (`UCX_TLS`, ...), overridden for this context by
/// `settings` (`{"TLS": "tcp", "NET_DEVICES": "lo"}`: names without the
/// `UCX_` prefix).
#[pyclass(frozen, module = "memplug")]
pub struct Ucx {
    inner: memplug_ucx::Ucx,
}

#[pymethods]
impl Ucx {
    #[new]
    #[pyo3(signature = (settings=None))]
    fn new(py: Python<'_>, settings: Option<std::collections::BTreeMap<String, String>>) -> PyResult<Self> {
        let settings = settings.unwrap_or_default();
        let pairs: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let inner = py.allow_threads(|| memplug_ucx::Ucx::with_config(&pairs)).map_err(error)?;
        Ok(Ucx { inner })
    }

    /// Why UCX cannot be used here (no `libucp.so.0`, too old), or `None`.
    #[staticmethod]
    fn unavailable() -> Option<String> {
        memplug_ucx::Ucx::available().err().map(|e| e.to_string())
    }

    /// Registers `length` bytes at `offset` of `region` (`context` is its
    /// mechanism's: its loss deregisters) and pins them: the region's
    /// shrink over them is queued, offload and privatise refuse, and its
    /// release waits, until `deregister`. `access` is "read" or
    /// "read_write" (refused over a read-only prefix).
    #[pyo3(signature = (context, region, offset, length, access="read"))]
    fn register_region(
        &self,
        py: Python<'_>,
        context: &Context,
        region: &Region,
        offset: u64,
        length: u64,
        access: &str,
    ) -> PyResult<UcxRegistration> {
        let access = access_of(access)?;
        let mut shared = region.shared()?;
        let ctx = context.inner.clone();
        let reg = py
            .allow_threads(|| self.inner.register_region(&ctx, &mut shared, offset, length, access))
            .map_err(error)?;
        Ok(UcxRegistration { inner: Mutex::new(Some(reg)) })
    }

    /// Registers all of `allocation` (an `Allocation` or a
    /// `CachedAllocation`; `context` is its mechanism's: its loss
    /// deregisters) and pins it: its `free()` returns, but the bytes stay
    /// allocated and charged until `deregister` (and the manager's next
    /// poll); a cached block goes to no other request meanwhile. Its
    /// DLPack exports do not wait for the registration. `access` is "read"
    /// or "read_write".
    #[pyo3(signature = (context, allocation, access="read"))]
    fn register_allocation(
        &self,
        py: Python<'_>,
        context: &Context,
        allocation: AnyAllocation<'_>,
        access: &str,
    ) -> PyResult<UcxRegistration> {
        self.register(py, context, allocation.as_ref(), None, access)
    }

    /// Registers `length` bytes at `offset` of `allocation` (an
    /// `Allocation` or a `CachedAllocation`) and pins the whole allocation
    /// as `register_allocation` does. A length of 0, or a part past the
    /// allocation's size, raises `InvalidArgument`.
    #[pyo3(signature = (context, allocation, offset, length, access="read"))]
    fn register_allocation_range(
        &self,
        py: Python<'_>,
        context: &Context,
        allocation: AnyAllocation<'_>,
        offset: u64,
        length: u64,
        access: &str,
    ) -> PyResult<UcxRegistration> {
        self.register(py, context, allocation.as_ref(), Some((offset, length)), access)
    }
}

impl Ucx {
    fn register(
        &self,
        py: Python<'_>,
        context: &Context,
        allocation: AllocationRef<'_>,
        part: Option<(u64, u64)>,
        access: &str,
    ) -> PyResult<UcxRegistration> {
        let access = access_of(access)?;
        let ctx = context.inner.clone();
        let reg = py
            .allow_threads(|| {
                allocation.with_side(|side| match part {
                    None => self.inner.register_allocation(&ctx, side, access),
                    Some((offset, len)) => {
                        self.inner.register_allocation_range(&ctx, side, offset, len, access)
                    }
                })
            })
            .ok_or_else(|| errors::released(allocation.what()))?
            .map_err(error)?;
        Ok(UcxRegistration { inner: Mutex::new(Some(reg)) })
    }
}

fn access_of(access: &str) -> PyResult<Access> {
    match access {
        "read" => Ok(Access::Read),
        "read_write" => Ok(Access::ReadWrite),
        a => Err(errors::invalid(format!("access {a:?}: use \"read\" or \"read_write\""))),
    }
}

/// A Python `Allocation` as the crate sees it: the host allocation (shared
/// with its DLPack exports), where a transfer is recorded (its uses: the
/// free and exports wait for it) and where a registration's pin is (its
/// pins: the free waits for it).
struct AllocationSide<'a> {
    a: &'a Arc<OwnedAllocation>,
    uses: &'a Uses,
    pins: &'a Uses,
}

impl LocalAllocation for AllocationSide<'_> {
    fn addr(&self) -> u64 {
        self.a.addr()
    }
    fn size(&self) -> u64 {
        self.a.size()
    }
    fn is_lost(&self) -> bool {
        self.a.is_lost()
    }
    fn used_by(&mut self, fence: SharedFence) {
        self.uses.add(fence)
    }
    fn pinned_by(&mut self, fence: SharedFence) {
        self.pins.add(fence)
    }
}

/// A cached block as the crate sees it: the host block (shared with its
/// DLPack exports), where a transfer is recorded both as a use (its
/// exports wait for the bytes to land) and as a pin, and a registration
/// as a pin (the block's free hands the pins to the cache, which reuses
/// it for nobody until they complete).
struct CachedSide<'a> {
    a: &'a Arc<HostCached>,
    uses: &'a Uses,
    pins: &'a Uses,
}

impl LocalAllocation for CachedSide<'_> {
    fn addr(&self) -> u64 {
        self.a.addr()
    }
    fn size(&self) -> u64 {
        self.a.size()
    }
    fn is_lost(&self) -> bool {
        self.a.is_lost()
    }
    fn used_by(&mut self, fence: SharedFence) {
        self.uses.add(fence.clone());
        self.pins.add(fence)
    }
    fn pinned_by(&mut self, fence: SharedFence) {
        self.pins.add(fence)
    }
}

/// Either kind of allocation, as the crate sees it.
enum Side<'a> {
    Plain(AllocationSide<'a>),
    Cached(CachedSide<'a>),
}

impl LocalAllocation for Side<'_> {
    fn addr(&self) -> u64 {
        match self {
            Side::Plain(s) => s.addr(),
            Side::Cached(s) => s.addr(),
        }
    }
    fn size(&self) -> u64 {
        match self {
            Side::Plain(s) => s.size(),
            Side::Cached(s) => s.size(),
        }
    }
    fn is_lost(&self) -> bool {
        match self {
            Side::Plain(s) => s.is_lost(),
            Side::Cached(s) => s.is_lost(),
        }
    }
    fn used_by(&mut self, fence: SharedFence) {
        match self {
            Side::Plain(s) => s.used_by(fence),
            Side::Cached(s) => s.used_by(fence),
        }
    }
    fn pinned_by(&mut self, fence: SharedFence) {
        match self {
            Side::Plain(s) => s.pinned_by(fence),
            Side::Cached(s) => s.pinned_by(fence),
        }
    }
}

/// An `Allocation` or a `CachedAllocation` argument.
#[derive(FromPyObject)]
enum AnyAllocation<'py> {
    Plain(PyRef<'py, Allocation>),
    Cached(PyRef<'py, CachedAllocation>),
}

impl AnyAllocation<'_> {
    fn as_ref(&self) -> AllocationRef<'_> {
        match self {
            AnyAllocation::Plain(a) => AllocationRef::Plain(a),
            AnyAllocation::Cached(a) => AllocationRef::Cached(a),
        }
    }
}

/// The same, borrowed (`Send`: used with the GIL released).
#[derive(Clone, Copy)]
enum AllocationRef<'a> {
    Plain(&'a Allocation),
    Cached(&'a CachedAllocation),
}

impl AllocationRef<'_> {
    /// Runs `f` on the allocation's side under its handle's lock (a
    /// `free()` meanwhile waits, then sees what `f` recorded); `None`
    /// once freed.
    fn with_side<R>(self, f: impl FnOnce(&mut Side<'_>) -> R) -> Option<R> {
        match self {
            AllocationRef::Plain(a) => {
                a.with_parts(|a, uses, pins| f(&mut Side::Plain(AllocationSide { a, uses, pins })))
            }
            AllocationRef::Cached(a) => {
                a.with_parts(|a, uses, pins| f(&mut Side::Cached(CachedSide { a, uses, pins })))
            }
        }
    }
    fn what(self) -> &'static str {
        match self {
            AllocationRef::Plain(_) => "allocation",
            AllocationRef::Cached(_) => "cached allocation",
        }
    }
}

/// A registered, pinned range of a region, or a registered allocation.
#[pyclass(frozen, module = "memplug")]
pub struct UcxRegistration {
    inner: Mutex<Option<memplug_ucx::Registration>>,
}

impl UcxRegistration {
    fn with<R>(&self, f: impl FnOnce(&memplug_ucx::Registration) -> R) -> PyResult<R> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().map(f).ok_or_else(|| errors::released("registration"))
    }
}

#[pymethods]
impl UcxRegistration {
    /// The first registered byte's address.
    #[getter]
    fn addr(&self) -> PyResult<u64> {
        self.with(|r| r.addr())
    }
    /// Registered bytes.
    #[getter]
    fn len(&self) -> PyResult<u64> {
        self.with(|r| r.len())
    }
    /// Peers holding its remote key now.
    #[getter]
    fn holders(&self) -> PyResult<u64> {
        self.with(|r| r.holders())
    }
    /// Deregisters (the range is no longer pinned). Raises `MemplugError`
    /// (status "BUSY", still registered) while a peer holds the key.
    fn deregister(&self) -> PyResult<()> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let reg = g.take().ok_or_else(|| errors::released("registration"))?;
        match reg.deregister() {
            Ok(()) => Ok(()),
            Err((reg, e)) => {
                *g = Some(reg);
                Err(error(e))
            }
        }
    }
}

/// A range the peer offered.
#[pyclass(frozen, module = "memplug")]
pub struct UcxRemoteRange {
    inner: RemoteRange,
}

#[pymethods]
impl UcxRemoteRange {
    /// The offer's id on this connection.
    #[getter]
    fn id(&self) -> u64 {
        self.inner.id
    }
    /// The first byte's address in the peer.
    #[getter]
    fn addr(&self) -> u64 {
        self.inner.addr
    }
    /// Bytes.
    #[getter]
    fn len(&self) -> u64 {
        self.inner.len
    }
    /// Whether it may be written (`push_from_region`).
    #[getter]
    fn writable(&self) -> bool {
        self.inner.writable
    }
    /// The owner's tag.
    #[getter]
    fn tag(&self) -> u64 {
        self.inner.tag
    }
    fn __repr__(&self) -> String {
        let r = &self.inner;
        format!("UcxRemoteRange(id={}, len={}, writable={}, tag={})", r.id, r.len, r.writable, r.tag)
    }
}

/// A get or put in flight (or done). The region it touches waits for it
/// on its own: shrink, offload and release order behind it.
#[pyclass(frozen, module = "memplug")]
pub struct UcxTransfer {
    inner: Transfer,
}

#[pymethods]
impl UcxTransfer {
    /// Bytes it moves.
    #[getter]
    fn bytes(&self) -> u64 {
        self.inner.bytes()
    }
    /// Whether it has completed (successfully or not).
    #[getter]
    fn done(&self, py: Python<'_>) -> bool {
        py.allow_threads(|| self.inner.is_complete())
    }
    /// Waits up to `timeout` seconds; raises on failure (status
    /// "DEVICE_UNAVAILABLE": the peer or endpoint failed) or timeout.
    #[pyo3(signature = (timeout=10.0))]
    fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let t = secs("timeout", timeout)?;
        py.allow_threads(|| self.inner.wait(t)).map_err(error)
    }
}

/// A duplicate of `fd` as a control stream: TCP when it has an Internet
/// peer address, else Unix (`connect` refuses anything UCX cannot use).
fn stream_of(fd: i32) -> PyResult<Box<dyn ControlStream>> {
    if fd < 0 {
        return Err(errors::invalid(format!("fd {fd} is not a descriptor")));
    }
    // SAFETY: borrowed only to duplicate it; the caller keeps its own.
    let owned: OwnedFd = unsafe { BorrowedFd::borrow_raw(fd) }
        .try_clone_to_owned()
        .map_err(|e| errors::invalid(format!("fd {fd}: {e}")))?;
    let tcp = std::net::TcpStream::from(owned);
    if tcp.peer_addr().is_ok() {
        return Ok(Box::new(tcp));
    }
    let unix = std::os::unix::net::UnixStream::from(OwnedFd::from(tcp));
    unix.peer_addr()
        .map_err(|e| errors::invalid(format!("fd {fd} is not a connected stream socket: {e}")))?;
    Ok(Box::new(unix))
}

/// Another process, reached over a connected stream socket (Unix, or TCP
/// between nodes; `fd` is duplicated, the caller keeps its own) that must
/// reach a trusted process. Both sides construct one. `errors` is "peer"
/// (a dead peer fails transfers; UCX then carries bytes over TCP without
/// RDMA) or "none" (shared memory is eligible; a dead peer's transfers
/// never complete), the same on both sides.
#[pyclass(frozen, module = "memplug")]
pub struct UcxPeer {
    inner: Mutex<Option<Peer>>,
}

impl UcxPeer {
    fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&mut Peer) -> Result<R, UcxError> + Send) -> PyResult<R>
    where
        R: Send,
    {
        py.allow_threads(|| {
            let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            match g.as_mut() {
                Some(p) => Ok(f(p)),
                None => Err(()),
            }
        })
        .map_err(|()| errors::released("peer"))?
        .map_err(error)
    }
}

impl UcxPeer {
    /// A transfer between the peer and `allocation`, under the peer's lock
    /// and then the allocation's (a `free()` meanwhile waits, then sees the
    /// transfer recorded).
    fn with_allocation(
        &self,
        py: Python<'_>,
        allocation: AllocationRef<'_>,
        f: impl FnOnce(&mut Peer, &mut Side<'_>) -> Result<Transfer, UcxError> + Send,
    ) -> PyResult<UcxTransfer> {
        let moved = self.with(py, |p| Ok(allocation.with_side(|side| f(p, side))))?;
        let t = moved.ok_or_else(|| errors::released(allocation.what()))?.map_err(error)?;
        Ok(UcxTransfer { inner: t })
    }
}

#[pymethods]
impl UcxPeer {
    #[new]
    #[pyo3(signature = (ucx, fd, timeout=10.0, errors="peer"))]
    fn new(py: Python<'_>, ucx: &Ucx, fd: i32, timeout: f64, errors: &str) -> PyResult<Self> {
        let mode = match errors {
            "peer" => ErrorHandling::Peer,
            "none" => ErrorHandling::None,
            m => return Err(errors::invalid(format!("errors {m:?}: use \"peer\" or \"none\""))),
        };
        let t = secs("timeout", timeout)?;
        let stream = stream_of(fd)?;
        let u = ucx.inner.clone();
        let peer = py.allow_threads(move || Peer::connect_with(&u, stream, t, mode)).map_err(error)?;
        Ok(UcxPeer { inner: Mutex::new(Some(peer)) })
    }

    /// Offers `registration` with `tag`; returns the offer's id. Until the
    /// peer releases it (or `revoke` succeeds) it cannot be deregistered.
    fn offer(&self, py: Python<'_>, registration: &UcxRegistration, tag: u64) -> PyResult<u64> {
        let g = registration.inner.lock().unwrap_or_else(|p| p.into_inner());
        let reg = g.as_ref().ok_or_else(|| errors::released("registration"))?;
        self.with(py, |p| p.offer(reg, tag))
    }

    /// The next range the peer offers, waiting up to `timeout` seconds.
    #[pyo3(signature = (timeout=10.0))]
    fn next_offer(&self, py: Python<'_>, timeout: f64) -> PyResult<UcxRemoteRange> {
        let t = secs("timeout", timeout)?;
        self.with(py, |p| p.next_offer(t)).map(|inner| UcxRemoteRange { inner })
    }

    /// Serves the peer (progress for its reads and writes of this side's
    /// memory, its releases and revokes) for up to `timeout` seconds;
    /// returns whether it has left.
    #[pyo3(signature = (timeout=10.0))]
    fn serve(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        let t = secs("timeout", timeout)?;
        self.with(py, |p| match p.serve(t) {
            Ok(_) => Ok(true),
            Err(UcxError::Timeout { .. }) => Ok(false),
            Err(e) => Err(e),
        })
    }

    /// Reads `length` bytes at `src_offset` of `range` into `region` at
    /// `dst_offset`, growing the region first when the destination reaches
    /// past its length (charged before any byte moves: `OutOfBudget`, and
    /// nothing moved).
    fn pull_into_region(
        &self,
        py: Python<'_>,
        region: &Region,
        dst_offset: u64,
        range: &UcxRemoteRange,
        src_offset: u64,
        length: u64,
    ) -> PyResult<UcxTransfer> {
        let mut shared = region.shared()?;
        let r = range.inner;
        self.with(py, |p| p.pull_into_region(&mut shared, dst_offset, &r, src_offset, length))
            .map(|inner| UcxTransfer { inner })
    }

    /// Writes `length` bytes of `region` at `src_offset` into a writable
    /// `range` at `dst_offset`.
    fn push_from_region(
        &self,
        py: Python<'_>,
        region: &Region,
        src_offset: u64,
        range: &UcxRemoteRange,
        dst_offset: u64,
        length: u64,
    ) -> PyResult<UcxTransfer> {
        let mut shared = region.shared()?;
        let r = range.inner;
        self.with(py, |p| p.push_from_region(&mut shared, src_offset, &r, dst_offset, length))
            .map(|inner| UcxTransfer { inner })
    }

    /// Reads `length` bytes at `src_offset` of `range` into `allocation`
    /// (an `Allocation` or a `CachedAllocation`) at `dst_offset` (inside
    /// it: nothing grows; its bytes were charged when allocated). Its
    /// exports and its free wait for the transfer (a cached block freed
    /// meanwhile goes to no other request until it completes).
    fn pull_into_allocation(
        &self,
        py: Python<'_>,
        allocation: AnyAllocation<'_>,
        dst_offset: u64,
        range: &UcxRemoteRange,
        src_offset: u64,
        length: u64,
    ) -> PyResult<UcxTransfer> {
        let r = range.inner;
        self.with_allocation(py, allocation.as_ref(), |p, side| {
            p.pull_into_allocation(side, dst_offset, &r, src_offset, length)
        })
    }

    /// Writes `length` bytes of `allocation` (an `Allocation` or a
    /// `CachedAllocation`) at `src_offset` into a writable `range` at
    /// `dst_offset`. Its free waits for the transfer.
    fn push_from_allocation(
        &self,
        py: Python<'_>,
        allocation: AnyAllocation<'_>,
        src_offset: u64,
        range: &UcxRemoteRange,
        dst_offset: u64,
        length: u64,
    ) -> PyResult<UcxTransfer> {
        let r = range.inner;
        self.with_allocation(py, allocation.as_ref(), |p, side| {
            p.push_from_allocation(side, src_offset, &r, dst_offset, length)
        })
    }

    /// Gives `range` back to its owner after this side's transfers on it.
    #[pyo3(signature = (range, timeout=10.0))]
    fn release(&self, py: Python<'_>, range: &UcxRemoteRange, timeout: f64) -> PyResult<()> {
        let t = secs("timeout", timeout)?;
        let r = range.inner;
        self.with(py, |p| p.release(&r, t))
    }

    /// Asks the peer to stop using offer `offer_id` and waits for its
    /// acknowledgement; then the registration may be deregistered.
    #[pyo3(signature = (offer_id, timeout=10.0))]
    fn revoke(&self, py: Python<'_>, offer_id: u64, timeout: f64) -> PyResult<()> {
        let t = secs("timeout", timeout)?;
        self.with(py, |p| p.revoke(offer_id, t))
    }

    /// Says goodbye and closes the endpoint (also on garbage collection).
    fn close(&self, py: Python<'_>) {
        let p = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        py.allow_threads(move || drop(p));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }
}
