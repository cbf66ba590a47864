//! Exhaustive interleavings of the operation gate (loom): termination
//! racing calls in flight. A call that was admitted finishes before the
//! terminator settles; a call that starts after the state left the
//! admitting states is refused and never runs; nothing is settled while a
//! call runs — for callers on seats of their own (counted with a load and
//! a store: each seat has one live thread), for a call nested in another
//! on one seat, and for callers sharing the shared seat (counted with
//! read-modify-writes). The fence pair of `barrier.rs` is `fence(SeqCst)`
//! on both sides here, which loom models exactly; with only the compiler
//! fence on the caller's side loom finds the lost admission.
//!
//! Built only with `--cfg loom` (see `governor_loom.rs` for the command).
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use loom::thread;
use memplug_host::lifecycle::{Gate, LifeState};
use std::sync::Arc;

/// The seat of threads without one of their own.
const SHARED: usize = memplug_host::lifecycle::SHARED_SEAT;

/// A call: enter, mark the "plugin" busy, do work, unmark, leave; with
/// `nested`, the call enters the gate again inside (a binding's token, then
/// the plugin call's). Returns whether it ran.
fn call(
    gate: &Gate,
    seat: usize,
    nested: bool,
    busy: &AtomicU64,
    settled: &AtomicBool,
    ran: &AtomicU64,
) -> bool {
    match gate.enter(seat) {
        Ok(token) => {
            if nested {
                if let Ok(inner) = gate.enter(seat) {
                    assert!(!settled.load(SeqCst), "a nested call ran inside a settled context");
                    drop(inner);
                }
            }
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

/// Every interleaving with up to three preemptions: Dekker's race needs
/// one (a caller preempted between its count's write and its read of
/// "closed"), the nested call one more.
fn model(seats: [usize; 2], nested: bool) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        let gate = Arc::new(Gate::default());
        // Each seat's cell made before the race (a thread's first call
        // makes it; the race is about its later calls).
        for seat in seats {
            drop(gate.enter(seat).unwrap());
        }
        let busy = Arc::new(AtomicU64::new(0));
        let settled = Arc::new(AtomicBool::new(false));
        let ran = Arc::new(AtomicU64::new(0));
        let callers: Vec<_> = seats
            .into_iter()
            .map(|seat| {
                let (g, b, s, r) = (gate.clone(), busy.clone(), settled.clone(), ran.clone());
                thread::spawn(move || call(&g, seat, nested, &b, &s, &r))
            })
            .collect();
        terminate(&gate, &busy, &settled);
        let admitted = callers.into_iter().map(|c| c.join().unwrap()).filter(|a| *a).count() as u64;
        assert_eq!(ran.load(SeqCst), admitted);
        // After settlement every call is refused.
        assert!(gate.enter(0).is_err() && gate.enter(1).is_err() && gate.enter(SHARED).is_err());
        assert_eq!(gate.in_flight(), 0);
    });
}

#[test]
fn termination_waits_for_calls_on_seats_of_their_own() {
    model([0, 1], false);
}

#[test]
fn termination_waits_for_calls_on_the_shared_seat() {
    model([SHARED, SHARED], false);
}

#[test]
fn termination_waits_for_a_call_nested_in_another() {
    model([0, SHARED], true);
}
