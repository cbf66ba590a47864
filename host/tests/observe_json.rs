//! The statistics report as JSON (the `serde` feature): it parses, and its
//! figures are the structs' figures, field by field.

use memplug_host::governor::{AllocationClass, ClassStats, Priority};
use memplug_host::observe::{to_json, StatsReport, SCHEMA_VERSION};
use memplug_host::{BindingSpec, ProcessMemoryManager};
use serde_json::Value;

fn cpu_manager() -> ProcessMemoryManager {
    let so = memplug_test_support::find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN");
    let m = ProcessMemoryManager::new();
    m.load_plugin(&so, &Default::default()).unwrap();
    m
}

fn assert_class(v: &Value, c: &ClassStats, what: &str) {
    let fields: [(&str, u64); 15] = [
        ("reserved", c.reserved),
        ("leased", c.leased),
        ("quarantined", c.quarantined),
        ("leases", c.leases),
        ("grants", c.grants),
        ("failures", c.failures),
        ("quarantines", c.quarantines),
        ("leaked_leases", c.leaked_leases),
        ("leaked_bytes", c.leaked_bytes),
        ("granted_bytes", c.granted_bytes),
        ("released_bytes", c.released_bytes),
        ("tickets", c.tickets),
        ("evictions", c.evictions),
        ("evicted_bytes", c.evicted_bytes),
        ("peak", c.peak),
    ];
    for (name, want) in fields {
        assert_eq!(v[name].as_u64(), Some(want), "{what}.{name} in {v}");
    }
}

#[test]
fn json_parses_and_equals_the_structs() {
    let m = cpu_manager();
    let ctx = m.context("cpu").unwrap();
    let root = m.create_pool("host", 8 << 20).unwrap();
    let pool = m.create_child_pool("tenant-a", &root, 4 << 20).unwrap();
    let reg = pool.register_holder("kv", Priority(3), |_| 0);
    let kv = m.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Kv).holder(reg.id())).unwrap();
    let w = m.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Weights)).unwrap();
    let a = kv.allocate(64 << 10, 64).unwrap();
    let b = w.allocate(1 << 20, 64).unwrap();
    drop(kv.allocate(4096, 64).unwrap());
    assert!(w.allocate(16 << 20, 64).is_err());

    let report = m.stats();
    let v: Value = serde_json::from_str(&to_json(&report)).expect("valid JSON");
    assert_eq!(v["schema_version"].as_u64(), Some(SCHEMA_VERSION as u64));
    let pools = v["pools"].as_array().expect("pools");
    assert_eq!(pools.len(), 2);
    for (p, r) in pools.iter().zip(&report.pools) {
        let s = &r.snapshot;
        // The report's snapshot is the one serialised; the live pool agrees
        // with it (nothing is in flight).
        let live = m.governor().pool(s.pool).unwrap().snapshot();
        assert_eq!(s, &live);
        assert_eq!(p["pool"].as_u64(), Some(s.pool.get()));
        assert_eq!(p["name"].as_str(), Some(&*s.name));
        assert_eq!(p["parent"].as_u64(), s.parent.map(|x| x.get()));
        assert_eq!(p["parent_name"].as_str(), s.parent_name.as_deref());
        for (name, want) in [
            ("capacity", s.capacity),
            ("used", s.used),
            ("free", s.free),
            ("peak", s.peak),
            ("reserved", s.reserved),
            ("leased", s.leased),
            ("quarantined", s.quarantined),
            ("children_used", s.children_used),
            ("waits", s.waits),
            ("wait_timeouts", s.wait_timeouts),
            ("depth", s.depth as u64),
            ("children", s.children as u64),
            ("holders", s.holders as u64),
        ] {
            assert_eq!(p[name].as_u64(), Some(want), "{}.{name}", s.name);
        }
        assert_eq!(p["pressure"]["tickets"].as_u64(), Some(s.pressure.tickets));
        for class in AllocationClass::ALL {
            assert_class(&p["classes"][class.name()], s.class(class), class.name());
        }
        let holders = p["holder_stats"].as_array().expect("holder_stats");
        assert_eq!(holders.len(), r.holders.len());
        for (h, hs) in holders.iter().zip(&r.holders) {
            assert_eq!(h["holder"].as_u64(), Some(hs.holder.get()));
            assert_eq!(h["name"].as_str(), Some(&*hs.name));
            assert_eq!(h["priority"].as_u64(), Some(hs.priority.0 as u64));
            assert_eq!(h["registered"].as_bool(), Some(hs.registered));
            for class in AllocationClass::ALL {
                assert_class(&h["classes"][class.name()], hs.class(class), "holder");
            }
        }
    }
    // Figures that must be what the program did, not only what the structs say.
    let tenant = &pools[1];
    assert_eq!(tenant["classes"]["kv"]["granted_bytes"].as_u64(), Some((64 << 10) + 4096));
    assert_eq!(tenant["classes"]["kv"]["released_bytes"].as_u64(), Some(4096));
    assert_eq!(tenant["classes"]["weights"]["failures"].as_u64(), Some(1));
    assert_eq!(pools[0]["children_used"].as_u64(), tenant["used"].as_u64());

    let q = m.queue().stats();
    assert_eq!(v["queue"]["retired"].as_u64(), Some(q.retired));
    assert_eq!(v["queue"]["pending"].as_u64(), Some(q.pending as u64));
    let ctxs = v["contexts"].as_array().expect("contexts");
    assert_eq!(ctxs.len(), report.contexts.len());
    let cpu = ctxs.iter().find(|c| c["context"].as_str() == Some(ctx.label())).expect("the cpu context");
    assert_eq!(cpu["state"].as_str(), Some("active"));
    assert_eq!(cpu["pins"].as_u64(), Some(ctx.pins()));

    // A report of one pool: no queue, no contexts.
    let one: Value = serde_json::from_str(&to_json(&StatsReport::of_pool(&pool))).unwrap();
    assert_eq!(one["pools"].as_array().map(Vec::len), Some(1));
    assert!(one["queue"].is_null());
    drop((a, b));
}
