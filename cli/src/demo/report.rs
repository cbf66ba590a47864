//! What the demo reports: the timeline (`timeline::Recorder`), the checks, the
//! final ledger, and the two renderings of the whole [`Report`] (text, and
//! one JSON document for `--json`).

use super::loss_report::LossReport;
use super::measure::{Measurement, Stranded};
use super::timeline::{Check, Event, Scene};
use super::{mib, signed_mib, KIB};
use memplug_host::governor::{AllocationClass, Pool, PoolSnapshot};
use memplug_host::QueueStats;
use serde::Serialize;

// ----- the report --------------------------------------------------------------

/// `memplug demo --json` (`docs/cli.md`).
#[derive(Serialize)]
pub(super) struct Report {
    /// [`crate::schema::DEMO`].
    pub(super) schema_version: u32,
    pub(super) scenario: Scenario,
    /// The story's steps as they ran; each event names its scene.
    pub(super) scenes: Vec<Scene>,
    pub(super) timeline: Vec<Event>,
    pub(super) measurements: Vec<Measurement>,
    pub(super) ledger: Ledger,
    /// The device lost mid-decode (scene `device_loss`).
    pub(super) loss: LossReport,
    pub(super) checks: Vec<Check>,
    pub(super) counts: Counts,
    /// Every check passed.
    pub(super) ok: bool,
}

/// How the checks ended.
#[derive(Serialize, Default, Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Counts {
    pub(super) checks: usize,
    pub(super) passed: usize,
    pub(super) skipped: usize,
    pub(super) failed: usize,
}

impl Counts {
    pub(super) fn of(checks: &[Check]) -> Counts {
        let skipped = checks.iter().filter(|c| c.skipped).count();
        let passed = checks.iter().filter(|c| c.ok && !c.skipped).count();
        Counts { checks: checks.len(), passed, skipped, failed: checks.len() - passed - skipped }
    }

    /// The text report's last line.
    pub(super) fn summary(&self) -> String {
        match (self.failed, self.skipped) {
            (0, 0) => format!("all {} checks passed", self.checks),
            (0, s) => format!("{} passed, {s} skipped", self.passed),
            (f, 0) => format!("{f} of {} checks FAILED", self.checks),
            (f, s) => format!("{f} of {} checks FAILED ({} passed, {s} skipped)", self.checks, self.passed),
        }
    }
}

#[derive(Serialize)]
pub(super) struct Scenario {
    pub(super) plugin: String,
    pub(super) mechanism: String,
    pub(super) device: String,
    pub(super) page_size: u64,
    pub(super) pool_capacity: u64,
    pub(super) weight_shard_bytes: u64,
    pub(super) pinned_shards: usize,
    pub(super) expert_shards: usize,
    pub(super) prefix_bytes: u64,
    pub(super) kv_step_bytes: u64,
    pub(super) requests: usize,
    pub(super) resident_method: &'static str,
    pub(super) process_method: &'static str,
    pub(super) process_tolerance: u64,
}

#[derive(Serialize)]
pub(super) struct ClassLine {
    class: &'static str,
    reserved: u64,
    leased: u64,
    quarantined: u64,
    grants: u64,
    failures: u64,
}

#[derive(Serialize)]
pub(super) struct PoolLine {
    name: String,
    capacity: u64,
    used: u64,
    peak: u64,
    free: u64,
    tickets: u64,
    bytes_wanted: u64,
    bytes_answered: u64,
}

#[derive(Serialize)]
pub(super) struct HolderLine {
    name: String,
    priority: u32,
    tickets: u64,
    bytes_wanted: u64,
    bytes_answered: u64,
    zero_answers: u64,
    leased: u64,
}

#[derive(Serialize)]
pub(super) struct QueueLine {
    enqueued: u64,
    immediate: u64,
    retired: u64,
    quarantined: u64,
    pending: usize,
}

#[derive(Serialize)]
pub(super) struct PluginLine {
    /// Objects the plugin itself reports alive (before the unload).
    pub(super) live_objects: u64,
    /// Objects the host counts alive, per kind (before the unload).
    pub(super) host_objects: u64,
    pub(super) context_pins: u64,
    pub(super) unloaded: bool,
    pub(super) unload_error: Option<String>,
}

#[derive(Serialize)]
pub(super) struct Ledger {
    classes: Vec<ClassLine>,
    pool: PoolLine,
    holders: Vec<HolderLine>,
    queue: QueueLine,
    drain_left: Vec<String>,
    plugin: PluginLine,
    /// The last measurement (after everything was released).
    resident_after: Option<u64>,
    process_delta_after: Option<i64>,
    /// Bytes the lost context left resident, no longer charged.
    stranded: u64,
    /// Bytes the pool discharged (settled lost contexts), all told.
    discharged: u64,
}

impl Ledger {
    /// The ledger after teardown: the pool's figures (`snap`), its holders,
    /// the deferred-free queue (`q`) and what `drain` left, the plugin, the
    /// last measurement, and what a lost context left behind.
    pub(super) fn collect(
        snap: &PoolSnapshot,
        pool: &Pool,
        q: &QueueStats,
        drain_left: Vec<String>,
        plugin: PluginLine,
        last: Option<&Measurement>,
        stranded: &Stranded,
    ) -> Ledger {
        Ledger {
            classes: AllocationClass::ALL
                .iter()
                .map(|&c| {
                    let s = snap.class(c);
                    ClassLine {
                        class: c.name(),
                        reserved: s.reserved,
                        leased: s.leased,
                        quarantined: s.quarantined,
                        grants: s.grants,
                        failures: s.failures,
                    }
                })
                .collect(),
            pool: PoolLine {
                name: snap.name.to_string(),
                capacity: snap.capacity,
                used: snap.used,
                peak: snap.peak,
                free: snap.free,
                tickets: snap.pressure.tickets,
                bytes_wanted: snap.pressure.bytes_wanted,
                bytes_answered: snap.pressure.bytes_answered,
            },
            holders: pool
                .holders()
                .iter()
                .map(|h| HolderLine {
                    name: h.name.to_string(),
                    priority: h.priority.0,
                    tickets: h.pressure.tickets,
                    bytes_wanted: h.pressure.bytes_wanted,
                    bytes_answered: h.pressure.bytes_answered,
                    zero_answers: h.pressure.zero_answers,
                    leased: h.totals().leased,
                })
                .collect(),
            queue: QueueLine {
                enqueued: q.enqueued,
                immediate: q.immediate,
                retired: q.retired,
                quarantined: q.quarantined,
                pending: q.pending,
            },
            drain_left,
            plugin,
            resident_after: last.and_then(|m| m.resident_kv.zip(m.resident_weights).map(|(k, w)| k + w)),
            process_delta_after: last.and_then(|m| m.process_delta),
            stranded: stranded.bytes,
            discharged: pool.discharged(),
        }
    }
}

// ----- output ------------------------------------------------------------------------------

pub(super) fn render_text(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    macro_rules! p {
        ($($t:tt)*) => {
            let _ = writeln!(o, $($t)*);
        };
    }

    let s = &r.scenario;
    p!("memplug demo: LLM serving under a hard budget");
    p!("  plugin     {} — mechanism {} on {}, page {} B", s.plugin, s.mechanism, s.device, s.page_size);
    p!(
        "  budget     pool of {}; weights {} pinned + {} expert shards of {}; system prompt {} shared; \
         KV grows {} per step",
        mib(s.pool_capacity),
        s.pinned_shards,
        s.expert_shards,
        mib(s.weight_shard_bytes),
        mib(s.prefix_bytes),
        mib(s.kv_step_bytes)
    );
    p!();
    p!("timeline  (ms since start, event, who, what — pool used after)");
    let mut scene = "";
    for e in &r.timeline {
        if e.scene != scene {
            scene = e.scene;
            if let Some(s) = r.scenes.iter().find(|s| s.id == scene) {
                p!("  -- {}. {}", s.step, s.title);
            }
        }
        p!("  {:>7.1}  {:<13} {:<8} {}  [used {}]", e.t_ms, e.kind, e.subject, e.detail, mib(e.pool_used));
    }
    p!();
    p!("governor vs kernel");
    p!("  resident = {}", s.resident_method);
    p!("  process Δ = {}; tolerance {}", s.process_method, mib(s.process_tolerance));
    if r.measurements.iter().any(|m| m.stranded != 0) {
        p!("  stranded = the lost context's pages, no longer charged: pagemap over its objects; \
             Δ-governor = process Δ − governor − stranded");
    }
    p!(
        "  {:<30} {:>10} {:>10} {:>10} {:>10} {:>12} {:>9}",
        "moment",
        "governor",
        "resident",
        "stranded",
        "process Δ",
        "Δ-governor",
        "verdict"
    );
    for m in &r.measurements {
        let resident = m.resident_weights.zip(m.resident_kv).map_or("n/a".into(), |(w, k)| mib(w + k));
        let stranded = match (m.stranded, m.resident_stranded) {
            (0, _) => "-".to_string(),
            (_, Some(s)) => mib(s),
            (_, None) => "n/a".into(),
        };
        p!(
            "  {:<30} {:>10} {:>10} {:>10} {:>10} {:>12} {:>9}",
            m.label,
            mib(m.governor_used),
            resident,
            stranded,
            m.process_delta.map_or("n/a".into(), signed_mib),
            m.process_excess.map_or("n/a".into(), |e| format!("{:+} KiB", e / KIB as i64)),
            if m.exact_ok && m.process_ok { "agree" } else { "DISAGREE" }
        );
    }
    {
        let l = &r.ledger;
        p!();
        p!("ledger (after teardown)");
        p!(
            "  {:<12} {:>10} {:>10} {:>12} {:>8} {:>9}",
            "class",
            "reserved",
            "leased",
            "quarantined",
            "grants",
            "failures"
        );
        for c in &l.classes {
            p!(
                "  {:<12} {:>10} {:>10} {:>12} {:>8} {:>9}",
                c.class,
                c.reserved,
                c.leased,
                c.quarantined,
                c.grants,
                c.failures
            );
        }
        p!("  (failures: the governor's refusal counter as bindings drive it: a fast-path miss that");
        p!("   pressure then cured counts 1, the one real refusal counts 2)");
        let p = &l.pool;
        p!(
            "  pool '{}'   used {} B, peak {}, capacity {}; {} ticket(s) issued, {} wanted, {} answered",
            p.name,
            p.used,
            mib(p.peak),
            mib(p.capacity),
            p.tickets,
            mib(p.bytes_wanted),
            mib(p.bytes_answered)
        );
        for h in &l.holders {
            p!(
                "  holder {:<8} priority {:>2}: {} ticket(s), {} wanted, {} answered, {} zero answer(s); {} B leased",
                h.name,
                h.priority,
                h.tickets,
                mib(h.bytes_wanted),
                mib(h.bytes_answered),
                h.zero_answers,
                h.leased
            );
        }
        let q = &l.queue;
        p!(
            "  queue        {} enqueued, {} freed at once, {} retired, {} quarantined, {} pending",
            q.enqueued,
            q.immediate,
            q.retired,
            q.quarantined,
            q.pending
        );
        let pl = &l.plugin;
        p!(
            "  plugin       {} live object(s) reported by the plugin, {} counted by the host, {} context pin(s); {}",
            pl.live_objects,
            pl.host_objects,
            pl.context_pins,
            if pl.unloaded { "unloaded".to_string() } else { format!("NOT unloaded: {}", pl.unload_error.as_deref().unwrap_or("")) }
        );
        p!(
            "  resident     {} over live objects, process Δ {} (governor says 0{})",
            l.resident_after.map_or("n/a".into(), |b| format!("{b} B")),
            l.process_delta_after.map_or("n/a".into(), |d| format!("{} KiB", d / KIB as i64)),
            if l.stranded == 0 {
                String::new()
            } else {
                format!("; {} stranded by the lost context", mib(l.stranded))
            }
        );
        p!(
            "  discharged   {} ({} B): what settling the lost context gave back to the pool",
            mib(l.discharged),
            l.discharged
        );
    }
    render_loss(&mut o, &r.loss);
    p!();
    p!("checks");
    for c in &r.checks {
        let mark = match (c.ok, c.skipped) {
            (_, true) => "skip",
            (true, false) => "ok",
            (false, false) => "FAIL",
        };
        // The details line up whatever the mark's width.
        p!("  [{mark}] {:<w$} {}", c.name, c.detail, w = 44 - mark.len());
    }
    p!();
    p!("{}", r.counts.summary());
    o
}

/// The device-loss section of the text report.
fn render_loss(o: &mut String, l: &LossReport) {
    use std::fmt::Write as _;
    macro_rules! p {
        ($($t:tt)*) => {
            let _ = writeln!(o, $($t)*);
        };
    }
    p!();
    p!("device loss (step {})", super::timeline::step("device_loss"));
    if let Some(why) = &l.skipped {
        p!("  skipped: {why}");
        return;
    }
    p!("  lost         {}: {}", l.context, l.how);
    p!("  reason       {}", l.reason.as_deref().unwrap_or("-"));
    for n in &l.notices {
        p!(
            "  told         {:<8} its {} binding held {} object(s), {}{}",
            n.holder,
            n.class,
            n.objects,
            mib(n.bytes),
            if n.quarantined_bytes == 0 {
                String::new()
            } else {
                format!(" (+{} quarantined)", mib(n.quarantined_bytes))
            }
        );
    }
    p!(
        "  settled      {} binding(s), {} once: pool used {} → {}, discharged +{} (at the end {}); \
         {} object(s) forgotten",
        l.settled.len(),
        mib(l.settled_bytes),
        mib(l.used_before),
        mib(l.used_after),
        mib(l.discharged_by_settlement),
        mib(l.discharged_at_end),
        l.objects_forgotten
    );
    for d in &l.deliveries {
        p!("  delivered    {:<8} {}", d.holder, d.transitions.join(", "));
    }
    p!("  again        terminate: {}", l.terminate_again);
    p!(
        "  inert        dropping the lost handles changed nothing: {}; the lost instance keeps {} object(s)",
        l.inert_drop,
        l.lost_instance_objects
    );
    p!("  bind         on the lost context: {}", l.bind_refused);
    p!("  replacement  {} → {}", l.replacement, l.replacement_context);
    for x in &l.resumed {
        p!(
            "  resumed      {:<8} {} tokens at the loss → {} on the replacement (intact: {})",
            x.request,
            x.tokens_at_loss,
            x.tokens,
            x.intact
        );
    }
}
