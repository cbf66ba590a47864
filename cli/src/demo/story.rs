//! The story: a 64 MiB pool for cpu:0, its holders and bindings, weights,
//! a shared prefix, requests decoding under pressure, a free behind a
//! fence, an OutOfBudget that rolls back, the device lost mid-decode
//! ([`super::loss`]), teardown, drain and unload; the checks each step
//! makes; and the report at the end.

use super::loss;
use super::measure::{
    self, HostCopies, Kernel, Stranded, PROCESS_METHOD, PROCESS_TOLERANCE, RESIDENT_METHOD,
};
use super::offload;
use super::report::{Counts, Ledger, PluginLine, Report, Scenario};
use super::serving::{
    admit, decode, filled_with, grow, kv_intact, prefix_intact, system_prompt, Tally, Weights,
};
use super::session::{kv_ranges, Session, State, NEEDS};
use super::timeline::{Checks, Recorder};
use super::{
    lock, mib, CAPACITY, CPU0, DECODE_STEPS, EXPERTS, KERNEL_MS, KV_PRIORITY, PINNED, PREFILL, PREFILL_RETRY,
    PREFILL_TOO_BIG, PREFIX, REGION_MAX, REQUESTS, SHARD, STEP, SYSTEM_PROMPT, TOKENS_PER_STEP,
    WEIGHTS_PRIORITY,
};
use crate::locate;
use crate::schema;
use memplug_host::governor::{AllocationClass, GovernorError};
use memplug_host::{BindingError, BindingSpec, GrowError, PluginFence, ProcessMemoryManager, SharedPrefix};
use std::error::Error;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Runs the scenario; returns the report (checks included).
pub(super) fn scenario() -> Result<Report, Box<dyn Error>> {
    let start = Instant::now();
    // Where `locate::load` finds the plugin's library (`None`: it takes the
    // copy linked into this binary); the device loss needs it.
    let library = locate::cpu_plugin_path();
    let plugin = locate::load(None)?;
    let plugin_name = plugin.name().to_string();
    let plugin_label = format!("{} {} ({})", plugin.name(), plugin.version(), plugin.origin());
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(plugin)?;
    let ctx = manager.select(CPU0, NEEDS)?;
    let mechanism = ctx.mechanism().name().to_string();
    let device = ctx.mechanism().device().to_string();
    let granularity = ctx.mechanism().properties().granularity;
    let kernel = Kernel::open(granularity);
    let pool = manager.create_pool("cpu0", CAPACITY)?;
    let rec = Arc::new(Recorder::new(start, pool.clone()));
    rec.scene("setup");
    let mut st = State {
        rec: rec.clone(),
        kernel: &kernel,
        pool: pool.clone(),
        checks: Checks::default(),
        measurements: Vec::new(),
        tally: Tally::default(),
        stranded: Stranded::default(),
        host: HostCopies::default(),
    };

    let session = serve(&manager, &ctx, &mut st)?;
    // ----- 7, 8. offload and restore, copy-on-write (offload.rs) ---------------------
    rec.scene("offload");
    offload::offload_scene(&manager, &ctx, &session, &mut st)?;
    rec.scene("copy_on_write");
    offload::copy_on_write_scene(&manager, &ctx, &session, &mut st)?;
    // ----- 9. the device is lost mid-decode (loss.rs) ------------------------------
    rec.scene("device_loss");
    let (session, loss) = loss::scene(&manager, ctx, session, library.as_deref(), &mut st)?;
    rec.scene("teardown");
    teardown(session, &mut st, loss.regions_admitted());

    // ----- 10. drain, ledger, unload --------------------------------------------
    let drain = manager.drain(Duration::from_secs(2));
    rec.log(
        "drain",
        "queue",
        format!(
            "drained: {} retired, {} quarantined, {} left",
            drain.retired,
            drain.quarantined,
            drain.left.len()
        ),
    );
    st.checks.add(
        "drain complete",
        drain.is_complete(),
        if drain.is_complete() {
            "nothing left in the deferred-free queue".into()
        } else {
            drain.left.join("; ")
        },
    );
    st.measure("after teardown", &[], &[]);

    let snap = pool.snapshot();
    let reports = manager.registry().live_reports();
    let (plugin_live, host_objects) =
        reports.iter().filter(|(n, _)| *n == plugin_name).fold((0, 0), |(p, h), (_, r)| {
            (p + r.plugin_reported, h + r.objects.iter().map(|o| o.2).sum::<u64>())
        });
    let pins = manager.context(&format!("{plugin_name}/{mechanism}")).map_or(0, |c| c.pins());
    let q = manager.queue().stats();
    let unload = manager.unload_plugin(&plugin_name);
    let unloaded = unload.is_ok();
    rec.log(
        "unload",
        "plugin",
        match &unload {
            Ok(()) => format!("{plugin_name} unloaded: nothing it made is alive or queued"),
            Err(e) => format!("unload refused: {e}"),
        },
    );

    let zero_classes = snap.classes.iter().all(|c| c.charged() == 0);
    // The one discharge the pool saw is the lost context's settlement.
    let discharged = pool.discharged();
    let balanced = discharged == loss.settled_bytes();
    st.checks.add(
        "ledger ends at zero",
        snap.used == 0
            && zero_classes
            && q.pending == 0
            && plugin_live == 0
            && host_objects == 0
            && pins == 0
            && balanced,
        format!(
            "pool used {} B, classes {}, queue pending {}, plugin live objects {}, host-counted objects {}, context pins {}; \
             discharged {} B = the lost context's settlement {} B: {balanced}",
            snap.used,
            if zero_classes { "all zero" } else { "NOT zero" },
            q.pending,
            plugin_live,
            host_objects,
            pins,
            discharged,
            loss.settled_bytes()
        ),
    );
    st.checks.add(
        "plugin unloads cleanly",
        unloaded,
        match &unload {
            Ok(()) => "unloaded".into(),
            Err(e) => e.to_string(),
        },
    );
    let loss = loss.finish(&pool, &mut st.checks);
    measure::check(&st.measurements, &mut st.checks);

    let plugin = PluginLine {
        live_objects: plugin_live,
        host_objects,
        context_pins: pins,
        unloaded,
        unload_error: unload.err().map(|e| e.to_string()),
    };
    let ledger = Ledger::collect(&snap, &pool, &q, drain.left, plugin, st.measurements.last(), &st.stranded);
    drop(manager);

    let State { checks, measurements, .. } = st;
    let timeline = rec.timeline();
    let counts = Counts::of(&checks.0);
    Ok(Report {
        schema_version: schema::DEMO,
        scenario: Scenario {
            plugin: plugin_label,
            mechanism,
            device,
            page_size: kernel.page,
            pool_capacity: CAPACITY,
            weight_shard_bytes: SHARD,
            pinned_shards: PINNED.len(),
            expert_shards: EXPERTS,
            prefix_bytes: PREFIX,
            kv_step_bytes: STEP,
            requests: REQUESTS + 1 + loss.resumed.len(),
            resident_method: RESIDENT_METHOD,
            process_method: PROCESS_METHOD,
            process_tolerance: PROCESS_TOLERANCE,
        },
        scenes: rec.scenes(),
        timeline,
        measurements,
        ledger,
        loss,
        checks: checks.0,
        ok: counts.failed == 0,
        counts,
    })
}

/// Steps 1–6, with every memory object scoped here but the weights holder's
/// pinned shards, which the [`Session`] carries on.
fn serve(
    manager: &ProcessMemoryManager,
    ctx: &Arc<memplug_host::Context>,
    st: &mut State<'_>,
) -> Result<Session, Box<dyn Error>> {
    let rec = st.rec.clone();
    let pool = st.pool.clone();

    // ----- 1. pool, holders, bindings ---------------------------------------------
    let weights = Arc::new(Weights { shards: Mutex::default(), rec: rec.clone() });
    let w = weights.clone();
    let weights_reg = pool.register_holder("weights", WEIGHTS_PRIORITY, move |t| w.on_ticket(t));
    let r = rec.clone();
    let kv_reg = pool.register_holder("kv", KV_PRIORITY, move |t| {
        r.log("ticket", "kv", format!("{} → answers 0: live sequences are never dropped", r.ticket_text(t)));
        0
    });
    rec.name_holders([(weights_reg.id(), "weights"), (kv_reg.id(), "kv")]);
    rec.log(
        "setup",
        "pool",
        format!(
            "pool '{}' on {}: hard capacity {}; holders weights (priority {}, evicts LRU experts) and kv \
             (priority {}, refuses)",
            pool.name(),
            ctx.mechanism().device(),
            mib(CAPACITY),
            WEIGHTS_PRIORITY,
            KV_PRIORITY
        ),
    );
    let weights_b =
        manager.bind(ctx, &pool, BindingSpec::new(AllocationClass::Weights).holder(weights_reg.id()))?;
    let kv_b = manager.bind(ctx, &pool, BindingSpec::new(AllocationClass::Kv).holder(kv_reg.id()))?;
    let sched_b = manager.bind(ctx, &pool, BindingSpec::new(AllocationClass::Kv))?;

    // ----- 2. weights ----------------------------------------------------------------
    rec.scene("weights");
    let names = PINNED
        .iter()
        .map(|n| (n.to_string(), true))
        .chain((0..EXPERTS).map(|i| (format!("expert.{i}"), false)));
    weights.load(&weights_b, names, st.kernel.page)?;
    rec.log(
        "load",
        "weights",
        format!(
            "{} pinned + {EXPERTS} expert shards of {} allocated and written ({} resident)",
            PINNED.len(),
            mib(SHARD),
            mib(SHARD * (PINNED.len() + EXPERTS) as u64)
        ),
    );
    st.measure("weights loaded", &weights.ranges(), &[]);

    // ----- 3. prefix and requests -------------------------------------------------------
    rec.scene("requests");
    let prefix: Arc<SharedPrefix> = system_prompt(&kv_b)?;
    rec.log(
        "prefix",
        "kv",
        format!(
            "system prompt KV: one shared object of {} ({:?}...), charged once",
            mib(prefix.len()),
            String::from_utf8_lossy(&SYSTEM_PROMPT[..24])
        ),
    );

    let mut reqs = Vec::new();
    for i in 1..=REQUESTS {
        let r = admit(format!("r{i}"), &kv_b, &prefix, 0xA0 + i as u8, &mut st.tally)?;
        rec.log(
            "admit",
            &r.name,
            format!(
                "region at {:#x} ({} of address space), prefix mapped read-only and read back",
                r.addr,
                mib(REGION_MAX)
            ),
        );
        reqs.push(r);
    }

    // Decode round-robin, 16 tokens per turn, token by token; growth runs
    // into the budget and sends tickets.
    rec.scene("decode");
    for step in 1..=DECODE_STEPS as u64 {
        for (i, r) in reqs.iter_mut().enumerate() {
            let blocks = decode(r, TOKENS_PER_STEP, &weights, i, &mut st.tally)
                .map_err(|e| format!("{} step {step}: {e}", r.name))?;
            rec.log(
                "grow",
                &r.name,
                format!(
                    "step {step}: {} tokens decoded, grew {} block(s) of {} → KV {} at {:#x} (same address)",
                    r.tokens,
                    blocks,
                    mib(STEP),
                    mib(r.region.committed()),
                    r.region.addr()
                ),
            );
        }
    }
    st.measure("peak: 4 requests decoding", &weights.ranges(), &kv_ranges(&reqs, &[]));

    // ----- 5. a free that waits for its fence ---------------------------------------------
    rec.scene("fence");
    let mech = ctx.mechanism().clone();
    let sync = mech.sync().ok_or("the cpu mechanism has no sync capability")?;
    let stream = sync.stream_create()?;
    let mut r1 = reqs.remove(0);
    let (kv_addr, kv_len, kv_byte) = {
        let (a, l) = r1.private_range();
        (a, l, r1.kv_byte)
    };
    let seen = Arc::new(AtomicU8::new(0));
    let s2 = seen.clone();
    sync.enqueue(&stream, move || {
        std::thread::sleep(Duration::from_millis(KERNEL_MS));
        // SAFETY: the region's free waits for the fence recorded after us.
        let intact = unsafe { filled_with(kv_addr, kv_len, kv_byte) };
        s2.store(if intact { 1 } else { 2 }, Ordering::Release);
    })?;
    let fence = PluginFence::record(&mech, &stream)?;
    r1.region.used_by(fence.clone());
    let used_before = pool.used();
    let queued_at = Instant::now();
    let r1_name = r1.name.clone();
    drop(r1);
    let pending_after_drop = manager.queue().pending();
    let early = manager.poll();
    let used_while_pending = pool.used();
    rec.log(
        "release",
        &r1_name,
        format!(
            "finished; region dropped while a host function on the stream still reads its KV → queued \
             behind a fence: queue pending {pending_after_drop}, {} still charged",
            mib(kv_len)
        ),
    );
    rec.log(
        "poll",
        "queue",
        format!(
            "poll before the fence: retired {}, still pending {} (fence complete: {})",
            early.retired,
            early.still_pending,
            fence.query().unwrap_or(false)
        ),
    );
    st.measure("r1 queued behind its fence", &weights.ranges(), &kv_ranges(&reqs, &[(kv_addr, kv_len)]));
    let completed = fence.wait(Duration::from_secs(5)).unwrap_or(false);
    let waited = queued_at.elapsed();
    let host_saw = seen.load(Ordering::Acquire);
    rec.log(
        "fence",
        "stream",
        format!(
            "fence completed after {} ms; the host function read r1's KV intact: {}",
            waited.as_millis(),
            if host_saw == 1 { "yes" } else { "NO" }
        ),
    );
    let late = manager.poll();
    let pending_end = manager.queue().pending();
    let used_after = pool.used();
    rec.log(
        "retired",
        "queue",
        format!(
            "poll after the fence: retired {} → {} decommitted and refunded; queue pending {pending_end}",
            late.retired,
            mib(used_while_pending - used_after)
        ),
    );
    st.checks.add(
        "free waits for the fence",
        pending_after_drop == 1
            && early.retired == 0
            && used_while_pending == used_before
            && completed
            && host_saw == 1
            && late.retired == 1
            && pending_end == 0
            && used_before - used_after == kv_len,
        format!(
            "pending {pending_after_drop} → {pending_end}; charge kept while pending ({}), refunded {} after; \
             host function saw intact KV: {}",
            used_while_pending == used_before,
            mib(used_before.saturating_sub(used_after)),
            host_saw == 1
        ),
    );
    drop(fence);
    sync.stream_destroy(stream).map_err(|e| e.error)?;
    drop(mech);

    // ----- 6. the scheduler's long request: pressure, then OutOfBudget ---------------------
    rec.scene("out_of_budget");
    let mut r5 = admit("r5".into(), &sched_b, &prefix, 0xA5, &mut st.tally)?;
    rec.log(
        "admit",
        "r5",
        format!(
            "long document, admitted by the scheduler (no holder: may ask every holder); region at {:#x}",
            r5.addr
        ),
    );
    grow(&mut r5, PREFILL, true, &mut st.tally).map_err(|e| format!("r5 prefill: {e}"))?;
    rec.log(
        "grow",
        "r5",
        format!(
            "prefill chunk 1: KV {} at {:#x} (same address)",
            mib(r5.region.committed()),
            r5.region.addr()
        ),
    );
    let before = r5.region.view();
    let committed_before = r5.region.committed();
    let tickets_before = pool.snapshot().pressure.tickets;
    let refused = grow(&mut r5, PREFILL_TOO_BIG, true, &mut st.tally);
    let snap = pool.snapshot();
    let oob = match &refused {
        Err(GrowError::Binding(BindingError::Budget(GovernorError::OutOfBudget(o)))) => Some(o.clone()),
        _ => None,
    };
    match &oob {
        Some(o) => rec.log(
            "out_of_budget",
            "r5",
            format!(
                "prefill chunk 2 (+{}) refused after {} ticket(s): OutOfBudget, {} requested, pool used {} of {}",
                mib(PREFILL_TOO_BIG),
                snap.pressure.tickets - tickets_before,
                mib(o.requested),
                mib(o.snapshot.used),
                mib(o.snapshot.capacity)
            ),
        ),
        None => rec.log("out_of_budget", "r5", format!("expected OutOfBudget, got {refused:?}")),
    };
    let rolled_back = r5.region.view() == before
        && r5.region.committed() == committed_before
        && snap.reserved == 0
        && kv_intact(&r5)
        && prefix_intact(&r5);
    rec.log(
        "rollback",
        "r5",
        format!(
            "old view kept: {:#x} + {} (prefix {} + KV {}), nothing left reserved, bytes intact: {rolled_back}",
            r5.region.addr(),
            mib(r5.region.len()),
            mib(PREFIX),
            mib(r5.region.committed())
        ),
    );
    let kv_zero = pool
        .holders()
        .iter()
        .any(|h| &*h.name == "kv" && h.pressure.tickets > 0 && h.pressure.zero_answers == h.pressure.tickets);
    st.checks.add(
        "OutOfBudget fails cleanly",
        oob.is_some() && rolled_back && kv_zero,
        format!(
            "grow refused with OutOfBudget: {}; kv answered 0: {kv_zero}; region and charge as before: {rolled_back}",
            oob.is_some()
        ),
    );
    grow(&mut r5, PREFILL_RETRY, true, &mut st.tally).map_err(|e| format!("r5 retry: {e}"))?;
    rec.log(
        "grow",
        "r5",
        format!(
            "scheduler retries a smaller chunk (+{}): KV {} at {:#x} (same address)",
            mib(PREFILL_RETRY),
            mib(r5.region.committed()),
            r5.region.addr()
        ),
    );
    reqs.push(r5);
    st.measure("after OutOfBudget and retry", &weights.ranges(), &kv_ranges(&reqs, &[]));

    // Pressure as seen by the holders.
    let ws = weights_reg.stats().pressure;
    st.checks.add(
        "pressure evicted cold weights",
        ws.tickets > 0
            && ws.bytes_answered >= ws.bytes_wanted.min(SHARD)
            && lock(&weights.shards).iter().filter(|s| s.pinned).count() == PINNED.len(),
        format!(
            "weights: {} ticket(s), {} wanted, {} released by LRU eviction",
            ws.tickets,
            mib(ws.bytes_wanted),
            mib(ws.bytes_answered)
        ),
    );

    // ----- the first batch ends ----------------------------------------------------------------
    let intact = reqs.iter().filter(|r| kv_intact(r) && prefix_intact(r)).count();
    st.checks.add(
        "KV and prefix bytes intact",
        intact == reqs.len(),
        format!("{intact}/{} live regions read back their KV and the system prompt", reqs.len()),
    );
    for r in reqs.drain(..) {
        let (name, kv) = (r.name.clone(), r.region.committed());
        drop(r);
        rec.log("finish", name, format!("done; region and {} of KV freed at once (no device work)", mib(kv)));
    }
    drop(prefix);
    rec.log("teardown", "kv", "last mapping gone: the shared prefix is freed");
    drop(sched_b);
    let left = lock(&weights.shards).len();
    rec.log(
        "load",
        "weights",
        format!("{left} pinned shard(s) stay loaded for the next batch; every expert was evicted"),
    );
    Ok(Session { weights, weights_reg, kv_reg, weights_b, kv_b })
}

/// The end of the story's memory: the holders unregister, the weights
/// holder frees its shards, the bindings go; then the checks over every
/// grow and every region (`regions`: how many were admitted in all).
fn teardown(session: Session, st: &mut State<'_>, regions: u64) {
    let Session { weights, weights_reg, kv_reg, weights_b, kv_b } = session;
    drop(weights_reg);
    drop(kv_reg);
    let left = lock(&weights.shards).len();
    drop(weights);
    st.rec.log("teardown", "weights", format!("holders unregistered; {left} remaining weight shards freed"));
    drop((weights_b, kv_b));

    let t = &st.tally;
    st.checks.add(
        "stable addresses",
        t.grows > 0 && t.stable == t.grows,
        if t.unstable.is_empty() {
            format!("{}/{} grows kept the region's base address", t.stable, t.grows)
        } else {
            t.unstable.join("; ")
        },
    );
    st.checks.add(
        "prefix read in every region",
        t.admitted == regions && t.prefix_reads == regions && t.prefix_ok == t.prefix_reads,
        format!(
            "{}/{} regions read the system prompt through their read-only mapping",
            t.prefix_ok, t.prefix_reads
        ),
    );
}
