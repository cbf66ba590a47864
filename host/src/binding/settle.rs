//! The two steps every binding path is made of, written once.
//!
//! * [`commit_or_undo`]: grant → make → commit the charge with the bytes
//!   actually obtained; a rejected commit undoes the make.
//! * [`release_or_quarantine`]: give an object back to its mechanism, then
//!   refund its charge — or, when the plugin refuses, keep the charge as
//!   quarantined and record why (invariant 7) — or, when the context is
//!   lost, leave the charge to the termination that settles the context.
//!
//! Both run under a token of the context's operation gate and record every
//! charge they make or end in the binding's ledger (`crate::lifecycle`).

use super::{BindingError, BindingInner};
use crate::deferred::RetireOutcome;
use crate::error::{CallError, LostCheck, ReleaseError};
use crate::governor::{Lease, Rejected};
use crate::lifecycle::Token;
use crate::sync::{lock, Mutex};
use crate::tokens::{Allocation, PhysicalObject};
use std::fmt;

/// The charge a release settles.
pub(super) enum Charge<'a> {
    /// A whole lease, ended by the release: refunded when it succeeds,
    /// quarantined when it fails. `None` when nothing is charged (a
    /// rollback, a temporary object, a region that never grew).
    Whole(Option<Lease>),
    /// `bytes` of the lease in `slot`, which keeps the rest (a decommitted
    /// tail). The slot is locked only after the release ran, so no lock is
    /// held across the plugin call; an empty slot settles nothing.
    Part { slot: &'a Mutex<Option<Lease>>, bytes: u64 },
}

/// Runs `release` (the plugin call that gives an object back; it gets the
/// token this holds, so its own calls need none), then settles
/// `charge`: on success it is refunded; on failure it stays charged, as
/// quarantined, and `describe(&error, reason)` is recorded in the binding's
/// quarantine list, `reason` being the plugin's explanation. A token the
/// failure hands back is dropped: tokens are plain data, so the object
/// stays alive in the plugin and its address is never reissued.
///
/// Every retire path, and every rollback, ends its objects here. The
/// success path is inlined into the caller, so the plugin's result is
/// matched where it is made and a failure (a large value: the object and
/// the plugin's message) is built only on the cold path.
#[inline(always)]
pub(super) fn release_or_quarantine<E: fmt::Display + LostCheck>(
    binding: &BindingInner,
    charge: Charge<'_>,
    release: impl FnOnce(&Token<'_>) -> Result<(), E>,
    describe: impl FnOnce(&E, &str) -> String,
) -> RetireOutcome {
    // The whole settlement holds a gate token: termination waits for it,
    // and once the gate refuses, the ledger no longer moves (lifecycle).
    let (token, stripe) = match binding.admit() {
        Ok(t) => t,
        Err(_) => return lost(charge),
    };
    let outcome = match release(&token) {
        Ok(()) => refund(binding, charge, stripe),
        Err(e) if e.is_device_lost() => lost(charge),
        Err(e) => quarantine(binding, charge, e, describe, stripe),
    };
    drop(token);
    outcome
}

/// The released object's charge goes back to the pool.
#[inline(always)]
pub(super) fn refund(binding: &BindingInner, charge: Charge<'_>, stripe: usize) -> RetireOutcome {
    let pool = &binding.pool;
    match charge {
        Charge::Whole(lease) => {
            let bytes = lease.as_ref().map_or(0, Lease::bytes);
            if let Some(l) = lease {
                let _ = pool.release(l);
                binding.ledger.refunded(stripe, bytes, 1);
            }
            RetireOutcome::Freed { bytes }
        }
        Charge::Part { slot, bytes } => {
            let mut slot = lock(slot);
            let Some(lease) = slot.as_mut() else {
                return RetireOutcome::Freed { bytes: 0 };
            };
            if pool.release_part(lease, bytes).is_ok() {
                binding.ledger.refunded(stripe, bytes, 0);
            }
            RetireOutcome::Freed { bytes }
        }
    }
}

/// The context is lost: the object went with its device, so nothing is
/// refunded or quarantined here. Its charge stays in the binding's ledger,
/// which the context's termination settles in one step; the lease token
/// ends without touching the pool. (A part of a region's lease stays in
/// the region's lease, which ends the same way when the region does.)
#[cold]
#[inline(never)]
fn lost(charge: Charge<'_>) -> RetireOutcome {
    match charge {
        Charge::Whole(lease) => {
            let bytes = lease.as_ref().map_or(0, Lease::bytes);
            if let Some(l) = lease {
                l.settled_elsewhere();
            }
            RetireOutcome::Lost { bytes }
        }
        Charge::Part { bytes, .. } => RetireOutcome::Lost { bytes },
    }
}

/// The plugin refused the release: the charge stays, as quarantined, with
/// the reason recorded (invariant 7).
#[cold]
#[inline(never)]
fn quarantine<E: fmt::Display>(
    binding: &BindingInner,
    charge: Charge<'_>,
    e: E,
    describe: impl FnOnce(&E, &str) -> String,
    stripe: usize,
) -> RetireOutcome {
    let (bytes, lease) = match charge {
        Charge::Whole(lease) => (lease.as_ref().map_or(0, Lease::bytes), lease),
        Charge::Part { slot, bytes } => {
            let mut slot = lock(slot);
            let Some(lease) = slot.as_mut() else {
                return RetireOutcome::Freed { bytes: 0 };
            };
            if binding.pool.quarantine_part(lease, bytes).is_ok() {
                binding.ledger.quarantined(stripe, bytes, 0);
            }
            (bytes, None)
        }
    };
    let reason = e.to_string();
    let what = describe(&e, &reason);
    drop(e);
    binding.quarantine(what, lease, stripe);
    RetireOutcome::Quarantined { bytes, reason }
}

/// A token a make step returns: what its commit charges, and how a
/// quarantine names it.
pub(super) trait Made: fmt::Debug {
    /// The kind, as quarantine reports name it.
    const KIND: &'static str;
    /// Bytes the plugin actually provided.
    fn bytes(&self) -> u64;
    fn id(&self) -> u64;
}

// Both tokens name their kind and carry their size and id.
macro_rules! made {
    ($($token:ty => $kind:literal),*) => {$(
        impl Made for $token {
            const KIND: &'static str = $kind;
            fn bytes(&self) -> u64 {
                self.size()
            }
            fn id(&self) -> u64 {
                self.object_id()
            }
        }
    )*};
}
made!(Allocation => "allocation", PhysicalObject => "physical object");

/// Grants `bytes`, runs `make`, and commits the charge with the bytes the
/// object actually has. When the object came out larger than granted and
/// the pool has no room for the difference, the commit is rejected: the
/// grant is returned, the object given back through `undo` (quarantined,
/// uncharged, if the plugin refuses), and the governor's refusal returned.
/// A failed grant or make returns its error with nothing left behind.
#[inline]
pub(super) fn commit_or_undo<T: Made>(
    binding: &BindingInner,
    bytes: u64,
    make: impl FnOnce(&Token<'_>) -> Result<T, CallError>,
    undo: impl FnOnce(T) -> Result<(), ReleaseError<T>>,
) -> Result<(T, Lease), BindingError> {
    let grant = binding.grant(bytes)?;
    // After the grant (a wait for pressure holds no token), before the
    // make: the object and its ledger entry are made under one token.
    let (token, stripe) = binding.admit_new()?;
    let made = make(&token)?;
    match grant.commit(made.bytes()) {
        Ok(lease) => {
            binding.ledger.charged(stripe, lease.bytes(), 1);
            drop(token);
            Ok((made, lease))
        }
        Err(Rejected { value: grant, error }) => {
            drop(grant);
            drop(token);
            let _ = release_or_quarantine(
                binding,
                Charge::Whole(None),
                |_| undo(made),
                |e, _| format!("{} {} (rollback)", T::KIND, e.object.id()),
            );
            Err(error.into())
        }
    }
}
