//! Exhaustive interleavings of the operation gate (loom): termination
//! racing calls in flight. A call that was admitted finishes before the
//! terminator settles; a call that starts after the state left the
//! admitting states is refused and never runs; nothing is settled while a
//! call runs — on one stripe and across two.
//!
//! Built only with `--cfg loom` (see `governor_loom.rs` for the command).
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use loom::thread;
use memplug_host::lifecycle::{Gate, LifeState};
use std::sync::Arc;

/// A call: enter, mark the "plugin" busy, do work, unmark, leave. Returns
/// whether it ran.
fn call(gate: &Gate, stripe: usize, busy: &AtomicU64, settled: &AtomicBool, ran: &AtomicU64) -> bool {
    match gate.enter(stripe) {
        Ok(token) => {
            busy.fetch_add(1, SeqCst);
            assert!(!settled.load(SeqCst), "a call ran inside a settled context");
            ran.fetch_add(1, SeqCst);
            busy.fetch_sub(1, SeqCst);
            drop(token);
            true
        }
        Err(state) => {
            assert!(state >= LifeState::Lost);
            false
        }
    }
}

/// The terminator: lose, wait for the calls in flight, settle.
fn terminate(gate: &Gate, busy: &AtomicU64, settled: &AtomicBool) {
    gate.transition(&[LifeState::Active, LifeState::Retiring], LifeState::Lost).unwrap();
    while gate.in_flight() != 0 {
        thread::yield_now();
    }
    assert_eq!(busy.load(SeqCst), 0, "settling while a call runs");
    settled.store(true, SeqCst);
}

fn model(stripes: [usize; 2]) {
    loom::model(move || {
        let gate = Arc::new(Gate::default());
        let busy = Arc::new(AtomicU64::new(0));
        let settled = Arc::new(AtomicBool::new(false));
        let ran = Arc::new(AtomicU64::new(0));
        let callers: Vec<_> = stripes
            .into_iter()
            .map(|stripe| {
                let (g, b, s, r) = (gate.clone(), busy.clone(), settled.clone(), ran.clone());
                thread::spawn(move || call(&g, stripe, &b, &s, &r))
            })
            .collect();
        terminate(&gate, &busy, &settled);
        let admitted = callers.into_iter().map(|c| c.join().unwrap()).filter(|a| *a).count() as u64;
        assert_eq!(ran.load(SeqCst), admitted);
        // After settlement every call is refused.
        assert!(gate.enter(0).is_err() && gate.enter(1).is_err());
        assert_eq!(gate.in_flight(), 0);
    });
}

#[test]
fn termination_waits_for_calls_on_one_stripe() {
    model([0, 0]);
}

#[test]
fn termination_waits_for_calls_on_two_stripes() {
    model([0, 1]);
}
