//! Statuses that mean one thing (issue 28, item 10), on the reference CPU
//! plugin: size 0 is `INVALID_ARGUMENT` through a plain and a caching
//! binding alike; a retiring context makes no new stream (one made there
//! would hold back its termination); a context that retired and terminated
//! in order refuses new work as a state, never as a lost device. The table
//! these rows belong to is `docs/CONTRACT.md`, "Host statuses".

mod common;

use common::{Rig, MIB};
use memplug_host::governor::AllocationClass;
use memplug_host::{BindingError, BindingSpec, CacheConfig, LifeState, Status};
use std::time::Duration;

fn status(e: &BindingError) -> Status {
    match e {
        BindingError::Plugin(c) => c.status,
        other => panic!("expected a status-carrying refusal, got {other:?}"),
    }
}

#[test]
fn size_zero_is_invalid_argument_through_a_binding_and_a_caching_binding() {
    let r = Rig::cpu("size-zero", 64 * MIB);
    let e = r.binding.allocate(0, 64).unwrap_err();
    assert_eq!(status(&e), Status::InvalidArgument, "{e}");
    assert!(e.to_string().contains("size 0"), "{e}");
    let cache = r
        .manager
        .bind_caching(&r.context, &r.pool, BindingSpec::new(AllocationClass::Other), CacheConfig::default())
        .unwrap();
    let e = cache.allocate(0, 64).unwrap_err();
    assert_eq!(status(&e), Status::InvalidArgument, "the cache answers as the binding does: {e}");
    assert_eq!(r.pool.used(), 0, "nothing was charged");
    // A one-byte request still works through both.
    drop(r.binding.allocate(1, 64).unwrap());
    drop(cache.allocate(1, 64).unwrap());
}

#[test]
fn a_retiring_context_makes_no_stream_and_still_terminates() {
    let r = Rig::cpu("retiring-stream", 64 * MIB);
    let sync = r.mechanism().sync().unwrap();
    let before = sync.stream_create().unwrap();
    r.manager.retire(&r.context, "maintenance").unwrap();
    let e = sync.stream_create().unwrap_err();
    assert_eq!(e.status, Status::InvalidState, "{e}");
    assert!(e.message.contains("retiring"), "{e}");
    // A stream made before still works and is given back; then the
    // context ends: nothing made during retirement holds it.
    sync.stream_destroy(before).unwrap();
    let Rig { manager, context, binding, .. } = r;
    drop(binding);
    manager.poll();
    assert_eq!(context.state(), LifeState::Terminated, "{:?}", context.reason());
}

#[test]
fn a_context_that_retired_in_order_refuses_as_a_state_not_as_a_loss() {
    let r = Rig::cpu("retired-in-order", 64 * MIB);
    r.manager.retire(&r.context, "maintenance").unwrap();
    let e = r.binding.allocate(64, 64).unwrap_err();
    assert_eq!(status(&e), Status::InvalidState, "retiring: {e}");
    r.context.terminate(Duration::from_secs(5)).unwrap();
    assert_eq!(r.context.state(), LifeState::Terminated);
    let e = r.binding.allocate(64, 64).unwrap_err();
    assert_eq!(status(&e), Status::InvalidState, "terminated in order, never lost: {e}");
    assert!(!e.to_string().contains("went with it"), "{e}");
    let e = r.mechanism().sync().unwrap().stream_create().unwrap_err();
    assert_eq!(e.status, Status::InvalidState, "{e}");

    // The same context lost instead: DEVICE_LOST.
    let l = Rig::cpu("lost-then-terminated", 64 * MIB);
    l.context.declare_lost("a sticky fault in the test");
    l.context.terminate(Duration::from_secs(5)).unwrap();
    let e = l.binding.allocate(64, 64).unwrap_err();
    assert_eq!(status(&e), Status::DeviceLost, "{e}");
}
