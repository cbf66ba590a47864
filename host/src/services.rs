//! The host services a plugin may call (ABI 1.2, `MemplugHostServices`):
//! today one, `report_device_lost`. One table per load, reachable from the
//! `MemplugHostInfo` the entry receives.
//!
//! What a plugin's pointer reaches is split in two. The table itself and a
//! reader count (40 bytes, a "tombstone") are never freed: a plugin may
//! keep a copy of the table on a thread of its own (the SDK's `HostLink`
//! does, and serves two hosts with one copy each), and a stale copy must
//! find valid memory that answers `MEMPLUG_STATUS_INVALID_STATE`, not
//! freed memory. Everything else (the routes to the mechanisms, the
//! counts) is freed when the load closes, after the last report in
//! progress has left.
//!
//! A report only flips the mechanism's state and keeps the reason (see
//! `crate::lifecycle`): it never blocks and never runs a runtime's code, so
//! it is safe from inside a slot, from a driver's callback thread, from
//! anywhere.

use crate::lifecycle::LossReceiver;
use crate::sink::read_message;
use memplug_sdk::abi::*;
use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Mutex, OnceLock, Weak};

/// What outlives every load: the table the plugin was given, and the way
/// to the load's state while it is open.
#[repr(C)]
struct Tombstone {
    table: MemplugHostServices,
    /// The open load's state; NULL once closed.
    state: AtomicPtr<InboxState>,
    /// Reports reading `state` now.
    readers: AtomicU32,
}

/// Tombstones come from slabs of this many, so that loads and unloads do
/// not interleave one small allocation kept for good with the large ones
/// freed (which fragments the heap: a plugin loaded and unloaded a
/// thousand times would cost far more than 40 bytes a time).
const SLAB: usize = 64;

/// Every tombstone slab ever made, and how many of the last are used: kept
/// reachable from this static, so leak checkers see memory kept on purpose.
static TOMBSTONES: Mutex<(Vec<Slab>, usize)> = Mutex::new((Vec::new(), SLAB));

struct Slab(Box<[Tombstone]>);

// SAFETY: a tombstone is immutable once issued but for its atomics; the
// table's pointers are the host's own function and the tombstone itself.
unsafe impl Send for Slab {}

fn blank() -> Tombstone {
    Tombstone {
        table: MemplugHostServices {
            struct_size: MEMPLUG_HOST_SERVICES_SIZE_1_2,
            reserved0: 0,
            ctx: core::ptr::null_mut(),
            report_device_lost: Some(report_device_lost),
        },
        state: AtomicPtr::new(core::ptr::null_mut()),
        readers: AtomicU32::new(0),
    }
}

/// A fresh tombstone (never issued before), its table's `ctx` pointing at
/// itself, its state `state`.
fn issue(state: *mut InboxState) -> &'static Tombstone {
    let mut t = crate::sync::lock_std(&TOMBSTONES);
    if t.1 == SLAB {
        let mut slab: Box<[Tombstone]> = (0..SLAB).map(|_| blank()).collect();
        for stone in slab.iter_mut() {
            stone.table.ctx = (stone as *mut Tombstone).cast();
        }
        t.0.push(Slab(slab));
        t.1 = 0;
    }
    let i = t.1;
    t.1 += 1;
    let slab = &t.0.last().expect("pushed above").0;
    let stone: *const Tombstone = &slab[i];
    // SAFETY: slabs are never freed or moved (a boxed slice in a static
    // list), and each tombstone is issued once.
    let stone: &'static Tombstone = unsafe { &*stone };
    stone.state.store(state, Release);
    stone
}

/// One load's services: the tombstone its table lives in, and the state
/// the host frees at close.
pub(crate) struct ServicesInbox {
    stone: &'static Tombstone,
}

struct InboxState {
    /// The plugin's mechanisms by id, set once negotiation and validation
    /// succeeded; until then a report is refused as made during
    /// negotiation.
    mechanisms: OnceLock<Vec<Route>>,
    /// The agreed minor (services are part of 1.2).
    minor: AtomicU32,
    counts: [AtomicU64; 3],
    /// The last refused report, for diagnostics (kept with `try_lock`).
    last_refusal: Mutex<Option<String>>,
}

/// What a plugin's loss reports came to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceStats {
    /// Reports that moved a mechanism to `Lost`.
    pub losses: u64,
    /// Reports of a loss already recorded (answered `OK`, changing nothing).
    pub repeats: u64,
    /// Reports refused (unknown mechanism, during negotiation, after
    /// unload, below 1.2, bad arguments).
    pub refused: u64,
    /// Why the last refused report was refused.
    pub last_refusal: Option<String>,
}

const LOSSES: usize = 0;
const REPEATS: usize = 1;
const REFUSED: usize = 2;

impl ServicesInbox {
    /// A new table for one load, refusing reports until
    /// [`publish`](Self::publish).
    pub(crate) fn open() -> ServicesInbox {
        let state = Box::into_raw(Box::new(InboxState {
            mechanisms: OnceLock::new(),
            minor: AtomicU32::new(0),
            counts: Default::default(),
            last_refusal: Mutex::new(None),
        }));
        ServicesInbox { stone: issue(state) }
    }

    /// The table to put in `MemplugHostInfo::services`.
    pub(crate) fn table(&self) -> *const MemplugHostServices {
        &self.stone.table
    }

    /// Runs `f` on the open state (`None` once closed), counted as a reader
    /// so that [`close`](Self::close) does not free it underneath.
    fn with_state<R>(stone: &Tombstone, f: impl FnOnce(Option<&InboxState>) -> R) -> R {
        stone.readers.fetch_add(1, SeqCst);
        let p = stone.state.load(SeqCst);
        // SAFETY: `close` frees the state only after swapping the pointer
        // out and seeing no reader; this reader counted itself before
        // loading it.
        let r = f(unsafe { p.as_ref() });
        stone.readers.fetch_sub(1, Release);
        r
    }

    /// Negotiation and validation succeeded: reports now reach these
    /// mechanisms.
    pub(crate) fn publish(&self, minor: u32, mechanisms: Vec<Route>) {
        Self::with_state(self.stone, |s| {
            if let Some(s) = s {
                s.minor.store(minor, Release);
                let _ = s.mechanisms.set(mechanisms);
            }
        });
    }

    /// No report is taken any more (the plugin is about to be unloaded, or
    /// its load was refused); the load's state is freed once no report is
    /// reading it. Idempotent.
    pub(crate) fn close(&self) {
        let p = self.stone.state.swap(core::ptr::null_mut(), SeqCst);
        if p.is_null() {
            return;
        }
        while self.stone.readers.load(SeqCst) != 0 {
            std::thread::yield_now();
        }
        // SAFETY: from `Box::into_raw` in `open`, swapped out exactly once
        // above, and no reader holds it.
        drop(unsafe { Box::from_raw(p) });
    }

    pub(crate) fn stats(&self) -> ServiceStats {
        Self::with_state(self.stone, |s| match s {
            None => ServiceStats::default(),
            Some(s) => ServiceStats {
                losses: s.counts[LOSSES].load(Relaxed),
                repeats: s.counts[REPEATS].load(Relaxed),
                refused: s.counts[REFUSED].load(Relaxed),
                last_refusal: s.last_refusal.lock().map(|g| g.clone()).unwrap_or(None),
            },
        })
    }
}

impl Drop for ServicesInbox {
    fn drop(&mut self) {
        self.close();
    }
}

impl InboxState {
    fn refuse(&self, status: MemplugStatus, why: String) -> MemplugStatus {
        self.counts[REFUSED].fetch_add(1, Relaxed);
        if let Ok(mut g) = self.last_refusal.try_lock() {
            *g = Some(why);
        }
        status
    }

    /// # Safety
    /// `reason` points at `len` readable bytes, or `len` is 0.
    unsafe fn report(&self, id: u64, reason: *const c_char, len: usize) -> MemplugStatus {
        let Some(mechanisms) = self.mechanisms.get() else {
            return self.refuse(
                MEMPLUG_STATUS_INVALID_STATE,
                format!("loss of mechanism {id} reported during negotiation: no mechanism exists yet"),
            );
        };
        let minor = self.minor.load(Acquire);
        if minor < 2 {
            return self.refuse(
                MEMPLUG_STATUS_INVALID_STATE,
                format!("loss of mechanism {id} reported by a plugin that agreed on ABI 1.{minor}; services are 1.2"),
            );
        }
        if reason.is_null() && len != 0 {
            return self.refuse(
                MEMPLUG_STATUS_INVALID_ARGUMENT,
                format!("loss of mechanism {id}: reason is NULL with length {len}"),
            );
        }
        let Some(m) = mechanisms.iter().find(|(mid, _)| *mid == id).and_then(|(_, w)| w.upgrade()) else {
            return self.refuse(
                MEMPLUG_STATUS_WRONG_MECHANISM,
                format!("loss reported for mechanism id {id}, which this plugin did not publish (or which is gone)"),
            );
        };
        let text = if len == 0 {
            "the plugin gave no reason".to_string()
        } else {
            // Read so that a length running past readable memory cuts the
            // reason instead of faulting (crate::sink).
            read_message(reason.cast::<u8>(), len)
        };
        let moved = m.receive_loss(format!("the plugin reported the loss: {text}"));
        self.counts[if moved { LOSSES } else { REPEATS }].fetch_add(1, Relaxed);
        drop(m);
        MEMPLUG_STATUS_OK
    }
}

/// `MemplugHostServices::report_device_lost`. Nothing unwinds into the
/// plugin.
unsafe extern "C" fn report_device_lost(
    ctx: *mut c_void,
    mechanism_id: u64,
    reason: *const c_char,
    reason_len: usize,
) -> MemplugStatus {
    let Some(stone) = ctx.cast::<Tombstone>().cast_const().as_ref() else {
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    };
    catch_unwind(AssertUnwindSafe(|| {
        ServicesInbox::with_state(stone, |s| match s {
            // After unload (or a refused load): nothing to route to.
            None => MEMPLUG_STATUS_INVALID_STATE,
            Some(s) => s.report(mechanism_id, reason, reason_len),
        })
    }))
    .unwrap_or(MEMPLUG_STATUS_INTERNAL)
}

/// Where a report for one mechanism id goes: the mechanism, weakly (a
/// report for one that is gone is refused).
pub(crate) type Route = (u64, Weak<dyn LossReceiver>);
