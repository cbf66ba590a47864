//! Endpoints, unpacked remote keys and one-sided transfers.
//!
//! A transfer's completion is a memplug fence ([`Transfer::fence`]): record
//! it on the local region or allocation (`used_by`, `release_after`, the
//! deferred queue) and its free, shrink or offload orders behind the
//! transfer, as behind device work. The fence progresses the worker when
//! queried, so the queue's reaper drives transfers nobody waits on.
//!
//! A transfer that ends in error (the peer died, the endpoint failed, it
//! was cancelled) is complete for freeing — the request is over and UCX
//! touches the buffer no more — and [`Transfer::wait`] returns the error.

use crate::context::Inner;
use crate::error::{ucx_error, UcxError};
use crate::sys;
use memplug_host::{CallError, FenceSource};
use std::ffi::c_void;
use std::sync::atomic::{AtomicI8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An endpoint to a peer's worker, with peer-failure handling
/// (`UCP_ERR_HANDLING_MODE_PEER`): a dead peer fails its requests instead
/// of hanging them, and a force-close cancels what is in flight.
pub(crate) struct Endpoint {
    pub(crate) ucx: Arc<Inner>,
    ep: Mutex<Option<Ep>>,
    /// Set by UCX's error callback (a `ucs_status_t`, 0 while healthy).
    /// Boxed at a stable address given to UCX as the callback's argument;
    /// freed only after the endpoint is closed (or leaked when a close
    /// never completes: a byte, rather than a callback into freed memory).
    failed: *const AtomicI8,
    mode: ErrorHandling,
}

/// How an endpoint meets a peer's failure: a choice UCX makes the caller
/// take, because it decides which transports carry the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ErrorHandling {
    /// `UCP_ERR_HANDLING_MODE_PEER` (the default): a dead peer or a failed
    /// endpoint fails the transfers in flight, and a transfer past its
    /// deadline is cancelled (the endpoint is force-closed), so every wait
    /// ends with the local memory free of UCX. UCX then uses only
    /// transports with peer-failure support for active messages and
    /// emulated RMA: on a machine without RDMA that is TCP, even between
    /// processes of one node (UCX 1.13: `posix`/`sysv` shared memory has
    /// no failure handler).
    #[default]
    Peer,
    /// `UCP_ERR_HANDLING_MODE_NONE`: every transport is eligible (shared
    /// memory between processes of one node), but a peer that dies leaves
    /// its transfers in flight for ever: a wait returns `Timeout` at its
    /// deadline and the transfer's fence stays pending, so the local
    /// memory is never freed under it (it stays charged until the process
    /// ends). A release or revoke waits for such a transfer (the owner is
    /// told only when it completes). But a holder that goes away with a
    /// transfer still in flight gives its ranges back at once (its owner
    /// cannot tell a dead peer from a slow one), and an emulated get then
    /// served by the owner's worker could read memory the owner has since
    /// freed. For peers whose life the caller controls and which wait for
    /// their transfers.
    None,
}

struct Ep(sys::ucp_ep_h);
// SAFETY: a handle used under the worker lock.
unsafe impl Send for Ep {}
// SAFETY: `failed` is an atomic; the handle is under a mutex and the lock.
unsafe impl Send for Endpoint {}
// SAFETY: as above.
unsafe impl Sync for Endpoint {}

unsafe extern "C" fn on_error(arg: *mut c_void, _ep: sys::ucp_ep_h, status: sys::ucs_status_t) {
    // SAFETY: `arg` is the endpoint's `failed`, alive until after close.
    let failed = unsafe { &*(arg as *const AtomicI8) };
    failed.store(if status == sys::UCS_OK { sys::UCS_ERR_CANCELED } else { status }, Ordering::Release);
}

impl Endpoint {
    /// Connects to the worker whose address a peer sent.
    pub(crate) fn connect(
        ucx: &Arc<Inner>,
        address: &[u8],
        mode: ErrorHandling,
    ) -> Result<Arc<Endpoint>, UcxError> {
        let failed = Box::into_raw(Box::new(AtomicI8::new(0)));
        let params = sys::ucp_ep_params_t {
            field_mask: sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
                | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER,
            address: address.as_ptr() as *const _,
            err_mode: match mode {
                ErrorHandling::Peer => sys::UCP_ERR_HANDLING_MODE_PEER,
                ErrorHandling::None => sys::UCP_ERR_HANDLING_MODE_NONE,
            },
            err_handler: sys::ucp_err_handler_t { cb: Some(on_error), arg: failed as *mut c_void },
            ..Default::default()
        };
        let mut ep = std::ptr::null_mut();
        let st = {
            let w = ucx.lock();
            // SAFETY: a live worker under its lock; the address bytes came
            // from the peer's ucp_worker_get_address (UCX validates them).
            unsafe { (ucx.ucp.ep_create)(w.0, &params, &mut ep) }
        };
        if st != sys::UCS_OK {
            // SAFETY: made above; UCX has no endpoint that could call back.
            drop(unsafe { Box::from_raw(failed) });
            let e = ucx_error("ucp_ep_create", st);
            if st == sys::UCS_ERR_UNREACHABLE && mode == ErrorHandling::Peer {
                // The usual cause on one node: UCX_TLS names only shared
                // memory, which UCX drops in peer-failure mode.
                return Err(UcxError::Invalid(format!(
                    "{e}: with ErrorHandling::Peer UCX needs a transport with peer-failure handling (tcp, rc, \
                     ud, dc); shared memory alone (posix, sysv, cma) needs ErrorHandling::None on both sides"
                )));
            }
            return Err(e);
        }
        Ok(Arc::new(Endpoint { ucx: ucx.clone(), ep: Mutex::new(Some(Ep(ep))), failed, mode }))
    }

    /// The endpoint's error, if UCX reported one.
    pub(crate) fn error(&self) -> Option<sys::ucs_status_t> {
        // SAFETY: alive as long as `self`.
        let s = unsafe { &*self.failed }.load(Ordering::Acquire);
        (s != 0).then_some(s)
    }

    fn handle(&self) -> Result<sys::ucp_ep_h, UcxError> {
        if let Some(s) = self.error() {
            return Err(UcxError::PeerLost(format!("the endpoint failed: {}", self.ucx.ucp.describe(s))));
        }
        self.ep
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|e| e.0)
            .ok_or_else(|| UcxError::PeerLost("the endpoint was closed".into()))
    }

    /// Unpacks a peer's remote key on this endpoint.
    pub(crate) fn unpack(self: &Arc<Self>, packed: &[u8]) -> Result<RemoteKey, UcxError> {
        let ep = self.handle()?;
        let mut rkey = std::ptr::null_mut();
        let st = {
            let _w = self.ucx.lock();
            // SAFETY: a live endpoint; bytes from the peer's ucp_rkey_pack.
            unsafe { (self.ucx.ucp.ep_rkey_unpack)(ep, packed.as_ptr() as *const _, &mut rkey) }
        };
        if st != sys::UCS_OK {
            return Err(ucx_error("ucp_ep_rkey_unpack", st));
        }
        Ok(RemoteKey { ep: self.clone(), rkey })
    }

    /// Waits (up to `timeout`) until every transfer issued on the endpoint
    /// has completed at the peer too (`ucp_ep_flush_nbx`): a put's own
    /// completion only means the local buffer is free again.
    pub(crate) fn flush(&self, timeout: Duration) -> Result<(), UcxError> {
        let ep = self.handle()?;
        let params = sys::ucp_request_param_t::default();
        let req = {
            let _w = self.ucx.lock();
            // SAFETY: a live endpoint under the lock.
            unsafe { (self.ucx.ucp.ep_flush_nbx)(ep, &params) }
        };
        if req.is_null() {
            return Ok(());
        }
        if sys::ptr_is_err(req) {
            return Err(ucx_error("ucp_ep_flush_nbx", sys::ptr_status(req)));
        }
        let done = self.ucx.progress_until(Instant::now() + timeout, || self.request_done(req));
        if !done {
            // Cancels the flush with everything else on the endpoint.
            self.close(true, Duration::from_secs(1));
        }
        let status = {
            let _w = self.ucx.lock();
            // SAFETY: a live request; freed once, after its status is read.
            unsafe {
                let s = (self.ucx.ucp.request_check_status)(req);
                (self.ucx.ucp.request_free)(req);
                s
            }
        };
        if !done {
            return Err(UcxError::Timeout { what: "flushing the endpoint".into(), after: timeout });
        }
        match status {
            sys::UCS_OK => Ok(()),
            s => Err(UcxError::PeerLost(format!("flush failed: {}", self.ucx.ucp.describe(s)))),
        }
    }

    /// Closes the endpoint: `force` cancels requests in flight
    /// (`UCS_ERR_CANCELED`) without a word to the peer; otherwise they are
    /// flushed first. Waits up to `timeout`.
    pub(crate) fn close(&self, force: bool, timeout: Duration) {
        let Some(ep) = self.ep.lock().unwrap_or_else(|p| p.into_inner()).take() else { return };
        let params = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_FLAGS,
            // UCX allows a forced close only in peer mode (on both sides).
            flags: if force && self.mode == ErrorHandling::Peer { sys::UCP_EP_CLOSE_FLAG_FORCE } else { 0 },
            ..Default::default()
        };
        let req = {
            let _w = self.ucx.lock();
            // SAFETY: a live endpoint, closed once (taken above).
            unsafe { (self.ucx.ucp.ep_close_nbx)(ep.0, &params) }
        };
        if !req.is_null() && !sys::ptr_is_err(req) {
            // Not finished within the time allowed (a dead peer without
            // peer mode): freeing the request hands it to UCX, which
            // releases it when the close completes, if ever.
            self.ucx.progress_until(Instant::now() + timeout, || self.request_done(req));
            let _w = self.ucx.lock();
            // SAFETY: a request returned by ep_close_nbx, freed once.
            unsafe { (self.ucx.ucp.request_free)(req) };
        }
    }

    fn request_done(&self, req: *mut c_void) -> bool {
        let _w = self.ucx.lock();
        // SAFETY: a live request (freed only after this returns true).
        unsafe { (self.ucx.ucp.request_check_status)(req) != sys::UCS_INPROGRESS }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // Every transfer and key holds the endpoint (an Arc), so none is
        // in flight: a normal close flushes nothing. Force it anyway, so a
        // dead peer cannot hold the close.
        self.close(true, Duration::from_millis(200));
        // SAFETY: closed; UCX calls the error handler of a closed endpoint
        // no more.
        drop(unsafe { Box::from_raw(self.failed as *mut AtomicI8) });
    }
}

/// A peer's remote key, unpacked on an endpoint; destroyed on drop.
pub(crate) struct RemoteKey {
    ep: Arc<Endpoint>,
    rkey: sys::ucp_rkey_h,
}
// SAFETY: a handle used under the worker lock.
unsafe impl Send for RemoteKey {}
// SAFETY: as above.
unsafe impl Sync for RemoteKey {}

impl Drop for RemoteKey {
    fn drop(&mut self) {
        let _w = self.ep.ucx.lock();
        // SAFETY: unpacked once, destroyed once, while its endpoint lives
        // (held by `self.ep`).
        unsafe { (self.ep.ucx.ucp.rkey_destroy)(self.rkey) };
    }
}

/// Which way the bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// `ucp_get_nbx`: remote to local.
    Get,
    /// `ucp_put_nbx`: local to remote.
    Put,
}

/// A one-sided transfer in flight (or done).
#[derive(Clone)]
pub struct Transfer {
    pub(crate) shared: Arc<TransferShared>,
}

impl std::fmt::Debug for Transfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Transfer({})", self.shared.what)
    }
}

pub(crate) struct TransferShared {
    key: Arc<RemoteKey>,
    /// The request while in flight; `None` once complete (freed).
    state: Mutex<State>,
    bytes: u64,
    what: String,
}

struct State {
    req: Option<Req>,
    status: sys::ucs_status_t,
}
struct Req(*mut c_void);
// SAFETY: a request handle used under the worker lock.
unsafe impl Send for Req {}

impl Transfer {
    /// Issues the transfer of `len` bytes between `local` and the remote
    /// address `remote` under `key`.
    ///
    /// # Safety
    /// `local` must stay valid (writable for a get) until the transfer is
    /// complete: record [`fence`](Self::fence) on what owns it.
    pub(crate) unsafe fn issue(
        key: &Arc<RemoteKey>,
        dir: Direction,
        local: u64,
        remote: u64,
        len: u64,
        what: String,
    ) -> Result<Transfer, UcxError> {
        let ep = key.ep.handle()?;
        let ucx = &key.ep.ucx;
        let params = sys::ucp_request_param_t::default();
        let r = {
            let _w = ucx.lock();
            // SAFETY: live endpoint and key; the caller vouches for the
            // local buffer; the remote range was checked by the caller.
            unsafe {
                match dir {
                    Direction::Get => {
                        (ucx.ucp.get_nbx)(ep, local as *mut c_void, len as usize, remote, key.rkey, &params)
                    }
                    Direction::Put => {
                        (ucx.ucp.put_nbx)(ep, local as *const c_void, len as usize, remote, key.rkey, &params)
                    }
                }
            }
        };
        let state = if r.is_null() {
            State { req: None, status: sys::UCS_OK }
        } else if sys::ptr_is_err(r) {
            return Err(ucx_error(
                if dir == Direction::Get { "ucp_get_nbx" } else { "ucp_put_nbx" },
                sys::ptr_status(r),
            ));
        } else {
            State { req: Some(Req(r)), status: sys::UCS_INPROGRESS }
        };
        Ok(Transfer {
            shared: Arc::new(TransferShared { key: key.clone(), state: Mutex::new(state), bytes: len, what }),
        })
    }

    /// Bytes moved by this transfer.
    pub fn bytes(&self) -> u64 {
        self.shared.bytes
    }

    /// Whether it has completed (successfully or not); progresses once.
    pub fn is_complete(&self) -> bool {
        self.shared.poll()
    }

    /// A fence complete when the transfer is: what frees and shrinks of the
    /// local memory order behind.
    pub fn fence(&self) -> memplug_host::SharedFence {
        self.shared.clone()
    }

    /// Waits for completion until `timeout`. On timeout, with
    /// [`ErrorHandling::Peer`], the endpoint is force-closed, which cancels
    /// this transfer (and others on it), so the local buffer is free of UCX
    /// when this returns either way; with [`ErrorHandling::None`] nothing
    /// can cancel it and its fence stays pending. The error says it timed
    /// out.
    pub fn wait(&self, timeout: Duration) -> Result<(), UcxError> {
        let s = &self.shared;
        let ucx = &s.key.ep.ucx;
        if !ucx.progress_until(Instant::now() + timeout, || s.poll()) {
            if s.key.ep.mode == ErrorHandling::Peer {
                s.key.ep.close(true, Duration::from_secs(1));
            }
            s.poll();
            return Err(UcxError::Timeout { what: s.what.clone(), after: timeout });
        }
        s.outcome()
    }
}

impl TransferShared {
    /// Checks the request (no progress); frees it once complete.
    fn check(&self) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(req) = st.req.as_ref() else { return true };
        let ucx = &self.key.ep.ucx;
        let _w = ucx.lock();
        // SAFETY: a live request of this worker, under the lock.
        let status = unsafe { (ucx.ucp.request_check_status)(req.0) };
        if status == sys::UCS_INPROGRESS {
            return false;
        }
        // SAFETY: complete; freed once (taken below).
        unsafe { (ucx.ucp.request_free)(req.0) };
        st.req = None;
        st.status = status;
        true
    }

    /// One progress pass, then [`check`](Self::check).
    fn poll(&self) -> bool {
        if self.check() {
            return true;
        }
        self.key.ep.ucx.progress();
        self.check()
    }

    fn outcome(&self) -> Result<(), UcxError> {
        let status = self.state.lock().unwrap_or_else(|p| p.into_inner()).status;
        match status {
            sys::UCS_OK => Ok(()),
            s => {
                let ucp = self.key.ep.ucx.ucp;
                let why = match self.key.ep.error() {
                    Some(e) => format!("{} (endpoint: {})", ucp.describe(s), ucp.describe(e)),
                    None => ucp.describe(s),
                };
                Err(UcxError::PeerLost(format!("{} failed: {why}", self.what)))
            }
        }
    }
}

impl FenceSource for TransferShared {
    fn query(&self) -> Result<bool, CallError> {
        Ok(self.poll())
    }
    fn wait(&self, timeout: Duration) -> Result<bool, CallError> {
        Ok(self.key.ep.ucx.progress_until(Instant::now() + timeout, || self.poll()))
    }
    fn describe(&self) -> String {
        format!("UCX transfer: {}", self.what)
    }
}

impl Drop for TransferShared {
    fn drop(&mut self) {
        // The last holder of an unfinished transfer (nobody recorded its
        // fence): cancel it, so the request is not left to UCX for ever.
        let pending = self.state.get_mut().unwrap_or_else(|p| p.into_inner()).req.is_some();
        if pending
            && !self.key.ep.ucx.progress_until(Instant::now() + Duration::from_secs(1), || self.check())
        {
            self.key.ep.close(true, Duration::from_secs(1));
            self.check();
        }
    }
}
