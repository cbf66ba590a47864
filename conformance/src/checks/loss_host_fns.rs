//! `loss.host_fns_run_once`: host functions a stream accepted before a
//! device loss still run, exactly once.
//!
//! `enqueue_host_fn` promises "exactly once when this returns OK": a host
//! frees the closure's state, wakes a waiter or settles a deferred free in
//! it, so a function accepted and then dropped because the device went
//! away leaks that state or hangs the host forever. The kit holds a
//! stream of a fresh instance with a gate function, enqueues counting
//! functions behind it (each answered OK), triggers the loss while they
//! wait, opens the gate, and counts: each must run once (not zero times,
//! not twice) within the fence timeout.

use super::fresh::{fresh, pull};
use super::{enqueue_job, fail, skip, Checked, Ctx, Gate, Job};
use crate::raw::{status_name, Mech};
use core::ffi::c_void;
use memplug_sdk::abi::*;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Counting functions enqueued behind the gate.
const QUEUED: usize = 4;

unsafe extern "C" fn count(userdata: *mut c_void) {
    // SAFETY: a leaked counter of the kit's (never freed: a plugin may
    // run it late, or twice).
    unsafe { &*userdata.cast::<AtomicU32>() }.fetch_add(1, Ordering::SeqCst);
}

pub(super) fn host_fns_run_once(ctx: &Ctx, m: &Mech) -> Checked {
    if m.sync.is_none() {
        skip!("no sync capability (flag clear, pointer NULL): no host function to run");
    }
    let f = fresh(ctx)?;
    f.require_1_2()?;
    let (t, trig) = f.trigger()?;
    let fm = f.mech(m.id, m.props)?;
    let (st, s) = fm.stream_create(&f.log);
    super::expect(st, &[MEMPLUG_STATUS_OK], "stream_create before the loss")?;
    let gate = Arc::new(Gate::default());
    let st = enqueue_job(&fm, &f.log, s, Job::Gate(gate.clone()));
    super::expect(st, &[MEMPLUG_STATUS_OK], "enqueue_host_fn of the gate before the loss")?;
    let counters: &'static [AtomicU32] =
        Box::leak((0..QUEUED).map(|_| AtomicU32::new(0)).collect::<Vec<_>>().into_boxed_slice());
    for (i, c) in counters.iter().enumerate() {
        let p = (c as *const AtomicU32).cast_mut().cast::<c_void>();
        let st = fm.enqueue(&f.log, s, Some(count), p);
        if st != MEMPLUG_STATUS_OK {
            gate.open();
            fail!(
                "enqueue_host_fn of function {} behind a held stream, before the loss: got {}",
                i + 1,
                status_name(st)
            );
        }
    }
    let trig_st = pull(t, trig, m.id);
    gate.open();
    if trig_st != MEMPLUG_STATUS_OK {
        return Err(super::fresh::not_enabled(t, trig_st, m.id, &m.name));
    }
    let deadline = Instant::now() + ctx.opts.fence_timeout;
    let ran = |c: &AtomicU32| c.load(Ordering::SeqCst);
    while counters.iter().any(|c| ran(c) == 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    // A second run would come from the same worker, right after.
    std::thread::sleep(Duration::from_millis(50));
    let never: Vec<String> = counters
        .iter()
        .enumerate()
        .filter(|(_, c)| ran(c) == 0)
        .map(|(i, _)| format!("#{}", i + 1))
        .collect();
    let twice: Vec<String> = counters
        .iter()
        .enumerate()
        .filter(|(_, c)| ran(c) > 1)
        .map(|(i, c)| format!("#{} ({} times)", i + 1, ran(c)))
        .collect();
    if !never.is_empty() {
        fail!(
            "{} of {QUEUED} host functions whose enqueue_host_fn answered OK before the loss never ran within {} s \
             of it ({}): OK means exactly once, loss or not (run them, in order, when the wait behind them ends \
             because the device was lost; a host waits on them to free what they hold)",
            never.len(),
            ctx.opts.fence_timeout.as_secs_f64(),
            never.join(", ")
        );
    }
    if !twice.is_empty() {
        fail!("host functions accepted before the loss ran more than once: {}", twice.join(", "));
    }
    Ok(format!(
        "{QUEUED} host functions accepted behind a held stream before {}({}) each ran exactly once after it",
        t.symbol, m.id
    ))
}
