//! One binding used from several threads: allocations made on two threads
//! (so through two of the binding's per-stripe anchors), the binding's last
//! handle dropped while they live, and the allocations freed on a third
//! thread. Everything is counted back exactly, and the binding itself goes
//! with the last allocation — its context is unpinned, so the plugin
//! unloads — never before it.

mod common;

use common::*;
use memplug_host::ObjectKind;
use std::thread;

#[test]
fn allocations_from_two_threads_outlive_their_binding_and_free_from_a_third() {
    let rig = Rig::cpu("binding-threads", 1 << 24);
    let made: Vec<_> = thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| s.spawn(|| (0..16).map(|_| rig.binding.allocate(256, 16).unwrap()).collect::<Vec<_>>()))
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(rig.mechanism().live(ObjectKind::Allocation), 32, "the host counts every allocation once");
    assert_eq!(rig.pool.used(), made.iter().map(|a| a.charged()).sum::<u64>());

    let Rig { manager, plugin, context, pool, binding } = rig;
    let mechanism = context.mechanism().clone();
    drop(binding);
    drop(context);
    // The allocations still hold the binding (and through it the context):
    // the plugin cannot go yet.
    let refused = manager.unload_plugin(&plugin).expect_err("allocations are alive");
    assert!(refused.to_string().contains("pinned") || refused.to_string().contains("live"), "{refused}");

    thread::spawn(move || drop(made)).join().unwrap();
    assert_eq!(pool.used(), 0, "every charge refunded");
    assert_eq!(mechanism.live(ObjectKind::Allocation), 0, "counted back to zero across stripes");
    drop(mechanism);
    manager.unload_plugin(&plugin).expect("the last allocation took the binding with it");
}
