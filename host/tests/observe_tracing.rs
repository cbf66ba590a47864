//! Events and plugin messages through `tracing` (the `tracing` feature): a
//! recording subscriber sees a grant at `debug` and an OutOfBudget at
//! `info` under `memplug::event`, with their fields, and no listener is
//! needed for it.

use memplug_host::governor::{AllocationClass, Governor};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

type Seen = Arc<Mutex<Vec<(String, Level, BTreeMap<String, String>)>>>;

struct Recorder(Seen);

struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, e: &Event<'_>) {
        let mut f = Fields(BTreeMap::new());
        e.record(&mut f);
        self.0.lock().unwrap().push((e.metadata().target().into(), *e.metadata().level(), f.0));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn events_reach_tracing_with_their_fields() {
    let seen: Seen = Arc::default();
    tracing::subscriber::with_default(Recorder(seen.clone()), || {
        let g = Governor::new();
        let pool = g.pool(g.create_pool("traced", 1000).unwrap()).unwrap();
        let grant = pool.try_reserve(600, AllocationClass::Kv, None).unwrap();
        assert!(pool.try_reserve(600, AllocationClass::Kv, None).is_err());
        drop(grant);
    });
    let seen = seen.lock().unwrap();
    let events: Vec<_> = seen.iter().filter(|(t, _, _)| t == "memplug::event").collect();
    assert_eq!(events.len(), 2, "{seen:?}");
    let (_, level, f) = events[0];
    assert_eq!(*level, Level::DEBUG);
    assert_eq!(f["kind"], "grant");
    assert_eq!(f["bytes"], "600");
    assert_eq!(f["class"], "kv");
    assert_eq!(f["pool_name"], "traced");
    let (_, level, f) = events[1];
    assert_eq!(*level, Level::INFO);
    assert_eq!(f["kind"], "out_of_budget");
    assert_eq!(f["detail"], "traced");
    assert!(!events[0].2.contains_key("holder"), "no holder: the field is left out");
}
