//! `sync.*`: streams, host functions, fences.

use super::{
    bounded, ensure, expect, expect_live, fail, skip, Checked, Ctx, Gate, Job, MechState, Results, Scope,
    Verdict,
};
use crate::raw::{status_name, Mech};
use core::ffi::c_void;
use memplug_sdk::abi::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the sleeping host function of `sync.fence_orders` sleeps.
const SLEEP: Duration = Duration::from_millis(100);
/// The timeout `sync.wait_timeout` asks for.
const SHORT_WAIT: Duration = Duration::from_millis(20);
/// How long the work behind the fence of `sync.wait_forever` takes.
const BRIEF: Duration = Duration::from_millis(50);
/// How long `sync.enqueue_refusal` gives a refused host function to run.
const REFUSED_GRACE: Duration = Duration::from_millis(100);

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
    res.run("sync.fence_after_stream_destroy", name, || {
        absent()?;
        fence_after_stream_destroy(ctx, m)
    });
    res.run("sync.wait_forever", name, || {
        absent()?;
        wait_forever(ctx, m, st)
    });
    res.run("sync.fence_monotonic", name, || {
        absent()?;
        fence_monotonic(ctx, m, st)
    });
    res.run("sync.enqueue_refusal", name, || {
        absent()?;
        enqueue_refusal(ctx, m, st)
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

/// After `stream_destroy` returned OK with a host function of `work`
/// (which sets `ran`) queued: it must have run. If not, waits a while to
/// tell a destroy that returned early (the function runs later) from one
/// that dropped the work (it never runs), and says which.
fn destroy_waited(ran: &AtomicBool, work: Duration) -> Result<(), Verdict> {
    if ran.load(Ordering::SeqCst) {
        return Ok(());
    }
    let returned = Instant::now();
    let patience = work + Duration::from_secs(1);
    while returned.elapsed() < patience {
        if ran.load(Ordering::SeqCst) {
            fail!(
                "stream_destroy returned before the work submitted to the stream had run (the host function \
                 ran {} ms after it returned): destroy must wait for that work",
                returned.elapsed().as_millis()
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    fail!(
        "stream_destroy dropped the work submitted to the stream: a host function enqueue_host_fn accepted \
         (OK, which promises it runs exactly once) had not run {} ms after destroy returned; destroy must run \
         the queued work, then return",
        patience.as_millis()
    )
}

fn streams(ctx: &Ctx, m: &Mech) -> Checked {
    let mut s = Scope::new(ctx, m);
    let live = m.live();
    let h = s.stream_ok()?;
    expect_live(m, live + 1, "with a stream")?;
    let ran = Arc::new(AtomicBool::new(false));
    s.enqueue_ok(h, Job::SleepThenSet(SLEEP, ran.clone()))?;
    expect(s.stream_destroy(h), &[MEMPLUG_STATUS_OK], "stream_destroy with work pending")?;
    destroy_waited(&ran, SLEEP)?;
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
        // NULL is a stream in some APIs (CUDA's legacy default stream);
        // adopted, it must then work like any other.
        let adopted = (|| {
            let (rs, f) = m.fence_record(&ctx.log, h);
            expect(rs, &[MEMPLUG_STATUS_OK], "fence_record on the stream adopted from NULL")?;
            let w = m.fence_wait(&ctx.log, f, 20_000_000_000);
            let _ = m.fence_destroy(&ctx.log, f);
            expect(w, &[MEMPLUG_STATUS_OK], "fence_wait on the stream adopted from NULL")?;
            Ok::<(), Verdict>(())
        })();
        let destroyed = m.stream_destroy(&ctx.log, h);
        adopted?;
        expect(destroyed, &[MEMPLUG_STATUS_OK], "stream_destroy of the stream adopted from NULL")?;
        return Ok(
            "stream_adopt(NULL) adopted a working stream (NULL names a stream in this API, as CUDA's legacy \
                   default stream): a fence recorded on it completed, and it was destroyed"
                .into(),
        );
    }
    Ok(format!("stream_adopt(NULL) refused with {}", status_name(st)))
}

/// `sync.fence_after_stream_destroy`.
fn fence_after_stream_destroy(ctx: &Ctx, m: &Mech) -> Checked {
    let mut s = Scope::new(ctx, m);
    let live = m.live();
    let h = s.stream_ok()?;
    let idle = s.fence_ok(h)?;
    let ran = Arc::new(AtomicBool::new(false));
    s.enqueue_ok(h, Job::SleepThenSet(Duration::from_millis(30), ran.clone()))?;
    let behind = s.fence_ok(h)?;
    expect(s.stream_destroy(h), &[MEMPLUG_STATUS_OK], "stream_destroy with two fences recorded on it")?;
    destroy_waited(&ran, Duration::from_millis(30))?;
    for (what, f) in
        [("the fence recorded on the idle stream", idle), ("the fence recorded behind work", behind)]
    {
        let q = m.fence_query(&ctx.log, f);
        ensure!(
            q != MEMPLUG_STATUS_UNKNOWN_ALLOCATION,
            "fence_query of {what} after stream_destroy: UNKNOWN_ALLOCATION (stream_destroy invalidated a fence \
             recorded on it; fences stay valid until destroyed)"
        );
        expect(q, &[MEMPLUG_STATUS_OK], &format!("fence_query of {what} after stream_destroy"))?;
        let w = wait(ctx, m, f, Duration::ZERO)?;
        expect(w, &[MEMPLUG_STATUS_OK], &format!("fence_wait(0) of {what} after stream_destroy"))?;
    }
    expect_live(m, live + 2, "with the stream destroyed and its two fences alive")?;
    for f in [idle, behind] {
        expect(s.fence_destroy(f), &[MEMPLUG_STATUS_OK], "fence_destroy of a fence whose stream is gone")?;
    }
    expect_live(m, live, "after destroying both fences")?;
    Ok("two fences of a destroyed stream stayed valid, reported complete, and destroyed".into())
}

/// `sync.wait_forever`: the wait runs on a thread of its own and is given
/// up on (failing the check) if it has not returned well after the work
/// finished, so a plugin that really waits forever cannot hang the run.
fn wait_forever(ctx: &Ctx, m: &Mech, st: &mut MechState) -> Checked {
    let mut s = Scope::new(ctx, m);
    let h = s.stream_ok()?;
    let ran = Arc::new(AtomicBool::new(false));
    s.enqueue_ok(h, Job::SleepThenSet(BRIEF, ran.clone()))?;
    let f = s.fence_ok(h)?;
    let pending = !ran.load(Ordering::SeqCst);
    let (mm, log) = (m.clone(), ctx.log.clone());
    let limit = BRIEF + completion_timeout(ctx, st) + Duration::from_secs(2);
    let t = Instant::now();
    let Some(w) = bounded(limit, move || mm.fence_wait(&log, f, u64::MAX)) else {
        st.fences_stuck = true;
        fail!("fence_wait(UINT64_MAX) on a fence behind {BRIEF:?} of work had not returned after {limit:?}");
    };
    let took = t.elapsed();
    ensure!(
        w != MEMPLUG_STATUS_TIMEOUT,
        "fence_wait(UINT64_MAX) returned TIMEOUT after {took:?}: a timeout of UINT64_MAX waits without limit and \
         never times out"
    );
    expect(w, &[MEMPLUG_STATUS_OK], "fence_wait(UINT64_MAX)")?;
    ensure!(
        ran.load(Ordering::SeqCst),
        "fence_wait(UINT64_MAX) returned OK before the work before the fence ran"
    );
    let when = if pending { ", the work still running when the wait began" } else { "" };
    Ok(format!("OK after {took:?} ({BRIEF:?} of work{when})"))
}

/// Polls `fence_query` until it says OK (or `limit` passes).
fn poll_complete(ctx: &Ctx, m: &Mech, f: u64, limit: Duration) -> Result<(), Verdict> {
    let deadline = Instant::now() + limit;
    loop {
        let q = m.fence_query(&ctx.log, f);
        if q == MEMPLUG_STATUS_OK {
            return Ok(());
        }
        expect(q, &[MEMPLUG_STATUS_NOT_READY], "fence_query while the work ran")?;
        ensure!(Instant::now() < deadline, "the fence did not complete within {limit:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Fails unless `n` queries of `f` all say OK.
fn stays_complete(ctx: &Ctx, m: &Mech, f: u64, n: usize, what: &str) -> Result<(), Verdict> {
    for i in 0..n {
        let q = m.fence_query(&ctx.log, f);
        ensure!(
            q == MEMPLUG_STATUS_OK,
            "{what}: query #{} after it had reported complete said {} (a complete fence stays complete until \
             destroyed)",
            i + 1,
            status_name(q)
        );
    }
    Ok(())
}

/// `sync.fence_monotonic`.
fn fence_monotonic(ctx: &Ctx, m: &Mech, st: &mut MechState) -> Checked {
    let mut s = Scope::new(ctx, m);
    let h = s.stream_ok()?;
    let limit = SLEEP + completion_timeout(ctx, st);
    // Completion first seen by fence_query.
    s.enqueue_ok(h, Job::SleepThenSet(Duration::from_millis(20), Arc::new(AtomicBool::new(false))))?;
    let f1 = s.fence_ok(h)?;
    poll_complete(ctx, m, f1, limit)?;
    stays_complete(ctx, m, f1, 50, "a fence seen complete by fence_query")?;
    expect(wait(ctx, m, f1, Duration::ZERO)?, &[MEMPLUG_STATUS_OK], "fence_wait(0) of a complete fence")?;
    // Completion first seen by fence_wait.
    s.enqueue_ok(h, Job::SleepThenSet(Duration::from_millis(20), Arc::new(AtomicBool::new(false))))?;
    let f2 = s.fence_ok(h)?;
    let w = wait(ctx, m, f2, limit)?;
    if w == MEMPLUG_STATUS_TIMEOUT {
        st.fences_stuck = true;
    }
    expect(w, &[MEMPLUG_STATUS_OK], &format!("fence_wait({limit:?})"))?;
    stays_complete(ctx, m, f2, 50, "a fence seen complete by fence_wait")?;
    // Later work on the same stream, blocked, leaves both complete.
    let gate = Arc::new(Gate::default());
    s.enqueue_ok(h, Job::Gate(gate.clone()))?;
    let f3 = s.fence_ok(h)?;
    stays_complete(ctx, m, f1, 10, "the first fence, while later work on its stream is blocked")?;
    stays_complete(ctx, m, f2, 10, "the second fence, while later work on its stream is blocked")?;
    gate.open();
    let w = wait(ctx, m, f3, completion_timeout(ctx, st))?;
    expect(w, &[MEMPLUG_STATUS_OK], "fence_wait on the fence behind the released work")?;
    for (f, what) in [(f1, "the first fence"), (f2, "the second fence"), (f3, "the third fence")] {
        stays_complete(ctx, m, f, 10, what)?;
    }
    Ok("fences seen complete by query and by wait stayed complete through 50 queries each and while later \
        work on their stream was blocked"
        .into())
}

/// Counts its runs; leaked, so a plugin that runs a refused function late
/// (after the check, after the run) still finds it.
unsafe extern "C" fn count_run(userdata: *mut c_void) {
    // SAFETY: `userdata` is a leaked `AtomicUsize` (see `counter`).
    let runs = unsafe { &*userdata.cast::<AtomicUsize>() };
    runs.fetch_add(1, Ordering::SeqCst);
}

fn counter() -> &'static AtomicUsize {
    Box::leak(Box::new(AtomicUsize::new(0)))
}

fn enqueue_count(ctx: &Ctx, m: &Mech, stream: u64, runs: &'static AtomicUsize) -> MemplugStatus {
    let p = (runs as *const AtomicUsize).cast_mut().cast::<c_void>();
    m.enqueue(&ctx.log, stream, Some(count_run), p)
}

/// `sync.enqueue_refusal`.
fn enqueue_refusal(ctx: &Ctx, m: &Mech, st: &mut MechState) -> Checked {
    let mut s = Scope::new(ctx, m);
    let live_stream = s.stream_ok()?;
    let destroyed = {
        let h = s.stream_ok()?;
        expect(s.stream_destroy(h), &[MEMPLUG_STATUS_OK], "stream_destroy")?;
        h
    };
    let probes = [
        ("the handle 0", 0u64),
        ("a handle never made", 0x7ead_beef_0002u64),
        ("a forged handle (high bits flipped)", live_stream ^ 0xffff_0000_0000_0000),
        ("a destroyed stream", destroyed),
    ];
    let mut refused = Vec::new();
    for (what, h) in probes {
        let runs = counter();
        let st = enqueue_count(ctx, m, h, runs);
        ensure!(st != MEMPLUG_STATUS_OK, "enqueue_host_fn on {what} returned OK");
        refused.push((what, runs, st));
    }
    std::thread::sleep(REFUSED_GRACE);
    for (what, runs, st) in &refused {
        let n = runs.load(Ordering::SeqCst);
        ensure!(
            n == 0,
            "enqueue_host_fn on {what} was refused ({}), yet the function ran {n} time(s): a refused host function \
             must never run",
            status_name(*st)
        );
    }
    let runs = counter();
    expect(
        enqueue_count(ctx, m, live_stream, runs),
        &[MEMPLUG_STATUS_OK],
        "enqueue_host_fn on a live stream",
    )?;
    let f = s.fence_ok(live_stream)?;
    let timeout = completion_timeout(ctx, st);
    let w = wait(ctx, m, f, timeout)?;
    if w == MEMPLUG_STATUS_TIMEOUT {
        st.fences_stuck = true;
    }
    expect(w, &[MEMPLUG_STATUS_OK], &format!("fence_wait({timeout:?}) behind the accepted function"))?;
    ensure!(
        runs.load(Ordering::SeqCst) == 1,
        "the accepted function had run {} time(s) when its fence completed",
        runs.load(Ordering::SeqCst)
    );
    std::thread::sleep(REFUSED_GRACE / 2);
    expect(s.stream_destroy(live_stream), &[MEMPLUG_STATUS_OK], "stream_destroy")?;
    let n = runs.load(Ordering::SeqCst);
    ensure!(n == 1, "the accepted function ran {n} times (exactly once is the rule)");
    let codes: Vec<String> = refused.iter().map(|(w, _, st)| format!("{w}: {}", status_name(*st))).collect();
    Ok(format!("refused and never run ({}); the accepted one ran exactly once", codes.join(", ")))
}
