//! A registered range is pinned in the governor's sense, on the real CPU
//! plugin with a real UCP context (no peer needed): offload and privatise
//! refuse with `Busy`, a shrink waits, a release waits, a deregistration
//! lets each go ahead; a prefix registers read-only; a loss deregisters.

mod common;

use common::*;
use memplug_host::governor::AllocationClass;
use memplug_host::{BindingSpec, Status};
use memplug_ucx::{Access, UcxError};
use std::time::Duration;

const MIB: u64 = 1 << 20;

#[test]
fn a_registered_range_holds_off_offload_privatise_shrink_and_release() {
    let Some(()) = ucx_or_skip("a_registered_range_holds_off_offload_privatise_shrink_and_release") else {
        return;
    };
    let m = memory(64 * MIB);
    let ucx = ucx(SHM);
    let sync = m.context.mechanism().sync().expect("the CPU plugin has streams");
    let stream = sync.stream_create().unwrap();
    let host_pool = m.manager.create_pool("host", 64 * MIB).unwrap();
    let host = m.manager.bind(&m.context, &host_pool, BindingSpec::new(AllocationClass::Other)).unwrap();

    // A region with a shared prefix (read-only) and 4 MiB of its own.
    let prefix = m.kv.create_shared(2 * MIB, |_| {}).unwrap();
    let mut region = m.kv.reserve_virtual(64 * MIB).unwrap();
    region.map_prefix(&prefix).unwrap();
    region.grow_to(6 * MIB, |_| Ok::<(), String>(())).unwrap();
    let used = m.pool.used();
    assert_eq!(used, 6 * MIB);

    // The prefix registers read-only; writable is refused with the reason.
    let e = ucx.register_region(&m.context, &mut region, 0, 2 * MIB, Access::ReadWrite).err().unwrap();
    assert!(matches!(e, UcxError::Invalid(_)) && e.to_string().contains("read-only shared prefix"), "{e}");
    let p = ucx.register_region(&m.context, &mut region, 0, 2 * MIB, Access::Read).unwrap();
    // Past the usable length and empty ranges are refused.
    let e = ucx.register_region(&m.context, &mut region, 4 * MIB, 4 * MIB, Access::ReadWrite).err().unwrap();
    assert!(e.to_string().contains("not inside the region"), "{e}");
    let e = ucx.register_region(&m.context, &mut region, 0, 0, Access::Read).err().unwrap();
    assert!(e.to_string().contains("not inside the region"), "{e}");

    // Privatise of the registered prefix waits for the pin, then refuses.
    let e = region.privatise(0, 2 * MIB, &stream, Duration::from_millis(50)).err().unwrap();
    assert!(e.to_string().contains("UCX registration"), "{e}");
    drop(p);
    let f = region.privatise(0, 2 * MIB, &stream, Duration::from_secs(5)).unwrap();
    assert!(f.wait(Duration::from_secs(5)).unwrap());

    // The private part: offload refuses while registered.
    let reg = ucx.register_region(&m.context, &mut region, 4 * MIB, 2 * MIB, Access::ReadWrite).unwrap();
    let e = region.offload_to(&host, &stream, Duration::from_millis(50)).unwrap_err();
    assert!(
        matches!(&e, memplug_host::BindingError::Plugin(c) if c.status == Status::Busy)
            && e.to_string().contains("UCX registration"),
        "{e}"
    );
    assert_eq!(host_pool.used(), 0, "the refused offload freed its host copy");
    // A shrink over it is queued: still charged until deregistered.
    region.shrink_to(4 * MIB, Vec::new()).unwrap();
    m.manager.poll();
    assert_eq!(m.pool.used(), 8 * MIB, "6 MiB + the privatised 2 MiB: the tail stays charged");
    assert!(reg.is_registered());
    reg.deregister().map_err(|(_, e)| e).unwrap();
    m.manager.poll();
    assert_eq!(m.pool.used(), 6 * MIB, "the shrink ran once deregistered");

    // A release waits too: the region is freed only after deregistration.
    let reg = ucx.register_region(&m.context, &mut region, 2 * MIB, MIB, Access::ReadWrite).unwrap();
    drop(region);
    m.manager.poll();
    assert!(m.pool.used() > 2 * MIB, "the registered region is still charged");
    drop(reg);
    drop(prefix);
    m.manager.poll();
    assert_eq!(m.pool.used(), 0);
    sync.stream_destroy(stream).unwrap();
}

#[test]
fn an_allocation_is_pinned_and_a_loss_deregisters() {
    let Some(()) = ucx_or_skip("an_allocation_is_pinned_and_a_loss_deregisters") else { return };
    let m = memory(64 * MIB);
    let ucx = ucx(SHM);
    let mut a = m.kv.allocate(MIB, 4096).unwrap();
    let reg = ucx.register_allocation(&m.context, &mut a, Access::ReadWrite).unwrap();
    assert_eq!((reg.addr(), reg.len()), (a.addr(), MIB));
    drop(a);
    m.manager.poll();
    assert_eq!(m.pool.used(), MIB, "freed only after deregistration");
    drop(reg);
    m.manager.poll();
    assert_eq!(m.pool.used(), 0);

    // A part pins the whole allocation; bad parts are refused.
    let mut a = m.kv.allocate(MIB, 4096).unwrap();
    for (off, len) in [(0, 0), (MIB, 1), (1, u64::MAX)] {
        let e = ucx.register_allocation_range(&m.context, &mut a, off, len, Access::Read).err().unwrap();
        assert!(e.to_string().contains("not inside the allocation"), "{e}");
    }
    let reg = ucx.register_allocation_range(&m.context, &mut a, MIB - 4096, 4096, Access::ReadWrite).unwrap();
    assert_eq!((reg.addr(), reg.len()), (a.addr() + MIB - 4096, 4096));
    drop(a);
    m.manager.poll();
    assert_eq!(m.pool.used(), MIB, "a part's registration keeps the allocation");
    drop(reg);
    m.manager.poll();
    assert_eq!(m.pool.used(), 0);

    // A loss of the context deregisters.
    let mut region = m.kv.reserve_virtual(16 * MIB).unwrap();
    region.grow_to(MIB, |_| Ok::<(), String>(())).unwrap();
    let reg = ucx.register_region(&m.context, &mut region, 0, MIB, Access::ReadWrite).unwrap();
    assert!(reg.is_registered());
    m.context.declare_lost("test");
    assert!(!reg.is_registered(), "the loss deregistered the range");
    let e = ucx.register_region(&m.context, &mut region, 0, MIB, Access::Read).err().unwrap();
    assert!(e.to_string().contains("lost region"), "{e}");
    drop(reg);
    drop(region);
}

#[test]
fn a_grow_registers_the_new_part_and_each_part_is_pinned() {
    let Some(()) = ucx_or_skip("a_grow_registers_the_new_part_and_each_part_is_pinned") else { return };
    let m = memory(64 * MIB);
    let ucx = ucx(SHM);
    let mut region = m.kv.reserve_virtual(64 * MIB).unwrap();
    let mut g =
        memplug_ucx::GrowingRegistration::new(&ucx, &m.context, &mut region, 0, Access::ReadWrite).unwrap();
    assert!(g.parts().is_empty(), "nothing committed yet");
    region.grow_to(2 * MIB, |_| Ok::<(), String>(())).unwrap();
    let p = g.extend(&mut region).unwrap().unwrap();
    assert_eq!((p.addr(), p.len()), (region.addr(), 2 * MIB));
    assert!(g.extend(&mut region).unwrap().is_none(), "no growth, no part");
    region.grow_to(3 * MIB, |_| Ok::<(), String>(())).unwrap();
    let p = g.extend(&mut region).unwrap().unwrap();
    assert_eq!((p.addr(), p.len()), (region.addr() + 2 * MIB, MIB));
    assert_eq!((g.from(), g.end(), g.parts().len()), (0, 3 * MIB, 2));
    // Both parts are pinned: a shrink to 1 MiB keeps all 3 MiB charged.
    region.shrink_to(MIB, Vec::new()).unwrap();
    m.manager.poll();
    assert_eq!(m.pool.used(), 3 * MIB);
    g.deregister().unwrap();
    assert_eq!((g.end(), g.parts().len()), (0, 0));
    m.manager.poll();
    assert_eq!(m.pool.used(), MIB);
}
