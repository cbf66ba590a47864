//! `sync.*`: streams, host functions, fences.

use super::{
    bounded, ensure, expect, expect_live, fail, skip, Checked, Ctx, Gate, Job, MechState, Results, Scope,
    Verdict,
};
use crate::raw::{status_name, Mech};
use memplug_sdk::abi::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the sleeping host function of `sync.fence_orders` sleeps.
const SLEEP: Duration = Duration::from_millis(100);
/// The timeout `sync.wait_timeout` asks for.
const SHORT_WAIT: Duration = Duration::from_millis(20);

pub(crate) fn run_all(res: &mut Results, ctx: &Ctx, m: &Mech, st: &mut MechState) {
    let name = Some(m.name.as_str());
    let absent = || -> Result<(), Verdict> {
        if m.sync.is_none() {
            skip!("no sync capability (flag clear, pointer NULL)");
        }
        Ok(())
    };
    res.run("sync.streams", name, || {
        absent()?;
        streams(ctx, m)
    });
    res.run("sync.in_order", name, || {
        absent()?;
        in_order(ctx, m, st)
    });
    res.run("sync.fence_orders", name, || {
        absent()?;
        fence_orders(ctx, m, st)
    });
    res.run("sync.wait_timeout", name, || {
        absent()?;
        wait_timeout(ctx, m, st)
    });
    res.run("sync.unknown_fence", name, || {
        absent()?;
        unknown_fence(ctx, m)
    });
    res.run("sync.stream_adopt", name, || {
        absent()?;
        stream_adopt(ctx, m)
    });
}

/// How long to wait for a fence whose work has run.
pub(crate) fn completion_timeout(ctx: &Ctx, st: &MechState) -> Duration {
    if st.fences_stuck {
        Duration::from_millis(200)
    } else {
        ctx.opts.fence_timeout
    }
}

/// `fence_wait` on a thread of its own, so one that ignores its timeout
/// fails the check instead of hanging the run.
pub(crate) fn wait(ctx: &Ctx, m: &Mech, fence: u64, timeout: Duration) -> Result<MemplugStatus, Verdict> {
    let (mm, log) = (m.clone(), ctx.log.clone());
    let ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
    let limit = timeout + Duration::from_secs(2);
    match bounded(limit, move || mm.fence_wait(&log, fence, ns)) {
        Some(s) => Ok(s),
        None => fail!("fence_wait with a timeout of {timeout:?} had not returned after {limit:?}"),
    }
}

fn streams(ctx: &Ctx, m: &Mech) -> Checked {
    let mut s = Scope::new(ctx, m);
    let live = m.live();
    let h = s.stream_ok()?;
    expect_live(m, live + 1, "with a stream")?;
    let ran = Arc::new(AtomicBool::new(false));
    s.enqueue_ok(h, Job::SleepThenSet(SLEEP, ran.clone()))?;
    expect(s.stream_destroy(h), &[MEMPLUG_STATUS_OK], "stream_destroy with work pending")?;
    ensure!(
        ran.load(Ordering::SeqCst),
        "stream_destroy returned before the work submitted to the stream had run"
    );
    expect_live(m, live, "after stream_destroy")?;
    expect(m.stream_destroy(&ctx.log, h), &[MEMPLUG_STATUS_UNKNOWN_ALLOCATION], "a second stream_destroy")?;
    let st = super::enqueue_job(
        m,
        &ctx.log,
        h,
        Job::SleepThenSet(Duration::ZERO, Arc::new(AtomicBool::new(false))),
    );
    expect(st, &[MEMPLUG_STATUS_UNKNOWN_ALLOCATION], "enqueue_host_fn on a destroyed stream")?;
    let (st, _) = m.fence_record(&ctx.log, h);
    expect(st, &[MEMPLUG_STATUS_UNKNOWN_ALLOCATION], "fence_record on a destroyed stream")?;
    expect(
        m.stream_destroy(&ctx.log, 0x7ead_beef_0001),
        &[MEMPLUG_STATUS_UNKNOWN_ALLOCATION],
        "stream_destroy of a handle never made",
    )?;
    Ok("destroy waited for pending work; destroyed and forged streams refused".into())
}

fn in_order(ctx: &Ctx, m: &Mech, st: &mut MechState) -> Checked {
    let mut s = Scope::new(ctx, m);
    let h = s.stream_ok()?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    for i in 0..20 {
        s.enqueue_ok(h, Job::Push(seen.clone(), i))?;
    }
    let f = s.fence_ok(h)?;
    let timeout = completion_timeout(ctx, st);
    let w = wait(ctx, m, f, timeout)?;
    if w == MEMPLUG_STATUS_TIMEOUT {
        st.fences_stuck = true;
    }
    expect(w, &[MEMPLUG_STATUS_OK], &format!("fence_wait({timeout:?}) after 20 host functions"))?;
    let got = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    ensure!(got == (0..20).collect::<Vec<u32>>(), "host functions ran in the order {got:?}");
    Ok("20 host functions ran in order before their fence completed".into())
}

fn fence_orders(ctx: &Ctx, m: &Mech, st: &mut MechState) -> Checked {
    let mut s = Scope::new(ctx, m);
    let h = s.stream_ok()?;
    let ran = Arc::new(AtomicBool::new(false));
    s.enqueue_ok(h, Job::SleepThenSet(SLEEP, ran.clone()))?;
    let f = s.fence_ok(h)?;
    let q = m.fence_query(&ctx.log, f);
    let done_then = ran.load(Ordering::SeqCst);
    if !done_then {
        ensure!(
            q != MEMPLUG_STATUS_OK,
            "fence_query said OK while the host function before the fence was still sleeping"
        );
        expect(q, &[MEMPLUG_STATUS_NOT_READY], "fence_query before the work ran")?;
    }
    let timeout = SLEEP + completion_timeout(ctx, st);
    let w = wait(ctx, m, f, timeout)?;
    if w == MEMPLUG_STATUS_TIMEOUT {
        st.fences_stuck = true;
        fail!("the fence did not complete within {timeout:?} although its work takes {SLEEP:?}");
    }
    let done = ran.load(Ordering::SeqCst);
    expect(w, &[MEMPLUG_STATUS_OK], "fence_wait")?;
    ensure!(done, "fence_wait said OK before the host function before the fence had run");
    expect(m.fence_query(&ctx.log, f), &[MEMPLUG_STATUS_OK], "fence_query after completion")?;
    Ok("NOT_READY while the work slept, OK once it had run".into())
}

fn wait_timeout(ctx: &Ctx, m: &Mech, st: &mut MechState) -> Checked {
    let mut s = Scope::new(ctx, m);
    let h = s.stream_ok()?;
    let gate = Arc::new(Gate::default());
    s.enqueue_ok(h, Job::Gate(gate.clone()))?;
    let f = s.fence_ok(h)?;
    let t = Instant::now();
    let w = wait(ctx, m, f, SHORT_WAIT)?;
    let took = t.elapsed();
    ensure!(w != MEMPLUG_STATUS_OK, "fence_wait said OK while the work before the fence was blocked");
    expect(w, &[MEMPLUG_STATUS_TIMEOUT], &format!("fence_wait({SHORT_WAIT:?}) on blocked work"))?;
    ensure!(took >= SHORT_WAIT * 3 / 4, "fence_wait({SHORT_WAIT:?}) returned TIMEOUT after only {took:?}");
    expect(m.fence_query(&ctx.log, f), &[MEMPLUG_STATUS_NOT_READY], "fence_query on blocked work")?;
    gate.open();
    let timeout = completion_timeout(ctx, st);
    let w = wait(ctx, m, f, timeout)?;
    if w == MEMPLUG_STATUS_TIMEOUT {
        st.fences_stuck = true;
    }
    expect(w, &[MEMPLUG_STATUS_OK], &format!("fence_wait({timeout:?}) once the work could run"))?;
    ensure!(gate.passed.load(Ordering::SeqCst), "the fence completed before its work ran");
    Ok(format!("TIMEOUT after {took:?} for a {SHORT_WAIT:?} wait, OK once the work ran"))
}

fn unknown_fence(ctx: &Ctx, m: &Mech) -> Checked {
    let mut s = Scope::new(ctx, m);
    let h = s.stream_ok()?;
    let f = s.fence_ok(h)?;
    let unknown = [MEMPLUG_STATUS_UNKNOWN_ALLOCATION];
    for (what, bogus) in [
        ("a fence never recorded", 0x7ead_beef_0001u64),
        ("a forged fence (high bits flipped)", f ^ 0xffff_0000_0000_0000),
    ] {
        let q = m.fence_query(&ctx.log, bogus);
        ensure!(q != MEMPLUG_STATUS_OK, "fence_query said OK (complete) for {what}: a forged completion");
        expect(q, &unknown, &format!("fence_query of {what}"))?;
        expect(m.fence_wait(&ctx.log, bogus, 0), &unknown, &format!("fence_wait of {what}"))?;
        expect(m.fence_destroy(&ctx.log, bogus), &unknown, &format!("fence_destroy of {what}"))?;
    }
    expect(s.fence_destroy(f), &[MEMPLUG_STATUS_OK], "fence_destroy")?;
    let q = m.fence_query(&ctx.log, f);
    expect(q, &unknown, "fence_query of a destroyed fence")?;
    expect(m.fence_destroy(&ctx.log, f), &unknown, "a second fence_destroy")?;
    Ok("never-recorded, forged and destroyed fences refused".into())
}

fn stream_adopt(ctx: &Ctx, m: &Mech) -> Checked {
    let Some((st, h)) = m.stream_adopt(&ctx.log, core::ptr::null_mut()) else {
        skip!("stream_adopt is NULL: the plugin adopts no native streams (an explicit absence)");
    };
    if st == MEMPLUG_STATUS_OK {
        m.stream_destroy(&ctx.log, h);
        fail!("stream_adopt(NULL) returned OK");
    }
    Ok(format!("stream_adopt(NULL) refused with {}", status_name(st)))
}
