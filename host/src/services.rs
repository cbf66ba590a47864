//! The host services a plugin may call (ABI 1.2, `MemplugHostServices`):
//! today one, `report_device_lost`. One table per load, reachable from the
//! `MemplugHostInfo` the entry receives.
//!
//! The table is never freed (a few dozen bytes per load): a plugin may
//! keep its pointer on a thread of its own, and a report that races the
//! unload — or comes after a load the host refused — must find valid
//! memory that answers `MEMPLUG_STATUS_INVALID_STATE`, not freed memory.
//!
//! A report only flips the mechanism's state and keeps the reason (see
//! `crate::lifecycle`): it never blocks and never runs a runtime's code, so
//! it is safe from inside a slot, from a driver's callback thread, from
//! anywhere.

use crate::mechanism::MechanismInner;
use crate::sink::bounded_message;
use memplug_sdk::abi::*;
use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// One load's services table and what it routes to.
pub(crate) struct ServicesInbox {
    table: MemplugHostServices,
    /// The plugin's mechanisms by id, set once negotiation and validation
    /// succeeded; until then a report is refused as made during
    /// negotiation.
    mechanisms: OnceLock<Vec<(u64, Weak<MechanismInner>)>>,
    /// The agreed minor (services are part of 1.2).
    minor: AtomicU32,
    /// Set before `unload` is called (and for a refused load).
    closed: AtomicBool,
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
    /// A new table for one load, closed until [`publish`](Self::publish).
    pub(crate) fn leak() -> &'static ServicesInbox {
        let inbox: &'static mut ServicesInbox = Box::leak(Box::new(ServicesInbox {
            table: MemplugHostServices {
                struct_size: MEMPLUG_HOST_SERVICES_SIZE_1_2,
                reserved0: 0,
                ctx: core::ptr::null_mut(),
                report_device_lost: Some(report_device_lost),
            },
            mechanisms: OnceLock::new(),
            minor: AtomicU32::new(0),
            closed: AtomicBool::new(false),
            counts: Default::default(),
            last_refusal: Mutex::new(None),
        }));
        inbox.table.ctx = (inbox as *mut ServicesInbox).cast();
        inbox
    }

    /// The table to put in `MemplugHostInfo::services`.
    pub(crate) fn table(&'static self) -> *const MemplugHostServices {
        &self.table
    }

    /// Negotiation and validation succeeded: reports now reach these
    /// mechanisms.
    pub(crate) fn publish(&self, minor: u32, mechanisms: Vec<(u64, Weak<MechanismInner>)>) {
        self.minor.store(minor, Release);
        let _ = self.mechanisms.set(mechanisms);
    }

    /// No report is taken any more (the plugin is about to be unloaded, or
    /// its load was refused).
    pub(crate) fn close(&self) {
        self.closed.store(true, Release);
    }

    pub(crate) fn stats(&self) -> ServiceStats {
        ServiceStats {
            losses: self.counts[LOSSES].load(Relaxed),
            repeats: self.counts[REPEATS].load(Relaxed),
            refused: self.counts[REFUSED].load(Relaxed),
            last_refusal: self.last_refusal.lock().map(|g| g.clone()).unwrap_or(None),
        }
    }

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
        if self.closed.load(Acquire) {
            return self.refuse(
                MEMPLUG_STATUS_INVALID_STATE,
                format!(
                    "loss of mechanism {id} reported after the plugin was unloaded (or its load refused)"
                ),
            );
        }
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
            let n = len.min(MEMPLUG_MESSAGE_MAX as usize);
            bounded_message(core::slice::from_raw_parts(reason.cast::<u8>(), n))
        };
        let moved = m.life.report_lost(format!("the plugin reported the loss: {text}"));
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
    let Some(inbox) = ctx.cast::<ServicesInbox>().cast_const().as_ref() else {
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    };
    catch_unwind(AssertUnwindSafe(|| inbox.report(mechanism_id, reason, reason_len)))
        .unwrap_or(MEMPLUG_STATUS_INTERNAL)
}

/// The weak routes of a plugin's mechanisms, for [`ServicesInbox::publish`].
pub(crate) fn routes<'a>(
    ms: impl Iterator<Item = &'a Arc<MechanismInner>>,
) -> Vec<(u64, Weak<MechanismInner>)> {
    ms.map(|m| (m.id, Arc::downgrade(m))).collect()
}
