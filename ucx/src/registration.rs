//! Registration: a memplug range made known to UCP (`ucp_mem_map` on the
//! existing memory, never an allocation by UCX), its packed remote key, and
//! the residency it holds.
//!
//! Residency reuses the host's own mechanism rather than a parallel one: a
//! registration is recorded on its region or allocation as work in flight
//! (`Region::used_by` / `OwnedAllocation::used_by`) through a fence that
//! completes when the range is deregistered ([`Registration::pin`]). The
//! host already makes everything that would pull memory from under work in
//! flight wait for such fences: a shrink's decommit is queued behind them
//! (and the range cannot be committed again until it ran: `Busy`), offload
//! and privatise wait up to their timeout and refuse with `Busy`, and the
//! region's or allocation's release waits. So a registered range stays
//! mapped and resident, in the governor's sense, until deregistered.
//!
//! A loss deregisters first: the registration subscribes to its context,
//! and on `Lost` (the memory went with the device) it unmaps from UCP
//! before anything else can touch the range. A retiring context cannot
//! terminate before then either: the region it would wait for waits for
//! the pin.

use crate::context::{Inner, Ucx};
use crate::error::{check, UcxError};
use crate::local::{LocalAllocation, LocalRegion};
use crate::sys;
use memplug_host::{CallError, Context, FenceSource, LifeState, SharedFence, SubscriptionId};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Whether a peer may write the range or only read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Peers read (`ucp_get_nbx`) only: a shared prefix, mapped read-only.
    Read,
    /// Peers read and write (`ucp_put_nbx`).
    ReadWrite,
}

/// A range registered with UCP. Deregisters on drop; while it lives, the
/// range it covers stays resident (see the module documentation).
pub struct Registration {
    pub(crate) inner: Arc<RegInner>,
}

pub(crate) struct RegInner {
    pub(crate) ucx: Arc<Inner>,
    /// `None` once deregistered.
    memh: Mutex<Option<Memh>>,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) access: Access,
    /// Peers holding the range's remote key, and whether the owner's
    /// handle is gone (then the last holder out deregisters).
    pub(crate) holds: Mutex<Holds>,
    /// The context subscription that deregisters on a loss.
    watch: Mutex<Option<(Arc<Context>, SubscriptionId)>>,
}

/// Who still needs the registration besides its owner's handle.
#[derive(Default)]
pub(crate) struct Holds {
    /// Peers holding the remote key (`Peer::offer` adds; the peer's
    /// release, a completed revoke, or the peer's loss removes).
    pub(crate) peers: u64,
    /// The `Registration` handle was dropped.
    owner_gone: bool,
}

struct Memh(sys::ucp_mem_h);
// SAFETY: a handle of the thread-safe context; used under the worker lock.
unsafe impl Send for Memh {}

impl Ucx {
    /// Registers `[addr, addr + len)`, memory the caller keeps mapped until
    /// the registration is gone. Prefer [`register_region`] and
    /// [`register_allocation`], which also keep the range resident.
    ///
    /// # Safety
    /// The range must stay mapped (with at least `access`) until the
    /// returned registration is dropped or deregistered.
    ///
    /// [`register_region`]: Ucx::register_region
    /// [`register_allocation`]: Ucx::register_allocation
    pub unsafe fn register_raw(&self, addr: u64, len: u64, access: Access) -> Result<Registration, UcxError> {
        if len == 0 {
            return Err(UcxError::Invalid("cannot register an empty range".into()));
        }
        let ucp = self.inner.ucp;
        let prot = match access {
            Access::Read => sys::UCP_MEM_MAP_PROT_LOCAL_READ | sys::UCP_MEM_MAP_PROT_REMOTE_READ,
            Access::ReadWrite => {
                sys::UCP_MEM_MAP_PROT_LOCAL_READ
                    | sys::UCP_MEM_MAP_PROT_LOCAL_WRITE
                    | sys::UCP_MEM_MAP_PROT_REMOTE_READ
                    | sys::UCP_MEM_MAP_PROT_REMOTE_WRITE
            }
        };
        let params = sys::ucp_mem_map_params_t {
            field_mask: sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS
                | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH
                | sys::UCP_MEM_MAP_PARAM_FIELD_PROT,
            address: addr as *mut _,
            length: len as usize,
            prot,
            ..Default::default()
        };
        let mut memh = std::ptr::null_mut();
        {
            let _w = self.inner.lock();
            // SAFETY: a live context; the caller vouches for the range.
            check("ucp_mem_map", unsafe { (ucp.mem_map)(self.inner.context, &params, &mut memh) })?;
        }
        Ok(Registration {
            inner: Arc::new(RegInner {
                ucx: self.inner.clone(),
                memh: Mutex::new(Some(Memh(memh))),
                addr,
                len,
                access,
                holds: Mutex::new(Holds::default()),
                watch: Mutex::new(None),
            }),
        })
    }

    /// Registers `len` bytes at `offset` of `region` (a `Region` or a
    /// `SharedRegion`: [`LocalRegion`]; its shared prefix
    /// is `[0, prefix length)`, its private part follows) and pins them:
    /// until the registration is gone, a shrink over it is queued (the
    /// range stays committed and charged, and cannot be grown back into:
    /// `Busy`), offload and privatise refuse with `Busy` after their
    /// timeout, and the region's release waits. `context` is the region's
    /// context (its loss deregisters). A grow does not extend a
    /// registration: register the new part (`GrowingRegistration` does).
    ///
    /// Refused: an empty range or one past the usable length (`Invalid`);
    /// writable access over a read-only prefix (`Invalid`); an offloaded
    /// or lost region (`Invalid`).
    pub fn register_region(
        &self,
        context: &Arc<Context>,
        region: &mut impl LocalRegion,
        offset: u64,
        len: u64,
        access: Access,
    ) -> Result<Registration, UcxError> {
        let view = region.view();
        if view.is_lost() || view.is_offloaded() {
            return Err(UcxError::Invalid(format!(
                "cannot register part of a {} region",
                if view.is_lost() { "lost" } else { "offloaded" }
            )));
        }
        let end = offset.checked_add(len).filter(|&e| e <= view.len);
        if len == 0 || end.is_none() {
            return Err(UcxError::Invalid(format!(
                "range +{offset} ({len} B) is not inside the region's usable {} B",
                view.len
            )));
        }
        let prefix_len = view.len - region.committed();
        if access == Access::ReadWrite && region.prefix_is_read_only() && offset < prefix_len {
            return Err(UcxError::Invalid(format!(
                "range +{offset} ({len} B) covers the read-only shared prefix ({prefix_len} B): register it \
                 with Access::Read"
            )));
        }
        // SAFETY: inside the region's usable (mapped) length; the pin
        // recorded below keeps it mapped until the registration is gone.
        let reg = unsafe { self.register_raw(view.addr + offset, len, access)? };
        reg.watch(context);
        region.used_by(reg.pin());
        Ok(reg)
    }

    /// Registers a whole allocation (an `OwnedAllocation`, a
    /// `CachedAllocation`, or another [`LocalAllocation`]) and pins it: its
    /// release waits until the registration is gone (a cached block is
    /// reused by nobody meanwhile). As
    /// [`register_allocation_range`](Self::register_allocation_range) over
    /// all of its bytes.
    pub fn register_allocation(
        &self,
        context: &Arc<Context>,
        allocation: &mut impl LocalAllocation,
        access: Access,
    ) -> Result<Registration, UcxError> {
        let size = allocation.size();
        self.register_allocation_range(context, allocation, 0, size, access)
    }

    /// Registers `len` bytes at `offset` of an allocation and pins the
    /// allocation (all of it: its release waits until the registration is
    /// gone, as for [`register_allocation`](Self::register_allocation)).
    /// `context` is the allocation's context (its loss deregisters).
    ///
    /// Refused (`Invalid`, nothing registered or pinned): an empty range,
    /// `offset + len` past the allocation's size or overflowing, an
    /// allocation that went with a lost device.
    pub fn register_allocation_range(
        &self,
        context: &Arc<Context>,
        allocation: &mut impl LocalAllocation,
        offset: u64,
        len: u64,
        access: Access,
    ) -> Result<Registration, UcxError> {
        if allocation.is_lost() {
            return Err(UcxError::Invalid("cannot register a lost allocation".into()));
        }
        let size = allocation.size();
        if len == 0 || offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(UcxError::Invalid(format!(
                "range +{offset} ({len} B) is not inside the allocation's {size} B"
            )));
        }
        // SAFETY: inside the allocation's bytes; the pin keeps them until
        // the registration is gone.
        let reg = unsafe { self.register_raw(allocation.addr() + offset, len, access)? };
        reg.watch(context);
        allocation.pinned_by(reg.pin());
        Ok(reg)
    }
}

impl Registration {
    /// The registered address.
    pub fn addr(&self) -> u64 {
        self.inner.addr
    }
    /// The registered length.
    pub fn len(&self) -> u64 {
        self.inner.len
    }
    /// Never true: an empty range is refused.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }
    /// How peers may reach it.
    pub fn access(&self) -> Access {
        self.inner.access
    }
    /// Whether it is still registered (a context loss deregisters).
    pub fn is_registered(&self) -> bool {
        self.inner.memh.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }
    /// Peers that hold its remote key now.
    pub fn holders(&self) -> u64 {
        self.inner.holds().peers
    }

    /// A fence complete once the range is deregistered: record it as work
    /// on whatever owns the memory (done by `register_region` and
    /// `register_allocation`).
    pub fn pin(&self) -> SharedFence {
        Arc::new(Pin(self.inner.clone()))
    }

    /// Deregisters now. Refused (`Busy`) while a peer holds the remote key:
    /// revoke it first (`Peer::revoke`), or let the peer release it.
    pub fn deregister(self) -> Result<(), (Registration, UcxError)> {
        let held = self.holders();
        if held > 0 {
            let e = UcxError::Busy(format!(
                "{held} peer(s) hold the remote key of {:#x} ({} B): revoke it or wait for their release",
                self.inner.addr, self.inner.len
            ));
            return Err((self, e));
        }
        self.inner.unmap();
        Ok(())
    }

    /// The packed remote key (opaque bytes for the peer's `ucp_ep_rkey_unpack`).
    pub(crate) fn pack(&self) -> Result<Vec<u8>, UcxError> {
        let inner = &self.inner;
        let guard = inner.memh.lock().unwrap_or_else(|p| p.into_inner());
        let memh = guard.as_ref().ok_or_else(|| UcxError::Invalid("the range was deregistered".into()))?;
        let ucp = inner.ucx.ucp;
        let (mut buf, mut size) = (std::ptr::null_mut(), 0usize);
        let _w = inner.ucx.lock();
        // SAFETY: a live memh of this context; valid out-pointers.
        check("ucp_rkey_pack", unsafe { (ucp.rkey_pack)(inner.ucx.context, memh.0, &mut buf, &mut size) })?;
        // SAFETY: UCX returned `size` bytes at `buf`, released right after.
        let bytes = unsafe { std::slice::from_raw_parts(buf as *const u8, size) }.to_vec();
        // SAFETY: returned by ucp_rkey_pack.
        unsafe { (ucp.rkey_buffer_release)(buf) };
        Ok(bytes)
    }

    fn watch(&self, context: &Arc<Context>) {
        let weak: Weak<RegInner> = Arc::downgrade(&self.inner);
        let id = context.subscribe(move |e| {
            if e.to >= LifeState::Lost {
                if let Some(r) = weak.upgrade() {
                    r.unmap();
                }
            }
        });
        *self.inner.watch.lock().unwrap_or_else(|p| p.into_inner()) = Some((context.clone(), id));
        // A loss before the subscription: deregister now.
        if context.state() >= LifeState::Lost {
            self.inner.unmap();
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Holders' keys die with the memory handle: a peer that still
        // holds one must release it, be revoked or be lost first, or its
        // transfers would reach unregistered memory. So the drop of this
        // handle unmaps only when no peer holds it; otherwise the last
        // holder out does (`release_hold`), and the pin keeps the range
        // resident until then.
        let mut h = self.inner.holds();
        h.owner_gone = true;
        let unmap = h.peers == 0;
        drop(h);
        if unmap {
            self.inner.unmap();
        }
    }
}

impl RegInner {
    /// `ucp_mem_unmap`, once.
    pub(crate) fn unmap(&self) {
        let taken = self.memh.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(m) = taken {
            let _w = self.ucx.lock();
            // SAFETY: a live memh of this context, unmapped once.
            let _ = unsafe { (self.ucx.ucp.mem_unmap)(self.ucx.context, m.0) };
        }
        if let Some((ctx, id)) = self.watch.lock().unwrap_or_else(|p| p.into_inner()).take() {
            ctx.unsubscribe(id);
        }
    }

    /// A peer released or revoked its key (or was lost): the last one out
    /// unmaps when the owner's handle is already gone.
    pub(crate) fn release_hold(&self) {
        let mut h = self.holds();
        h.peers = h.peers.saturating_sub(1);
        let unmap = h.peers == 0 && h.owner_gone;
        drop(h);
        if unmap {
            self.unmap();
        }
    }

    pub(crate) fn add_hold(&self) {
        self.holds().peers += 1;
    }

    pub(crate) fn holds(&self) -> std::sync::MutexGuard<'_, Holds> {
        self.holds.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn is_registered(&self) -> bool {
        self.memh.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }
}

/// Complete once the registration is gone: what keeps the range resident.
struct Pin(Arc<RegInner>);

impl FenceSource for Pin {
    fn query(&self) -> Result<bool, CallError> {
        Ok(!self.0.is_registered())
    }
    fn wait(&self, timeout: Duration) -> Result<bool, CallError> {
        let deadline = Instant::now() + timeout;
        loop {
            if !self.0.is_registered() {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            std::thread::sleep((deadline - now).min(Duration::from_millis(1)));
        }
    }
    fn describe(&self) -> String {
        format!("UCX registration of {:#x} ({} B)", self.0.addr, self.0.len)
    }
}
