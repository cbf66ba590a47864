//! Mechanism lives through the C API (ARCHITECTURE.md §5): the state of a
//! mechanism's context, retiring it, declaring it lost, replacing it,
//! terminating it and reading its settlement, lifecycle callbacks, and
//! whether an owning object went with a lost device.
//!
//! A mechanism handle names a context (`Arc<Context>`); every call here is
//! about that context. Events are delivered by the host's `dispatch` on the
//! thread that drives the context; a `Subscriber` turns each into a C
//! `MemplugHostLifecycleEvent` valid for the call, marks the thread as
//! inside a lifecycle callback, and lets `unsubscribe` wait for deliveries
//! running on other threads.

use crate::callbacks::{lock_region, not_in_callback, not_in_lifecycle_callback, UserData};
use crate::common::{
    MemplugHostAllocation, MemplugHostManager, MemplugHostMechanism, MemplugHostPrefix, MemplugHostRegion,
    MemplugHostSubscription,
};
use crate::error::{boundary, c_str, require_non_null, write_out, Error, Result};
use crate::handle::Kind;
use crate::manager_tables::{self, pin, pin_manager, same_manager, RegionEntry, SubscriptionEntry};
use crate::status::MemplugHostStatus;
use crate::status::MemplugHostStatus as S;
use crate::struct_size::write_sized;
use crate::subscriber::{life_state, settlement, Subscriber};
use memplug_host_dep::registry::Context;
use memplug_host_dep::{OwnedAllocation, SharedPrefix};
use memplug_sdk::prefix::Prefixed;
use std::ffi::{c_char, c_void};
use std::sync::Arc;
use std::time::Duration;

/// Refuses a caller's out-struct shorter than the 1.0 size before anything
/// irreversible is done, so that the call can still fail without effect.
///
/// # Safety
/// `out` must be NULL or readable for four bytes.
unsafe fn check_out_size<T: Prefixed>(out: *const T, what: &str) -> Result<()> {
    if out.is_null() {
        return Ok(());
    }
    // SAFETY: the caller's contract; `struct_size` is the first field.
    let declared = unsafe { out.cast::<u32>().read_unaligned() };
    if declared < T::SIZE_1_0 {
        return Err(Error::new(
            S::InvalidArgument,
            format!("{what}: struct_size is {declared}, the 1.0 size is {} (set it to sizeof)", T::SIZE_1_0),
        ));
    }
    Ok(())
}

// ---- state ------------------------------------------------------------------

/// Writes the state of the mechanism's context to `out_state`.
///
/// A mechanism handle keeps naming its context through its whole life, also
/// once it terminated and its plugin was unloaded.
/// Thread-safety: any thread (the state may change right after).
///
/// # Safety
/// `out_state` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_mechanism_state(
    mechanism: MemplugHostMechanism,
    out_state: *mut MemplugHostLifeState,
) -> MemplugHostStatus {
    boundary("memplug_host_mechanism_state", || {
        require_non_null(out_state, "out_state")?;
        let (ctx, _) = pin::<Arc<Context>>(mechanism.id)?;
        let state = life_state(ctx.state());
        // SAFETY: checked non-NULL.
        unsafe { write_out(out_state, state) };
        Ok(())
    })
}

/// Copies why the mechanism's context left `MEMPLUG_HOST_LIFE_STATE_ACTIVE`
/// into `buf` like `memplug_host_last_error_message` does (at most
/// `len - 1` bytes, then a NUL; nothing when `buf` is NULL or `len` is 0)
/// and writes the reason's full length in bytes, without the NUL, to
/// `out_len` — 0 for an active context (nothing is copied then). The
/// reason is UTF-8 (the runtime's own text, the plugin's sanitised report,
/// or the host's); a retiring context that is then lost keeps both.
///
/// Ownership: `buf` is the caller's. Thread-safety: any thread.
///
/// # Safety
/// `buf`, when not NULL, must be writable for `len` bytes; `out_len` NULL
/// or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_mechanism_reason(
    mechanism: MemplugHostMechanism,
    buf: *mut c_char,
    len: usize,
    out_len: *mut usize,
) -> MemplugHostStatus {
    boundary("memplug_host_mechanism_reason", || {
        require_non_null(out_len, "out_len")?;
        let (ctx, _) = pin::<Arc<Context>>(mechanism.id)?;
        let reason = ctx.reason().unwrap_or_default();
        let r = reason.as_bytes();
        if !buf.is_null() && len > 0 {
            let n = r.len().min(len - 1);
            // SAFETY: the caller gives `len` writable bytes at `buf`.
            unsafe {
                std::ptr::copy_nonoverlapping(r.as_ptr(), buf.cast::<u8>(), n);
                *buf.add(n) = 0;
            }
        }
        // SAFETY: checked non-NULL.
        unsafe { write_out(out_len, r.len()) };
        Ok(())
    })
}

/// The name of a life state, e.g. `"MEMPLUG_HOST_LIFE_STATE_LOST"`, or
/// `"MEMPLUG_HOST_LIFE_STATE_UNKNOWN"` for a number this library does not
/// know.
///
/// Ownership: the string is static; never free it. Thread-safety: any
/// thread. Never fails.
#[no_mangle]
pub extern "C" fn memplug_host_life_state_name(state: u32) -> *const c_char {
    let name: &'static [u8] = match state {
        0 => b"MEMPLUG_HOST_LIFE_STATE_ACTIVE\0",
        1 => b"MEMPLUG_HOST_LIFE_STATE_RETIRING\0",
        2 => b"MEMPLUG_HOST_LIFE_STATE_LOST\0",
        3 => b"MEMPLUG_HOST_LIFE_STATE_TERMINATED\0",
        _ => b"MEMPLUG_HOST_LIFE_STATE_UNKNOWN\0",
    };
    name.as_ptr().cast()
}

// ---- retire, declare lost, replace ------------------------------------------

/// Starts an orderly end of the mechanism's context: it makes no new
/// binding or object from now on (`MEMPLUG_HOST_STATUS_INVALID_STATE` for
/// them; `memplug_host_binding_create` goes to a successor when there is
/// one), while everything already made keeps working and is freed as usual.
/// It terminates once its last object is gone (`memplug_host_manager_poll`,
/// the reaper, or `memplug_host_manager_terminate`). `reason` (UTF-8) is
/// kept and given to subscribers.
///
/// The `ACTIVE` → `RETIRING` event is delivered to the subscribers before
/// this returns, on this thread. Only an active context can be retired
/// (`MEMPLUG_HOST_STATUS_INVALID_STATE` otherwise). Returns
/// `MEMPLUG_HOST_STATUS_REENTRANT` inside a lifecycle callback.
/// Thread-safety: any thread.
///
/// # Safety
/// `reason` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_mechanism_retire(
    mechanism: MemplugHostMechanism,
    reason: *const c_char,
) -> MemplugHostStatus {
    boundary("memplug_host_mechanism_retire", || {
        not_in_lifecycle_callback("memplug_host_mechanism_retire")?;
        // SAFETY: the caller's contract.
        let reason = unsafe { c_str(reason, "reason") }?;
        let (ctx, _) = pin::<Arc<Context>>(mechanism.id)?;
        ctx.retire(reason)?;
        Ok(())
    })
}

/// Declares the mechanism's context lost on the runtime's own evidence (a
/// kernel fault it saw, a device reset it was told of), exactly as if the
/// plugin had reported it: the host calls the plugin no more; every object
/// the context made went with the device (`memplug_host_allocation_is_lost`
/// and the region and prefix equivalents say so); new work fails with
/// `MEMPLUG_HOST_STATUS_DEVICE_LOST`; calls in flight finish or fail. The
/// charges are settled once, when the context terminates
/// (`memplug_host_manager_poll` does it once no call is in flight, or
/// `memplug_host_manager_terminate`). Handles stay the caller's to destroy:
/// destroying them calls no plugin and refunds nothing twice.
///
/// The `LOST` event, with one loss notice per binding that held something,
/// is delivered to the subscribers before this returns, on this thread.
/// `out_moved` (may be NULL) receives true when this call moved the context
/// to `LOST`, false when it was lost or terminated already (which is not an
/// error). `reason` (UTF-8) is kept and given to subscribers.
///
/// Returns `MEMPLUG_HOST_STATUS_REENTRANT` inside a lifecycle callback.
/// Thread-safety: any thread; never waits for the device.
///
/// # Safety
/// `reason` must be NULL or a NUL-terminated string; `out_moved` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_mechanism_declare_lost(
    mechanism: MemplugHostMechanism,
    reason: *const c_char,
    out_moved: *mut bool,
) -> MemplugHostStatus {
    boundary("memplug_host_mechanism_declare_lost", || {
        not_in_lifecycle_callback("memplug_host_mechanism_declare_lost")?;
        // SAFETY: the caller's contract.
        let reason = unsafe { c_str(reason, "reason") }?;
        let (ctx, _) = pin::<Arc<Context>>(mechanism.id)?;
        let moved = ctx.declare_lost(reason);
        if !out_moved.is_null() {
            // SAFETY: checked non-NULL.
            unsafe { write_out(out_moved, moved) };
        }
        Ok(())
    })
}

/// Replaces the context of `old` by that of `new` (both mechanisms of
/// `manager`, serving the same device): `old` retires (or, lost, stays
/// lost), and from now on every binding asked of `old`
/// (`memplug_host_binding_create`) is made on `new` — or on `new`'s own
/// active successor — and `memplug_host_manager_select` no longer chooses
/// `old`. Objects already made through `old` keep working (unless lost)
/// and are freed by `old`'s plugin; neither mechanism is ever asked to free
/// the other's memory. With `unload_old_plugin`, `old`'s plugin goes as a
/// whole: its other active mechanisms retire too (without a successor),
/// and it is unloaded once every context of it has terminated (a later
/// `memplug_host_manager_poll`, or the reaper); handles to its mechanisms
/// stay valid (and inert).
///
/// The event of `old`'s transition is delivered before this returns, on
/// this thread. Statuses: `MEMPLUG_HOST_STATUS_WRONG_DEVICE` for mechanisms
/// of two devices, `_INVALID_STATE` when `new` is not active or `old` was
/// already replaced or ended, `_INVALID_ARGUMENT` for `old` == `new`,
/// `_WRONG_MANAGER`, and `_REENTRANT` inside a lifecycle callback.
/// Thread-safety: any thread.
///
/// # Safety
/// `reason` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_manager_replace(
    manager: MemplugHostManager,
    old: MemplugHostMechanism,
    new: MemplugHostMechanism,
    reason: *const c_char,
    unload_old_plugin: bool,
) -> MemplugHostStatus {
    boundary("memplug_host_manager_replace", || {
        not_in_lifecycle_callback("memplug_host_manager_replace")?;
        // SAFETY: the caller's contract.
        let reason = unsafe { c_str(reason, "reason") }?;
        let (m, seat) = pin_manager(manager.id)?;
        crate::handle::expect(old.id, Kind::Mechanism)?;
        crate::handle::expect(new.id, Kind::Mechanism)?;
        same_manager(seat, old.id, Kind::Mechanism)?;
        same_manager(seat, new.id, Kind::Mechanism)?;
        let (o, _) = pin::<Arc<Context>>(old.id)?;
        let (n, _) = pin::<Arc<Context>>(new.id)?;
        m.pm.replace(&o, &n, reason, unload_old_plugin)?;
        Ok(())
    })
}

// ---- termination --------------------------------------------------------------

/// Terminates the lost or retiring context of `mechanism` (a mechanism of
/// `manager`) and settles its books exactly once: waits up to `timeout_ns`
/// for calls in flight to finish and, retiring, for its last object to go
/// (retiring queued frees meanwhile), then discharges from the pools every
/// charge its bindings still held — by exactly the bytes charged — and
/// delivers the `TERMINATED` event (with the settlement) on this thread.
/// `out_settlement` (may be NULL; set its `struct_size` first) receives
/// what was settled.
///
/// Statuses: `MEMPLUG_HOST_STATUS_INVALID_STATE` for an active context
/// (retire it or declare it lost first) or one already terminated (read
/// `memplug_host_mechanism_settlement`), `_TIMEOUT` when calls were still
/// in flight at the deadline, `_BUSY` when a retiring context still had
/// live objects then; in each case nothing was settled. `_REENTRANT` inside
/// any callback the host is running (the call it is part of may be one the
/// termination waits for).
///
/// Holds no lock while it waits. Thread-safety: any thread.
///
/// # Safety
/// `out_settlement` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_manager_terminate(
    manager: MemplugHostManager,
    mechanism: MemplugHostMechanism,
    timeout_ns: u64,
    out_settlement: *mut MemplugHostSettlement,
) -> MemplugHostStatus {
    boundary("memplug_host_manager_terminate", || {
        not_in_callback("memplug_host_manager_terminate")?;
        // SAFETY: the caller's contract.
        unsafe { check_out_size(out_settlement, "MemplugHostSettlement") }?;
        let (m, seat) = pin_manager(manager.id)?;
        crate::handle::expect(mechanism.id, Kind::Mechanism)?;
        same_manager(seat, mechanism.id, Kind::Mechanism)?;
        let (ctx, _) = pin::<Arc<Context>>(mechanism.id)?;
        let s = m.pm.terminate(&ctx, Duration::from_nanos(timeout_ns))?;
        if !out_settlement.is_null() {
            // SAFETY: non-NULL; the caller's contract covers the size.
            unsafe { write_sized(out_settlement, settlement(&s), "MemplugHostSettlement") }?;
        }
        Ok(())
    })
}

/// Reads the settlement of the mechanism's terminated context (however it
/// terminated: `memplug_host_manager_terminate`, a poll, the reaper).
/// `MEMPLUG_HOST_STATUS_NOT_READY` while it has not terminated. Set
/// `out->struct_size` first. Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_mechanism_settlement(
    mechanism: MemplugHostMechanism,
    out: *mut MemplugHostSettlement,
) -> MemplugHostStatus {
    boundary("memplug_host_mechanism_settlement", || {
        require_non_null(out, "out")?;
        let (ctx, _) = pin::<Arc<Context>>(mechanism.id)?;
        let s = ctx.settlement().ok_or_else(|| {
            Error::new(
                S::NotReady,
                format!("the context of {} is {}: it has not terminated", ctx.label(), ctx.state()),
            )
        })?;
        // SAFETY: non-NULL; the caller's contract covers the size.
        unsafe { write_sized(out, settlement(&s), "MemplugHostSettlement") }
    })
}

/// Subscribes `callback` to every later transition of the mechanism's
/// context: it is called once per transition, with `userdata` and a
/// `MemplugHostLifecycleEvent` valid for the call (see
/// `MemplugHostLifecycleFn` for the thread it runs on and what it may
/// call). A context that is lost is reported `LOST` (with one loss notice
/// per binding that held something) before it is reported `TERMINATED`
/// (with the settlement). Transitions before the subscription are not
/// replayed: read `memplug_host_mechanism_state` after subscribing.
///
/// `userdata` must stay valid until `memplug_host_mechanism_unsubscribe`
/// (or the manager's destruction) returns, after which the callback is
/// never called again.
///
/// Ownership: the caller owns the subscription handle (written to `out`).
/// It does not keep the mechanism's plugin loaded. Thread-safety: any
/// thread.
///
/// # Safety
/// `callback` (when not NULL) must be callable as `MemplugHostLifecycleFn`
/// with `userdata` from any thread; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_mechanism_subscribe(
    mechanism: MemplugHostMechanism,
    callback: MemplugHostLifecycleFn,
    userdata: *mut c_void,
    out: *mut MemplugHostSubscription,
) -> MemplugHostStatus {
    boundary("memplug_host_mechanism_subscribe", || {
        let callback = callback.ok_or_else(|| Error::null("callback"))?;
        require_non_null(out, "out")?;
        let (ctx, seat) = pin::<Arc<Context>>(mechanism.id)?;
        // The slot first, so that nothing can fail once the context knows
        // the subscriber.
        let vacant = manager_tables::vacant::<SubscriptionEntry>(seat)?;
        let subscriber = Arc::new(Subscriber::new(callback, UserData(userdata), Arc::downgrade(&ctx)));
        let id =
            manager_tables::fill(seat, vacant, SubscriptionEntry { subscriber: subscriber.clone() }, [0, 0]);
        subscriber.set_handle(id);
        let weak = Arc::downgrade(&subscriber);
        let sub_id = ctx.subscribe(move |e| {
            if let Some(s) = weak.upgrade() {
                s.deliver(e);
            }
        });
        if !subscriber.complete(sub_id) {
            // Ended (by a guessed handle, or the manager's destruction)
            // before it was complete.
            ctx.unsubscribe(sub_id);
        }
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, MemplugHostSubscription { id }) };
        Ok(())
    })
}

/// Ends a subscription and releases its handle: no callback starts after
/// this returns, and it returns only when no call of the callback runs on
/// another thread (a callback may end its own subscription; that call goes
/// on), so `userdata` may be freed right after. Not to be called from a
/// callback while another thread's callback waits for this one. The zero
/// handle is a no-op. Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_mechanism_unsubscribe(
    subscription: MemplugHostSubscription,
) -> MemplugHostStatus {
    boundary("memplug_host_mechanism_unsubscribe", || {
        manager_tables::remove_drop::<SubscriptionEntry>(subscription.id)
    })
}

// ---- owning objects of a lost context -----------------------------------------

/// Writes to `out` whether the allocation went with a lost device (the
/// context of the mechanism that made it is `LOST`, or `TERMINATED` after
/// the loss): then its memory is gone, and freeing its handle calls no
/// plugin and refunds nothing (its charge is settled, once, when the
/// context terminates). An allocation of a context that is replaced or
/// retiring is not lost: it keeps working. A free racing this call on another thread
/// waits for it (a few instructions). Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_allocation_is_lost(
    allocation: MemplugHostAllocation,
    out: *mut bool,
) -> MemplugHostStatus {
    boundary("memplug_host_allocation_is_lost", || {
        require_non_null(out, "out")?;
        let (a, _) = pin::<OwnedAllocation>(allocation.id)?;
        let lost = a.is_lost();
        drop(a);
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, lost) };
        Ok(())
    })
}

/// Writes to `out` whether the region went with a lost device (as
/// `memplug_host_allocation_is_lost`: its mapping is gone, and freeing it
/// calls no plugin and refunds nothing). Refused with
/// `MEMPLUG_HOST_STATUS_REENTRANT` from the update callback of this region's
/// grow. Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_region_is_lost(
    region: MemplugHostRegion,
    out: *mut bool,
) -> MemplugHostStatus {
    boundary("memplug_host_region_is_lost", || {
        require_non_null(out, "out")?;
        let (e, _) = pin::<RegionEntry>(region.id)?;
        let lost = lock_region(&e)?.guard.is_lost();
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, lost) };
        Ok(())
    })
}

/// Writes to `out` whether the shared prefix went with a lost device (as
/// `memplug_host_allocation_is_lost`). Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_prefix_is_lost(
    prefix: MemplugHostPrefix,
    out: *mut bool,
) -> MemplugHostStatus {
    boundary("memplug_host_prefix_is_lost", || {
        require_non_null(out, "out")?;
        let (p, _) = pin::<Arc<SharedPrefix>>(prefix.id)?;
        let lost = p.is_lost();
        drop(p);
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, lost) };
        Ok(())
    })
}

/// Where a mechanism's context is in its life
/// (`memplug_host_mechanism_state`). States only go forward:
/// `ACTIVE` → `RETIRING` → (`LOST`) → `TERMINATED`, or `ACTIVE` → `LOST` →
/// `TERMINATED`. Numbers are never reused; treat one this header does not
/// name as "not active".
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemplugHostLifeState {
    /// Serving: new bindings, allocations, regions and prefixes are made
    /// here.
    Active = 0,
    /// Ending in order (retired by the runtime, or replaced): no new
    /// binding or object; existing objects keep working and are freed as
    /// usual; it terminates once the last is gone.
    Retiring = 1,
    /// The device or context is gone (the plugin reported it, a call
    /// answered `MEMPLUG_HOST_STATUS_DEVICE_LOST`, or the runtime declared
    /// it): the host calls its plugin no more, and every object it made went
    /// with it. New work fails with `MEMPLUG_HOST_STATUS_DEVICE_LOST`.
    Lost = 2,
    /// Over: nothing in flight, every charge of the context settled exactly
    /// once (`MemplugHostSettlement`). Handles that outlive it are inert:
    /// destroying them calls no plugin and refunds nothing.
    Terminated = 3,
}

/// What a context's termination settled, once
/// (`memplug_host_manager_terminate`, `memplug_host_mechanism_settlement`,
/// and the `TERMINATED` lifecycle event): the charges its bindings still
/// held, discharged from their pools by exactly the bytes that were
/// charged — never from a guess, never twice.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemplugHostSettlement {
    /// `sizeof(MemplugHostSettlement)`; set to the bytes written.
    pub struct_size: u32,
    /// 1 when the context was lost (its objects went with the device), 0
    /// when it retired in order.
    pub after_loss: u32,
    /// Bytes discharged from the pools: live charges plus quarantined ones.
    pub bytes: u64,
    /// Of `bytes`, those that were quarantined (releases the plugin had
    /// refused before).
    pub quarantined_bytes: u64,
    /// Leases (charged objects) discharged.
    pub leases: u64,
    /// Bindings whose ledger held anything and was settled.
    pub bindings: u64,
    /// Objects the host still counted alive and forgot (they went with the
    /// device); 0 after an orderly end.
    pub objects_forgotten: u64,
}

/// What one binding of a lost context held when the loss was delivered
/// (an element of `MemplugHostLifecycleEvent::notices`). Everything it made
/// through the context went with the device; its handles
/// (`memplug_host_allocation_is_lost` ...) say so, and destroying them is
/// still the caller's job (it calls no plugin and refunds nothing; the
/// charges are settled when the context terminates).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugHostLossNotice {
    /// `sizeof(MemplugHostLossNotice)` of the library.
    pub struct_size: u32,
    /// The binding's class (`MEMPLUG_HOST_CLASS_*`).
    pub alloc_class: u32,
    /// The holder the binding charges, as `memplug_host_holder_id` gives
    /// it; 0 for a binding made without a holder.
    pub holder_id: u64,
    /// Charged objects (leases) the binding held.
    pub objects: u64,
    /// Their charged bytes.
    pub bytes: u64,
    /// Bytes quarantined by earlier refused releases (settled too).
    pub quarantined_bytes: u64,
    /// The name of the pool the binding charges (unique per manager):
    /// `pool_name_len` bytes of UTF-8, then a NUL. Valid only during the
    /// callback.
    pub pool_name: *const c_char,
    /// Length of `pool_name` in bytes, without the NUL.
    pub pool_name_len: usize,
}

/// One transition of a mechanism's context, given to a
/// `MemplugHostLifecycleFn`. The struct and everything it points to belong
/// to the library and are valid only during the callback: copy what you
/// keep.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugHostLifecycleEvent {
    /// `sizeof(MemplugHostLifecycleEvent)` of the library; read only fields
    /// that fit.
    pub struct_size: u32,
    /// The state before and after the transition.
    pub from: MemplugHostLifeState,
    /// The state entered; `MEMPLUG_HOST_LIFE_STATE_TERMINATED` is the last event
    /// of a context.
    pub to: MemplugHostLifeState,
    /// Padding, always written as 0.
    pub reserved0: u32,
    /// The subscription this call is for.
    pub subscription: MemplugHostSubscription,
    /// `"plugin/mechanism"` of the context: `context_len` bytes, then a
    /// NUL.
    pub context: *const c_char,
    /// Length of `context` in bytes, without the NUL.
    pub context_len: usize,
    /// Why the context left `ACTIVE` (the runtime's reason, the plugin's
    /// sanitised report, or the host's), `reason_len` bytes, then a NUL;
    /// NULL (and 0) when none was given.
    pub reason: *const c_char,
    /// Length of `reason` in bytes, without the NUL; 0 when `reason` is
    /// NULL.
    pub reason_len: usize,
    /// On entering `LOST`: one notice per binding that held something,
    /// `notice_count` of them, `notice_size` bytes apart (step by
    /// `notice_size`, not by your `sizeof`, so that a later library with a
    /// longer notice still works). NULL when `notice_count` is 0.
    pub notices: *const MemplugHostLossNotice,
    /// How many notices `notices` points to.
    pub notice_count: usize,
    /// Distance between two notices, in bytes (at least the 1.0
    /// `sizeof(MemplugHostLossNotice)`).
    pub notice_size: usize,
    /// On entering `TERMINATED`: what was settled; NULL otherwise.
    pub settlement: *const MemplugHostSettlement,
}

/// A mechanism's lifecycle callback (`memplug_host_mechanism_subscribe`):
/// called once per transition of its context, in order for each
/// subscription, with the `userdata` given at subscription.
///
/// Thread: whichever delivers the transition — the thread calling
/// `memplug_host_mechanism_retire`, `_declare_lost`,
/// `memplug_host_manager_replace`, `_terminate` or `_poll`, or the
/// manager's reaper thread; never a plugin's or a driver's thread, and
/// never from inside a plugin call. Two transitions of one context may be
/// delivered on two threads. No host lock is held.
///
/// From inside it, calls that deliver lifecycle events or wait for them are
/// refused with `MEMPLUG_HOST_STATUS_REENTRANT`
/// (`memplug_host_manager_poll`, `_terminate`, `_replace`, `_drain`,
/// `_destroy`, `memplug_host_mechanism_retire`, `_declare_lost`): note what
/// to do and do it after returning. Everything else may be called: freeing
/// the lost objects' handles, making a new binding (which goes to the
/// successor), unsubscribing (this subscription too). It must not unwind
/// (no C++ exception may leave it).
pub type MemplugHostLifecycleFn =
    Option<unsafe extern "C" fn(userdata: *mut c_void, event: *const MemplugHostLifecycleEvent)>;

/// Size of `MemplugHostSettlement` in API 1.0.
pub const MEMPLUG_HOST_SETTLEMENT_SIZE_1_0: u32 = 48;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subscriber::life_state;
    use memplug_host_dep::LifeState;

    #[test]
    fn life_state_names_follow_the_enum() {
        for (s, n) in [
            (MemplugHostLifeState::Active, "ACTIVE"),
            (MemplugHostLifeState::Retiring, "RETIRING"),
            (MemplugHostLifeState::Lost, "LOST"),
            (MemplugHostLifeState::Terminated, "TERMINATED"),
        ] {
            let name = unsafe { std::ffi::CStr::from_ptr(memplug_host_life_state_name(s as u32)) };
            assert_eq!(name.to_str().unwrap(), format!("MEMPLUG_HOST_LIFE_STATE_{n}"));
        }
        let unknown = unsafe { std::ffi::CStr::from_ptr(memplug_host_life_state_name(4)) };
        assert_eq!(unknown.to_str().unwrap(), "MEMPLUG_HOST_LIFE_STATE_UNKNOWN");
        // The host's states map one to one, in order.
        for (i, s) in [LifeState::Active, LifeState::Retiring, LifeState::Lost, LifeState::Terminated]
            .into_iter()
            .enumerate()
        {
            assert_eq!(life_state(s) as usize, i);
        }
    }
}
