//! The report as Prometheus text exposition (format 0.0.4): one family per
//! figure, each with `# HELP` and `# TYPE`, counters named `_total`, bytes
//! named `_bytes`. The names are listed in `docs/statistics.md`; this file
//! is the one place they are made.

use super::report::{PoolReport, StatsReport};
use crate::deferred::QueueStats;
use crate::governor::{AllocationClass, ClassStats, PoolSnapshot};
use std::fmt::Write;

#[derive(Clone, Copy)]
enum Type {
    Gauge,
    Counter,
}

/// One sample: its labels (name, value) and its value.
type Sample = (Vec<(&'static str, String)>, u64);

/// A family of whole-pool figures: name, type, help, the figure.
type PoolFamily = (&'static str, Type, &'static str, fn(&PoolSnapshot) -> u64);

/// A family of per-class figures: name, type, help, the figure.
type ClassFamily = (&'static str, Type, &'static str, fn(&ClassStats) -> u64);

/// A family of the queue's counters: name, help, the figure.
type QueueFamily = (&'static str, &'static str, fn(&QueueStats) -> u64);
/// A family of the process-wide plugin fault counts: name, help, the figure.
type FaultFamily = (&'static str, &'static str, fn(&crate::faults::PluginFaults) -> u64);

/// Writes one family: help, type, then every sample (none: the family is
/// left out, as the format allows).
fn family(out: &mut String, name: &str, ty: Type, help: &str, samples: Vec<Sample>) {
    if samples.is_empty() {
        return;
    }
    let ty = match ty {
        Type::Gauge => "gauge",
        Type::Counter => "counter",
    };
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {ty}");
    for (labels, value) in samples {
        out.push_str(name);
        if !labels.is_empty() {
            out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{k}=\"{}\"", escape(v));
            }
            out.push('}');
        }
        let _ = writeln!(out, " {value}");
    }
}

/// A label value as the format wants it: backslash, quote and newline
/// escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn pool_labels(p: &PoolReport) -> Vec<(&'static str, String)> {
    vec![("pool", p.snapshot.name.to_string())]
}

/// Per pool.
fn per_pool(r: &StatsReport, f: impl Fn(&PoolReport) -> u64) -> Vec<Sample> {
    r.pools.iter().map(|p| (pool_labels(p), f(p))).collect()
}

/// Per pool and class.
fn per_class(r: &StatsReport, f: impl Fn(&ClassStats) -> u64) -> Vec<Sample> {
    let mut v = Vec::new();
    for p in &r.pools {
        for class in AllocationClass::ALL {
            let mut labels = pool_labels(p);
            labels.push(("class", class.name().into()));
            v.push((labels, f(p.snapshot.class(class))));
        }
    }
    v
}

/// Per holder and class.
fn per_holder_class(r: &StatsReport, f: impl Fn(&ClassStats) -> u64) -> Vec<Sample> {
    let mut v = Vec::new();
    for p in &r.pools {
        for h in &p.holders {
            for class in AllocationClass::ALL {
                let labels = vec![
                    ("pool", p.snapshot.name.to_string()),
                    ("holder", h.name.to_string()),
                    ("holder_id", h.holder.get().to_string()),
                    ("class", class.name().into()),
                ];
                v.push((labels, f(h.class(class))));
            }
        }
    }
    v
}

fn queue(r: &StatsReport, f: impl Fn(&QueueStats) -> u64) -> Vec<Sample> {
    r.queue.iter().map(|q| (Vec::new(), f(q))).collect()
}

/// The report as Prometheus text.
pub fn to_prometheus(r: &StatsReport) -> String {
    use Type::{Counter, Gauge};
    let mut o = String::new();
    let o = &mut o;
    family(
        o,
        "memplug_stats_schema_version",
        Gauge,
        "Layout version of these statistics.",
        vec![(Vec::new(), r.schema_version as u64)],
    );

    // Pools as a whole (exact figures of the capacity word).
    let pools: [PoolFamily; 7] = [
        ("memplug_pool_capacity_bytes", Gauge, "Bytes the pool may charge.", |p| p.capacity),
        (
            "memplug_pool_level_used_bytes",
            Gauge,
            "Bytes charged at the pool, pools below it included. Exact.",
            |p| p.used,
        ),
        ("memplug_pool_level_peak_bytes", Gauge, "Highest level_used_bytes ever reached. Exact.", |p| p.peak),
        ("memplug_pool_children_used_bytes", Gauge, "Bytes charged through the pools directly below.", |p| {
            p.children_used
        }),
        ("memplug_pool_holders", Gauge, "Holders registered now.", |p| p.holders as u64),
        ("memplug_pool_waits_total", Counter, "Requests that waited for room.", |p| p.waits),
        ("memplug_pool_wait_timeouts_total", Counter, "Requests whose wait for room timed out.", |p| {
            p.wait_timeouts
        }),
    ];
    for (name, ty, help, f) in &pools {
        family(o, name, *ty, help, per_pool(r, |p| f(&p.snapshot)));
    }

    // Pools per class (the pool's own accounts).
    let classes: [ClassFamily; 16] = [
        ("memplug_pool_used_bytes", Gauge, "Bytes charged: reserved, leased and quarantined.", |c| {
            c.charged()
        }),
        ("memplug_pool_reserved_bytes", Gauge, "Bytes held by grants not yet committed.", |c| c.reserved),
        ("memplug_pool_leased_bytes", Gauge, "Bytes charged to live leases.", |c| c.leased),
        ("memplug_pool_quarantined_bytes", Gauge, "Bytes charged for good after failed frees.", |c| {
            c.quarantined
        }),
        ("memplug_pool_leases", Gauge, "Live leases.", |c| c.leases),
        ("memplug_pool_peak_bytes", Gauge, "Highest used_bytes a sample saw (a lower bound).", |c| c.peak),
        ("memplug_pool_granted_bytes_total", Counter, "Bytes ever charged.", |c| c.granted_bytes),
        ("memplug_pool_released_bytes_total", Counter, "Bytes ever given back.", |c| c.released_bytes),
        ("memplug_pool_grants_total", Counter, "Grants made.", |c| c.grants),
        ("memplug_pool_failures_total", Counter, "Requests refused (OutOfBudget).", |c| c.failures),
        ("memplug_pool_tickets_total", Counter, "Pressure tickets issued.", |c| c.tickets),
        ("memplug_pool_evictions_total", Counter, "Tickets answered with bytes released.", |c| c.evictions),
        ("memplug_pool_evicted_bytes_total", Counter, "Bytes the answers said were released.", |c| {
            c.evicted_bytes
        }),
        ("memplug_pool_quarantines_total", Counter, "Quarantine events.", |c| c.quarantines),
        ("memplug_pool_leaked_leases_total", Counter, "Leases dropped without release.", |c| c.leaked_leases),
        ("memplug_pool_leaked_bytes_total", Counter, "Bytes those leases held.", |c| c.leaked_bytes),
    ];
    for (name, ty, help, f) in &classes {
        family(o, name, *ty, help, per_class(r, f));
    }

    // Holders per class.
    let holders: [ClassFamily; 5] = [
        ("memplug_holder_used_bytes", Gauge, "Bytes charged to the holder.", |c| c.charged()),
        ("memplug_holder_granted_bytes_total", Counter, "Bytes ever charged to the holder.", |c| {
            c.granted_bytes
        }),
        ("memplug_holder_released_bytes_total", Counter, "Bytes the holder ever gave back.", |c| {
            c.released_bytes
        }),
        ("memplug_holder_tickets_total", Counter, "Pressure tickets the holder received.", |c| c.tickets),
        ("memplug_holder_evictions_total", Counter, "Tickets the holder answered with bytes.", |c| {
            c.evictions
        }),
    ];
    for (name, ty, help, f) in &holders {
        family(o, name, *ty, help, per_holder_class(r, f));
    }

    // The deferred-free queue.
    family(
        o,
        "memplug_deferred_pending",
        Gauge,
        "Frees waiting for their fences.",
        queue(r, |q| q.pending as u64),
    );
    let q: [QueueFamily; 10] = [
        ("memplug_deferred_enqueued_total", "Frees that waited in the queue.", |q| q.enqueued),
        ("memplug_deferred_immediate_total", "Frees whose fences were complete at once.", |q| q.immediate),
        ("memplug_deferred_retired_total", "Frees retired.", |q| q.retired),
        ("memplug_deferred_quarantined_total", "Frees the mechanism refused.", |q| q.quarantined),
        ("memplug_deferred_fence_errors_total", "Fence queries that failed.", |q| q.fence_errors),
        ("memplug_deferred_lost_total", "Frees left to a lost context's settlement.", |q| q.lost),
        ("memplug_deferred_lost_fences_total", "Fences that answered DEVICE_LOST.", |q| q.lost_fences),
        ("memplug_deferred_wait_errors_total", "Drain waits on a fence that failed (a stuck entry).", |q| {
            q.wait_errors
        }),
        ("memplug_deferred_backoffs_total", "Pauses a drain took while nothing retired.", |q| q.backoffs),
        (
            "memplug_deferred_settled_lost_total",
            "Frees of lost contexts retired without their fences.",
            |q| q.settled_lost,
        ),
    ];
    for (name, help, f) in &q {
        family(o, name, Counter, help, queue(r, f));
    }

    // Plugin misbehaviours the host survived (process-wide).
    let faults: [FaultFamily; 4] = [
        (
            "memplug_plugin_late_sink_writes_total",
            "Writes into a message sink after its call returned, dropped.",
            |f| f.late_sink_writes,
        ),
        ("memplug_plugin_unreadable_messages_total", "Plugin messages cut at an unreadable byte.", |f| {
            f.unreadable_messages
        }),
        (
            "memplug_plugin_refused_block_sizes_total",
            "Blocks refused for a size other than the one asked.",
            |f| f.refused_block_sizes,
        ),
        (
            "memplug_plugin_refused_descriptors_total",
            "Exported descriptors refused (not new, or not of their kind).",
            |f| f.refused_descriptors,
        ),
    ];
    for (name, help, f) in &faults {
        family(o, name, Counter, help, r.plugin_faults.iter().map(|p| (Vec::new(), f(p))).collect());
    }

    // Contexts.
    let ctx = |f: fn(&super::report::ContextReport) -> u64| -> Vec<Sample> {
        r.contexts.iter().map(|c| (vec![("context", c.context.clone())], f(c))).collect()
    };
    family(
        o,
        "memplug_context_state",
        Gauge,
        "1 for the state the context is in.",
        r.contexts
            .iter()
            .map(|c| (vec![("context", c.context.clone()), ("state", c.state.clone())], 1))
            .collect(),
    );
    family(o, "memplug_context_pins", Gauge, "Objects of the context alive now.", ctx(|c| c.pins));
    family(
        o,
        "memplug_context_calls_in_flight",
        Gauge,
        "Calls into the plugin in flight.",
        ctx(|c| c.calls_in_flight),
    );
    std::mem::take(o)
}
