//! Scene `device_loss` (step 9): the device is lost mid-decode. A new batch (`r6`, `r7`) decodes
//! on the story's context, next to the pinned weights; between two decode
//! steps the context is lost. Its holders are told (each gets the
//! `Lost` [`LifecycleEvent`], whose [`LossNotice`]s name every binding that
//! held something: pool, holder, class, objects, bytes); the next grow is
//! refused; the manager's `poll` terminates the context, settling every
//! binding's charge from its ledger exactly once; the lost handles, dropped
//! afterwards, call no plugin and refund nothing; and the requests continue
//! on a replacement, their KV recomputed (re-prefilled) from their tokens.
//!
//! How the device is lost. The CPU plugin's memory cannot fail, so:
//!
//! * by default the runtime declares the context lost
//!   ([`Context::declare_lost`], the runtime's own loss path: it needs
//!   nothing from the plugin), as a runtime that saw a kernel fault would;
//! * with `MEMPLUG_CPU_TEST_SWITCHES=1` in the environment (the CPU plugin
//!   reads it when its instance is built; it is off by default), the plugin
//!   reports the loss itself: the demo opens the plugin's library again
//!   through the host's loading policy (the loader hands back the object it
//!   already loaded, so the same plugin instance) and calls its test-only
//!   switch `memplug_cpu_test_report_loss`, which reports the mechanism lost
//!   through the plugin's `HostLink` and the host's services, as a device
//!   plugin reports a dead device. If the switch is missing or refuses, the
//!   runtime declares the loss instead, and the timeline says why.
//!
//! The replacement. A registry holds one plugin per name and every copy of
//! the CPU plugin is named `memplug-cpu`, so no replacement can be
//! registered while the lost plugin is, and `ProcessMemoryManager::replace`
//! (which needs both registered, and routes new bindings of the old context
//! to the new one) is not used. Instead, once the lost context has
//! terminated, its plugin is unregistered (its library stays mapped: the
//! lost instance still holds what the host will never free), the copy of
//! the CPU plugin linked into `memplug` — a separate instance, with its own
//! state — is registered, and `select` picks it; `bind` on the lost context
//! is refused. Without the plugin's library there is only the linked copy,
//! no second instance, and the scene is skipped (and says so).
//!
//! What the lost context held stays resident: the host never calls a lost
//! mechanism again, and a CPU "device" keeps its pages. The measurements
//! count them as [`Stranded`] from the settlement on.

use super::loss_report::{BindingLine, Delivery, LossReport, Resumed};
use super::measure::Stranded;
use super::serving::{admit, decode, grow, kv_intact, prefix_intact, system_prompt, Request};
use super::session::{kv_ranges, Session, State, NEEDS};
use super::timeline::{Checks, Recorder};
use super::{lock, mib, CPU0, DECODE_STEPS, KV_PER_TOKEN, PINNED, TOKENS_PER_STEP};
use crate::locate;
use memplug_host::governor::{AllocationClass, HolderId, Pool};
use memplug_host::{
    BindingSpec, Context, LifeState, LifecycleEvent, LoadOptions, LossNotice, ManagerError, Plugin,
    ProcessMemoryManager, Settlement, Status, TerminateError,
};
use std::error::Error;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The environment variable that turns the CPU plugin's test switches on.
const SWITCHES_ENV: &str = "MEMPLUG_CPU_TEST_SWITCHES";
/// The CPU plugin's test-only loss switch:
/// `MemplugStatus memplug_cpu_test_report_loss(uint64_t mechanism_id)`.
const SWITCH: &str = "memplug_cpu_test_report_loss";
type SwitchFn = unsafe extern "C" fn(u64) -> u32;
/// What the runtime says when it declares the loss.
const RUNTIME_REASON: &str = "a decode kernel faulted on cpu:0 (simulated: the CPU plugin cannot fail)";

/// The new batch: name and KV byte of each request, and the decode steps
/// each has done when the device goes (r6 is one step ahead of r7).
const BATCH: [(&str, u8, u64); 2] = [("r6", 0xA6, 3), ("r7", 0xA7, 2)];

/// A transition as one holder heard it.
struct Heard {
    holder: &'static str,
    event: LifecycleEvent,
}

/// The scene's outcome, completed by [`Loss::finish`] at the end of the
/// demo (the final check needs the final pool and every delivery).
pub(super) struct Loss {
    report: LossReport,
    /// Kept to the end: its settlement must not change.
    context: Option<Arc<Context>>,
    settlement: Option<Settlement>,
    heard: Arc<Mutex<Vec<Heard>>>,
    /// Regions admitted by the scene (on both contexts).
    regions: u64,
}

impl Loss {
    /// Regions admitted in the whole story, this scene's included.
    pub(super) fn regions_admitted(&self) -> u64 {
        (super::REQUESTS + 1) as u64 + self.regions
    }

    /// Bytes the lost context's termination discharged (0 when skipped).
    pub(super) fn settled_bytes(&self) -> u64 {
        self.settlement.as_ref().map_or(0, |s| s.bytes)
    }

    /// The final check, "lost context settled exactly once", with the
    /// pool at the end of the demo; returns the scene's report.
    pub(super) fn finish(mut self, pool: &Pool, checks: &mut Checks) -> LossReport {
        const NAME: &str = "lost context settled exactly once";
        let r = &mut self.report;
        if let Some(why) = &r.skipped {
            checks.skip(NAME, why);
            return self.report;
        }
        r.discharged_at_end = pool.discharged();
        let heard = lock(&self.heard);
        r.deliveries = ["weights", "kv"]
            .into_iter()
            .map(|holder| {
                let mine: Vec<&LifecycleEvent> =
                    heard.iter().filter(|h| h.holder == holder).map(|h| &h.event).collect();
                Delivery {
                    holder,
                    transitions: mine.iter().map(|e| format!("{} → {}", e.from, e.to)).collect(),
                    lost: mine.iter().filter(|e| e.to == LifeState::Lost).count() as u64,
                    terminated: mine.iter().filter(|e| e.to == LifeState::Terminated).count() as u64,
                }
            })
            .collect();
        drop(heard);
        let s = self.settlement.as_ref();
        let ctx = self.context.as_ref();
        let bytes = r.settled_bytes;
        let sum = |v: &[BindingLine]| v.iter().map(|b| b.bytes + b.quarantined_bytes).sum::<u64>();
        let once = r.deliveries.iter().all(|d| d.lost == 1 && d.terminated == 1 && d.transitions.len() == 2);
        let unchanged =
            ctx.is_some_and(|c| c.state() == LifeState::Terminated && c.settlement().as_ref() == s);
        let ok = s.is_some_and(|s| s.after_loss)
            && bytes > 0
            && r.notices == r.settled
            && sum(&r.notices) == bytes
            && r.used_before - r.used_after == bytes
            && r.discharged_by_settlement == bytes
            && r.discharged_at_end == bytes
            && once
            && unchanged
            && r.terminate_again.contains("already terminated")
            && r.inert_drop;
        checks.add(
            NAME,
            ok,
            format!(
                "notices = settlement per binding: {}; pool used {} → {} (−{}), discharged +{} at termination and {} \
                 at the end; Terminated delivered once to each holder: {once}; settlement unchanged since: {unchanged}; \
                 terminate again: {}; dropping the lost handles changed nothing: {}",
                r.notices == r.settled,
                mib(r.used_before),
                mib(r.used_after),
                mib(r.used_before.saturating_sub(r.used_after)),
                mib(r.discharged_by_settlement),
                mib(r.discharged_at_end),
                if r.terminate_again.contains("already terminated") { "refused" } else { &r.terminate_again },
                r.inert_drop
            ),
        );
        self.report
    }
}

/// One binding's line: `pool`, `holder` and `class` name it; `o` objects
/// hold `b` bytes, and `q` more are quarantined.
fn line(
    rec: &Recorder,
    pool: &str,
    holder: Option<HolderId>,
    class: AllocationClass,
    o: u64,
    b: u64,
    q: u64,
) -> BindingLine {
    BindingLine {
        pool: pool.into(),
        holder: rec.holder_name(holder),
        class: class.name(),
        objects: o,
        bytes: b,
        quarantined_bytes: q,
    }
}

/// What holder `name` (`id`) does with a transition of the context: keeps
/// it, and says what it learnt on the timeline.
fn tell(rec: &Recorder, heard: &Mutex<Vec<Heard>>, id: HolderId, name: &'static str, e: &LifecycleEvent) {
    lock(heard).push(Heard { holder: name, event: e.clone() });
    let (kind, detail) = match e.to {
        LifeState::Lost => {
            let mine: Vec<&LossNotice> = e.notices.iter().filter(|n| n.holder == Some(id)).collect();
            let held = if mine.is_empty() {
                "nothing of mine was on it".to_string()
            } else {
                let each: Vec<String> = mine
                    .iter()
                    .map(|n| {
                        format!(
                            "my {} binding in pool '{}' held {} object(s), {}{}",
                            n.class,
                            n.pool,
                            n.objects,
                            mib(n.bytes),
                            if n.quarantined_bytes == 0 {
                                String::new()
                            } else {
                                format!(" (+{} quarantined)", mib(n.quarantined_bytes))
                            }
                        )
                    })
                    .collect();
                format!("{}, gone with the device: my handles are inert", each.join("; "))
            };
            ("told", format!("{} {} → lost: {held}", e.context, e.from))
        }
        LifeState::Terminated => {
            let mine: u64 = e
                .settlement
                .iter()
                .flat_map(|s| s.bindings.iter())
                .filter(|b| b.holder == Some(id))
                .map(|b| b.bytes + b.quarantined_bytes)
                .sum();
            (
                "settled",
                format!(
                    "{} {} → terminated: {} of mine settled from my ledger",
                    e.context,
                    e.from,
                    mib(mine)
                ),
            )
        }
        to => ("told", format!("{} {} → {to}", e.context, e.from)),
    };
    rec.log(kind, name, detail);
}

/// Loses `ctx` mid-decode (`when` says where the batch is), and says so on
/// the timeline before any holder hears of it: through the plugin's test
/// switch when the switches are on, else (or when the switch cannot)
/// declared by the runtime, whose `declare_lost` tells the holders at once.
/// Returns the path taken and what was done, in words.
fn lose(ctx: &Context, library: &Path, rec: &Recorder, when: &str) -> (&'static str, String) {
    let declare = |how: String| {
        rec.log("lost", ctx.label(), format!("{when}: {how}; reason: {RUNTIME_REASON}"));
        ctx.declare_lost(RUNTIME_REASON);
        ("runtime", how)
    };
    if std::env::var_os(SWITCHES_ENV).is_none_or(|v| v != "1") {
        return declare(format!(
            "declared lost by the runtime (Context::declare_lost: needs nothing from the plugin; {SWITCHES_ENV}=1 \
             makes the CPU plugin report it instead)"
        ));
    }
    match report_through_switch(library, ctx.mechanism().id()) {
        Ok(()) if ctx.state() == LifeState::Lost => {
            let how = format!(
                "reported by the plugin: its test switch {SWITCH} ({SWITCHES_ENV}=1) reported the mechanism lost \
                 through its HostLink and the host's services; the holders hear of it at the next poll, never from \
                 the reporting thread"
            );
            let reason = ctx.reason().unwrap_or_default();
            rec.log("lost", ctx.label(), format!("{when}: {how}; reason: {reason}"));
            ("plugin", how)
        }
        Ok(()) => declare(format!(
            "the test switch answered OK but the context stayed {}; declared lost by the runtime instead",
            ctx.state()
        )),
        Err(why) => declare(format!("test switch unavailable ({why}); declared lost by the runtime instead")),
    }
}

/// Calls the CPU plugin's test switch in `library`, the library the host
/// loaded: opened again through the loading policy, the loader returns the
/// object it already has, so the switch is that instance's.
fn report_through_switch(library: &Path, mechanism_id: u64) -> Result<(), String> {
    let checked =
        memplug_host::policy::open_checked(library, &LoadOptions::default()).map_err(|e| e.to_string())?;
    // SAFETY: the plugin library the host already loaded (its initialisers
    // ran then; the loader hands back the same object).
    let lib = unsafe { checked.dlopen() }.map_err(|e| e.to_string())?;
    // SAFETY: the switch's documented C signature.
    let f: SwitchFn = *unsafe { lib.library().get::<SwitchFn>(SWITCH.as_bytes()) }
        .map_err(|e| format!("{SWITCH} is not exported: {e}"))?;
    // SAFETY: a plain C function of the loaded library, which `lib` keeps
    // loaded across the call.
    let raw = unsafe { f(mechanism_id) };
    match Status::from_raw(raw) {
        Some(Status::Ok) => Ok(()),
        s => Err(format!("{SWITCH} answered {}", s.map_or_else(|| raw.to_string(), |s| s.c_name().into()))),
    }
}

/// The scene (see the module documentation). Takes the story's context and
/// session; returns the session on the replacement (holders, weights
/// reloaded, new bindings) and the scene's outcome.
pub(super) fn scene(
    manager: &ProcessMemoryManager,
    ctx: Arc<Context>,
    mut s: Session,
    library: Option<&Path>,
    st: &mut State<'_>,
) -> Result<(Session, Loss), Box<dyn Error>> {
    let rec = st.rec.clone();
    let pool = st.pool.clone();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let mut loss = Loss { report: LossReport::default(), context: None, settlement: None, heard, regions: 0 };
    let Some(library) = library else {
        let why =
            "no second instance of the CPU plugin: its library was not found, only the copy linked into \
                   memplug is loaded, and a registry holds one plugin per name";
        rec.log("lost", "scene", format!("the device-loss scene is skipped: {why}"));
        st.checks.skip("requests continue on the replacement", why);
        loss.report.skipped = Some(why.into());
        return Ok((s, loss));
    };
    let label = ctx.label().to_string();
    let (weights_id, kv_id) = (s.weights_reg.id(), s.kv_reg.id());
    for (id, name) in [(weights_id, "weights"), (kv_id, "kv")] {
        let (rec, heard) = (rec.clone(), loss.heard.clone());
        ctx.subscribe(move |e| tell(&rec, &heard, id, name, e));
    }

    // ----- a new batch decodes on the story's context ------------------------------------
    let prefix = system_prompt(&s.kv_b)?;
    rec.log(
        "prefix",
        "kv",
        format!(
            "next batch: system prompt KV again ({}); weights and kv subscribed to {label}'s lifecycle",
            mib(prefix.len())
        ),
    );
    let mut reqs = Vec::new();
    for (name, byte, _) in BATCH {
        let r = admit(name.into(), &s.kv_b, &prefix, byte, &mut st.tally)?;
        rec.log("admit", name, format!("region at {:#x}, prefix mapped read-only and read back", r.addr));
        reqs.push(r);
    }
    loss.regions += BATCH.len() as u64;
    // Decodes request i's steps from[i]..=to[i], round-robin.
    let steps = |reqs: &mut [Request], from: &[u64], to: &[u64], st: &mut State<'_>, on: &str| {
        for step in 1..=to.iter().copied().max().unwrap_or(0) {
            for (i, r) in reqs.iter_mut().enumerate() {
                if step < from[i] || step > to[i] {
                    continue;
                }
                let blocks = decode(r, TOKENS_PER_STEP, &s.weights, i, &mut st.tally)
                    .map_err(|e| format!("{} step {step}: {e}", r.name))?;
                rec.log(
                    "grow",
                    &r.name,
                    format!(
                        "step {step}{on}: {} tokens decoded, grew {blocks} block(s) → KV {} at {:#x} (same address)",
                        r.tokens,
                        mib(r.region.committed()),
                        r.region.addr()
                    ),
                );
            }
        }
        Ok::<(), Box<dyn Error>>(())
    };
    let at_loss: Vec<u64> = BATCH.iter().map(|b| b.2).collect();
    steps(&mut reqs, &[1; BATCH.len()], &at_loss, st, "")?;

    // ----- the device goes ---------------------------------------------------------------
    let when = format!(
        "active → lost mid-decode ({})",
        reqs.iter().map(|r| format!("{} at {} tokens", r.name, r.tokens)).collect::<Vec<_>>().join(", ")
    );
    let (path, how) = lose(&ctx, library, &rec, &when);
    loss.report.path = path;
    loss.report.how = how;
    loss.report.reason = ctx.reason();
    // r7 is one step behind: its next token needs a block, and the grow is
    // refused (nothing reaches the plugin).
    let (next, behind) = (at_loss[1] + 1, &mut reqs[1]);
    let detail = match decode(behind, TOKENS_PER_STEP, &s.weights, 1, &mut st.tally) {
        Err(e) => format!(
            "step {next}: the next block's grow is refused: {e}; its {} tokens of KV went with the device",
            behind.tokens
        ),
        Ok(_) => format!("step {next}: decoded on a lost context (NOT refused)"),
    };
    rec.log("refused", &behind.name, detail);
    let weights_ranges = s.weights.ranges();
    let lost_kv = kv_ranges(&reqs, &[]);
    let all_lost = lock(&s.weights.shards).iter().all(|x| x.alloc.is_lost())
        && prefix.is_lost()
        && reqs.iter().all(|r| r.region.is_lost());
    st.measure("lost, not yet settled", &weights_ranges, &lost_kv);

    // ----- termination: the books close once -----------------------------------------------
    let (used_before, discharged_before) = (pool.used(), pool.discharged());
    manager.poll();
    let (used_after, discharged_after) = (pool.used(), pool.discharged());
    let settlement = ctx.settlement();
    let r = &mut loss.report;
    r.context = label.clone();
    (r.used_before, r.used_after) = (used_before, used_after);
    r.discharged_by_settlement = discharged_after - discharged_before;
    if let Some(set) = &settlement {
        r.settled_bytes = set.bytes;
        r.objects_forgotten = set.objects_forgotten;
        r.settled = set
            .bindings
            .iter()
            .map(|b| line(&rec, &b.pool, b.holder, b.class, b.leases, b.bytes, b.quarantined_bytes))
            .collect();
        r.settled.sort();
    }
    r.notices = lock(&loss.heard)
        .iter()
        .find(|h| h.event.to == LifeState::Lost)
        .map(|h| {
            h.event
                .notices
                .iter()
                .map(|n| line(&rec, &n.pool, n.holder, n.class, n.objects, n.bytes, n.quarantined_bytes))
                .collect()
        })
        .unwrap_or_default();
    r.notices.sort();
    rec.log(
        "terminated",
        &label,
        match &settlement {
            Some(set) => format!(
                "poll: nothing in flight → terminated; {} binding(s) settled from their ledgers: {} discharged \
                 once (pool used {} → {}), {} object(s) forgotten",
                set.bindings.len(),
                mib(set.bytes),
                mib(used_before),
                mib(used_after),
                set.objects_forgotten
            ),
            None => format!("poll left the context {} (NOT terminated)", ctx.state()),
        },
    );
    r.terminate_again = match manager.terminate(&ctx, Duration::ZERO) {
        Err(ManagerError::Terminate(e @ TerminateError::AlreadyTerminated { .. })) => e.to_string(),
        Err(e) => format!("unexpected: {e}"),
        Ok(again) => format!("settled AGAIN: {} B", again.bytes),
    };
    manager.poll();

    // ----- the lost handles are inert -------------------------------------------------------
    let plugin_name =
        manager.registry().plugin_of(&ctx).ok_or("the lost context's plugin is not registered")?;
    let plugin_objects = || {
        manager
            .registry()
            .live_reports()
            .iter()
            .find(|(n, _)| *n == plugin_name)
            .map(|(_, r)| r.plugin_reported)
    };
    let figures = || {
        let q = manager.queue().stats();
        (
            pool.used(),
            pool.discharged(),
            pool.snapshot().leased,
            q.enqueued,
            q.pending,
            ctx.pins(),
            plugin_objects(),
        )
    };
    let before = figures();
    let mut stranded = weights_ranges;
    stranded.extend_from_slice(&lost_kv);
    let shards = std::mem::take(&mut *lock(&s.weights.shards));
    let (n_shards, n_regions) = (shards.len(), reqs.len());
    let batch: Vec<(String, u8, u64)> = reqs.iter().map(|r| (r.name.clone(), r.kv_byte, r.tokens)).collect();
    drop((shards, reqs, prefix));
    let after = figures();
    loss.report.inert_drop = all_lost && before == after;
    loss.report.lost_instance_objects = after.6.unwrap_or(0);
    rec.log(
        "inert",
        "handles",
        format!(
            "{n_shards} shard(s), the prefix and {n_regions} region(s) dropped after termination (all said is_lost: \
             {all_lost}): no plugin call (the lost instance still reports {} live object(s)), nothing refunded \
             twice (pool used {}, discharged {}), nothing queued",
            after.6.unwrap_or(0),
            mib(after.0),
            mib(after.1)
        ),
    );
    st.stranded = Stranded { ranges: stranded, bytes: settlement.as_ref().map_or(0, |x| x.bytes) };
    st.measure("lost context settled", &[], &[]);

    // ----- the replacement ------------------------------------------------------------------
    loss.report.bind_refused =
        match manager.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Kv).holder(kv_id)) {
            Err(e) => e.to_string(),
            Ok(_) => "NOT refused".into(),
        };
    rec.log("refused", "kv", format!("bind on the lost context: {}", loss.report.bind_refused));
    // The plugin's other mechanisms (a NUMA node's, the huge-page one) were
    // not lost, but the plugin goes as a whole: each is retired, and with
    // nothing of it alive terminates at once.
    let others: Vec<_> = manager
        .registry()
        .contexts()
        .into_iter()
        .filter(|c| {
            !Arc::ptr_eq(c, &ctx) && manager.registry().plugin_of(c).as_deref() == Some(&*plugin_name)
        })
        .collect();
    for other in &others {
        manager.retire(other, "its plugin is unregistered after another of its devices was lost")?;
        manager.terminate(other, Duration::from_secs(5))?;
    }
    manager.unload_plugin(&plugin_name)?;
    rec.log(
        "unregister",
        "plugin",
        format!(
            "{plugin_name} ({}) unregistered: its lost context terminated ({} other context(s) of it retired and \
             terminated, nothing of theirs alive); its library stays mapped, since the lost instance still holds {} \
             object(s) the host will never free",
            library.display(),
            others.len(),
            loss.report.lost_instance_objects
        ),
    );
    // SAFETY: the reference plugin's entry, linked into this binary and
    // built from this workspace against the same ABI.
    let spare = unsafe {
        Plugin::from_entry(
            memplug_plugin_cpu::cpu_plugin_entry,
            locate::CPU_PLUGIN_LABEL,
            &LoadOptions::default(),
        )
    }?;
    loss.report.replacement = format!("{} {} ({})", spare.name(), spare.version(), spare.origin());
    manager.register_plugin(spare)?;
    let new = manager.select(CPU0, NEEDS)?;
    loss.report.replacement_context = new.label().into();
    rec.log(
        "replacement",
        "plugin",
        format!(
            "{} registered — the copy of the CPU plugin linked into memplug, a separate instance (the registry \
             holds one plugin per name, so only now, and `replace` cannot route to it); select(cpu:0) → its \
             context {} ({})",
            loss.report.replacement,
            new.label(),
            new.state()
        ),
    );
    s.weights_b = manager.bind(&new, &pool, BindingSpec::new(AllocationClass::Weights).holder(weights_id))?;
    s.kv_b = manager.bind(&new, &pool, BindingSpec::new(AllocationClass::Kv).holder(kv_id))?;
    s.weights.load(&s.weights_b, PINNED.iter().map(|n| (n.to_string(), true)), st.kernel.page)?;
    rec.log("load", "weights", format!("{} pinned shard(s) reloaded onto {}", PINNED.len(), new.label()));
    let prefix = system_prompt(&s.kv_b)?;
    rec.log(
        "prefix",
        "kv",
        format!("system prompt KV made again on {} ({})", new.label(), mib(prefix.len())),
    );
    let mut reqs = Vec::new();
    for (name, byte, tokens) in batch {
        let mut r = admit(name, &s.kv_b, &prefix, byte, &mut st.tally)?;
        grow(&mut r, tokens * KV_PER_TOKEN, true, &mut st.tally)
            .map_err(|e| format!("{} re-prefill: {e}", r.name))?;
        r.tokens = tokens;
        rec.log(
            "resume",
            &r.name,
            format!(
                "re-admitted on {}: region at {:#x}; its {tokens} tokens re-prefilled (KV {} recomputed)",
                new.label(),
                r.addr,
                mib(r.region.committed())
            ),
        );
        reqs.push(r);
    }
    loss.regions += reqs.len() as u64;
    let next: Vec<u64> = at_loss.iter().map(|d| d + 1).collect();
    steps(&mut reqs, &next, &[DECODE_STEPS as u64; BATCH.len()], st, " on the replacement")?;
    st.measure("decoding on the replacement", &s.weights.ranges(), &kv_ranges(&reqs, &[]));

    let on_new =
        s.weights_b.mechanism().same_as(new.mechanism()) && s.kv_b.mechanism().same_as(new.mechanism());
    loss.report.resumed = reqs
        .iter()
        .zip(&at_loss)
        .map(|(r, &done)| Resumed {
            request: r.name.clone(),
            tokens_at_loss: done * TOKENS_PER_STEP,
            tokens: r.tokens,
            intact: kv_intact(r) && prefix_intact(r),
        })
        .collect();
    let done =
        loss.report.resumed.iter().all(|x| x.intact && x.tokens == DECODE_STEPS as u64 * TOKENS_PER_STEP);
    st.checks.add(
        "requests continue on the replacement",
        done && on_new
            && !Arc::ptr_eq(&ctx, &new)
            && loss.report.bind_refused.contains("no active successor"),
        format!(
            "{} on {}: {}; bind on the lost context refused: {}",
            loss.report.replacement,
            new.label(),
            loss.report
                .resumed
                .iter()
                .map(|x| format!(
                    "{} {} → {} tokens (KV and prefix intact: {})",
                    x.request, x.tokens_at_loss, x.tokens, x.intact
                ))
                .collect::<Vec<_>>()
                .join(", "),
            loss.report.bind_refused.contains("no active successor")
        ),
    );
    for r in reqs {
        let (name, kv) = (r.name.clone(), r.region.committed());
        drop(r);
        rec.log("finish", name, format!("done on the replacement; region and {} of KV freed", mib(kv)));
    }
    drop(prefix);
    loss.settlement = settlement;
    loss.context = Some(ctx);
    Ok((s, loss))
}
