//! Offload and restore at the same address, and copy-on-write of part of
//! a shared prefix, on the reference CPU plugin (real mmap/memfd memory,
//! its stream workers doing the ABI 1.3 copies).

mod common;

use common::*;
use memplug_host::governor::{AllocationClass, PressureTicket, Priority};
use memplug_host::{BindingError, BindingSpec, MemoryBinding, Region, Residence, SharedFence, Status};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

fn host_binding(rig: &Rig, capacity: u64) -> MemoryBinding {
    let pool = rig.manager.create_pool("host", capacity).unwrap();
    rig.manager.bind(&rig.context, &pool, BindingSpec::new(AllocationClass::Other)).unwrap()
}

fn granule(rig: &Rig) -> u64 {
    rig.mechanism().properties().granularity
}

/// Writes a pattern unique to `seed` over `len` bytes at `addr`.
fn fill(addr: u64, len: u64, seed: u8) {
    // SAFETY: committed, writable CPU memory of the test's region.
    let bytes = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len as usize) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
}

fn holds(addr: u64, len: u64, seed: u8) -> bool {
    // SAFETY: readable CPU memory of the test's region.
    let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
    bytes.iter().enumerate().all(|(i, b)| *b == (i as u8).wrapping_mul(31).wrapping_add(seed))
}

/// A region of `granules` granules with `committed` of them committed.
fn committed_region(rig: &Rig, granules: u64, committed: u64) -> Region {
    let g = granule(rig);
    let mut r = rig.binding.reserve_virtual(granules * g).unwrap();
    r.grow_to(committed * g, |_| Ok::<(), ()>(())).unwrap();
    r
}

/// After everything was dropped: the queue drained, every pool at zero,
/// and (with the stream gone) nothing alive in the plugin.
fn ends_exact(rig: &Rig, others: &[&Arc<memplug_host::governor::Pool>], stream: CpuStream) {
    rig.manager.poll();
    assert_eq!(rig.pool.used(), 0);
    for p in others {
        assert_eq!(p.used(), 0, "pool {}", p.name());
    }
    drop(stream);
    assert_eq!(live(rig.mechanism()), [0; 5]);
}

fn wait(f: &SharedFence) {
    assert!(f.wait(WAIT).unwrap(), "fence {} did not complete", f.describe());
}

#[test]
fn offload_and_restore_keep_the_address_and_the_bytes_and_move_the_charge() {
    let rig = Rig::cpu("offload-roundtrip", 64 * MIB);
    let host = host_binding(&rig, 64 * MIB);
    let stream = CpuStream::new(rig.mechanism());
    let g = granule(&rig);
    let mut region = committed_region(&rig, 64, 5);
    let base = region.addr();
    fill(base, 5 * g, 7);

    let report = region.offload_to(&host, stream.stream(), WAIT).unwrap();
    assert_eq!((report.released, report.kept), (5 * g, 0));
    assert_eq!(rig.pool.used(), 0, "the device bytes are refunded");
    assert_eq!(host.pool().used(), 5 * g, "the host copy is charged to the host pool");
    let Residence::Host { addr, bytes } = region.residence() else { panic!("not offloaded") };
    assert_eq!(bytes, 5 * g);
    assert!(holds(addr, 5 * g, 7), "the host copy holds the bytes");
    assert!(region.view().is_offloaded());
    // The device range is really decommitted: the plugin refuses to copy
    // from it now.
    let probe = host.allocate(g, 64).unwrap();
    // SAFETY: the destination is a live allocation; the source is refused.
    let e =
        unsafe { rig.mechanism().sync().unwrap().copy(stream.stream(), probe.addr(), base, g) }.unwrap_err();
    assert_eq!(e.status, Status::OutOfRange, "{e}");
    drop(probe);
    rig.manager.poll();

    // Nothing that would touch the device range is allowed meanwhile.
    for e in [
        region.grow_to(8 * g, |_| Ok::<(), ()>(())).map_err(|e| e.to_string()).unwrap_err(),
        region.shrink_to(g, Vec::new()).unwrap_err().to_string(),
        region.offload_to(&host, stream.stream(), WAIT).unwrap_err().to_string(),
    ] {
        assert!(e.contains("offloaded"), "{e}");
    }

    wait(&region.restore(stream.stream()).unwrap());
    assert_eq!(region.addr(), base, "restored at the same address");
    assert_eq!(region.residence(), Residence::Device);
    assert!(holds(base, 5 * g, 7), "the bytes came back");
    assert_eq!(rig.pool.used(), 5 * g);
    rig.manager.poll();
    assert_eq!(host.pool().used(), 0, "the host copy is freed behind the restore's fence");
    assert!(matches!(region.restore(stream.stream()), Err(BindingError::State(_))));

    // The region works as before, and goes away exactly.
    region.grow_to(6 * g, |_| Ok::<(), ()>(())).unwrap();
    drop(region);
    ends_exact(&rig, &[host.pool()], stream);
}

#[test]
fn an_offloaded_region_dropped_frees_its_host_copy() {
    let rig = Rig::cpu("offload-drop", 64 * MIB);
    let host = host_binding(&rig, 64 * MIB);
    let stream = CpuStream::new(rig.mechanism());
    let mut region = committed_region(&rig, 8, 3);
    region.offload_to(&host, stream.stream(), WAIT).unwrap();
    drop(region);
    ends_exact(&rig, &[host.pool()], stream);
}

#[test]
fn a_host_pool_without_room_refuses_the_offload_with_nothing_changed() {
    let rig = Rig::cpu("offload-full", 64 * MIB);
    let g = granule(&rig);
    let host = host_binding(&rig, g);
    let stream = CpuStream::new(rig.mechanism());
    let mut region = committed_region(&rig, 8, 3);
    fill(region.addr(), 3 * g, 1);
    let e = region.offload_to(&host, stream.stream(), WAIT).unwrap_err();
    assert!(matches!(e, BindingError::Budget(_)), "{e}");
    assert_eq!(region.residence(), Residence::Device);
    assert_eq!((rig.pool.used(), host.pool().used()), (3 * g, 0));
    assert!(holds(region.addr(), 3 * g, 1));
}

#[test]
fn offload_waits_for_work_on_the_region_and_refuses_when_it_does_not_finish() {
    let rig = Rig::cpu("offload-busy", 64 * MIB);
    let host = host_binding(&rig, 64 * MIB);
    let stream = CpuStream::new(rig.mechanism());
    let g = granule(&rig);
    let mut region = committed_region(&rig, 8, 2);
    let gate = Gate::new("step");
    region.used_by(gate.fence.clone());
    let e = region.offload_to(&host, stream.stream(), Duration::from_millis(50)).unwrap_err();
    assert!(e.to_string().contains("did not complete"), "{e}");
    assert_eq!(region.residence(), Residence::Device);
    assert_eq!((rig.pool.used(), host.pool().used()), (2 * g, 0));
    gate.open();
    assert_eq!(region.offload_to(&host, stream.stream(), WAIT).unwrap().released, 2 * g);
}

#[test]
fn a_holder_answers_pressure_by_offloading_with_the_bytes_decommitted() {
    let rig = Rig::cpu("offload-pressure", 64 * MIB);
    let g = granule(&rig);
    let host = host_binding(&rig, 64 * MIB);
    let device = rig.manager.create_pool("device", 8 * g).unwrap();
    let stream = Arc::new(CpuStream::new(rig.mechanism()));
    let slot: Arc<Mutex<Option<Region>>> = Arc::new(Mutex::new(None));
    let answered = Arc::new(Mutex::new(Vec::new()));
    let (s, st, a) = (slot.clone(), stream.clone(), answered.clone());
    let holder = device.register_holder("weights", Priority(1), move |_: &PressureTicket| {
        let mut guard = s.lock().unwrap();
        let Some(r) = guard.as_mut() else { return 0 };
        let released = r.offload_to(&host, st.stream(), WAIT).map_or(0, |rep| rep.released);
        a.lock().unwrap().push(released);
        released
    });
    let weights = rig
        .manager
        .bind(&rig.context, &device, BindingSpec::new(AllocationClass::Weights).holder(holder.id()))
        .unwrap();
    let mut shard = weights.reserve_virtual(8 * g).unwrap();
    shard.grow_to(6 * g, |_| Ok::<(), ()>(())).unwrap();
    let addr = shard.addr();
    fill(addr, 6 * g, 3);
    *slot.lock().unwrap() = Some(shard);

    let acts =
        rig.manager.bind(&rig.context, &device, BindingSpec::new(AllocationClass::Activations)).unwrap();
    let activations = acts.allocate(4 * g, 64).unwrap();
    assert_eq!(*answered.lock().unwrap(), vec![6 * g], "the answer is the bytes decommitted");
    assert_eq!(device.used(), 4 * g);
    drop(activations);
    let mut guard = slot.lock().unwrap();
    let r = guard.as_mut().unwrap();
    let fence = r.restore(stream.stream()).unwrap();
    wait(&fence);
    assert_eq!(r.addr(), addr);
    assert!(holds(addr, 6 * g, 3), "the shard came back intact");
    assert_eq!(device.used(), 6 * g);
}

#[test]
fn plain_allocations_say_they_cannot_be_offloaded() {
    let rig = Rig::cpu("offload-plain", 64 * MIB);
    let host = host_binding(&rig, 64 * MIB);
    let stream = CpuStream::new(rig.mechanism());
    let a = rig.binding.allocate(4096, 64).unwrap();
    let e = a.offload_to(&host, stream.stream()).unwrap_err();
    assert!(matches!(e, BindingError::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("same address"), "{e}");
}

/// Two regions map one prefix; `a` privatises its last granule.
fn two_readers(rig: &Rig, granules: u64) -> (Arc<memplug_host::SharedPrefix>, Region, Region) {
    let g = granule(rig);
    let prefix = rig
        .binding
        .create_shared(granules * g, |view| {
            fill(view.addr, view.len, 9);
        })
        .unwrap();
    let (mut a, mut b) =
        (rig.binding.reserve_virtual(16 * g).unwrap(), rig.binding.reserve_virtual(16 * g).unwrap());
    a.map_prefix(&prefix).unwrap();
    b.map_prefix(&prefix).unwrap();
    (prefix, a, b)
}

#[test]
fn privatising_the_last_block_gives_one_region_its_own_copy() {
    let rig = Rig::cpu("cow-last-block", 64 * MIB);
    let stream = CpuStream::new(rig.mechanism());
    let g = granule(&rig);
    let (prefix, mut a, b) = two_readers(&rig, 4);
    assert_eq!(rig.pool.used(), 4 * g);
    wait(&a.privatise(3 * g, g, stream.stream(), WAIT).unwrap());
    assert_eq!(rig.pool.used(), 5 * g, "the prefix once, the private copy once");
    assert!(holds(a.addr(), 4 * g, 9), "the private copy holds the prefix's bytes");
    // Writing the private block changes only a's copy.
    fill(a.addr() + 3 * g, g, 42);
    assert!(holds(a.addr() + 3 * g, g, 42));
    assert!(holds(b.addr(), 4 * g, 9), "the other region still reads the shared bytes");
    assert!(holds(a.addr(), 3 * g, 9), "the rest of a's prefix is still shared");
    assert!(a.prefix_is_read_only());

    let Err(e) = a.privatise(3 * g, g, stream.stream(), WAIT) else { panic!("privatised twice") };
    assert!(e.to_string().contains("already private"), "{e}");
    for (o, l) in [(1, g), (0, 0), (4 * g, g), (2 * g, 3 * g)] {
        assert!(matches!(a.privatise(o, l, stream.stream(), WAIT), Err(BindingError::Invalid(_))), "{o} {l}");
    }
    drop((a, b, prefix));
    ends_exact(&rig, &[], stream);
}

#[test]
fn privatising_a_middle_block_keeps_both_sides_shared() {
    let rig = Rig::cpu("cow-middle", 64 * MIB);
    let stream = CpuStream::new(rig.mechanism());
    let g = granule(&rig);
    let (prefix, mut a, b) = two_readers(&rig, 5);
    wait(&a.privatise(2 * g, g, stream.stream(), WAIT).unwrap());
    wait(&a.privatise(0, g, stream.stream(), WAIT).unwrap());
    assert_eq!(rig.pool.used(), 7 * g);
    fill(a.addr() + 2 * g, g, 50);
    fill(a.addr(), g, 51);
    // The shared pieces still read the prefix (offsets keep the pattern).
    // SAFETY: mapped prefix memory.
    let shared = |r: &Region, o: u64| {
        unsafe { std::slice::from_raw_parts((r.addr() + o) as *const u8, g as usize) }.to_vec()
    };
    assert_eq!(shared(&a, g), shared(&b, g));
    assert_eq!(shared(&a, 3 * g), shared(&b, 3 * g));
    assert_eq!(shared(&a, 4 * g), shared(&b, 4 * g));
    assert_ne!(shared(&a, 2 * g), shared(&b, 2 * g));
    assert!(holds(b.addr(), 5 * g, 9));
    drop((a, b, prefix));
    ends_exact(&rig, &[], stream);
}

#[test]
fn a_privatised_prefix_block_offloads_and_restores_with_the_private_part() {
    let rig = Rig::cpu("cow-offload", 64 * MIB);
    let host = host_binding(&rig, 64 * MIB);
    let stream = CpuStream::new(rig.mechanism());
    let g = granule(&rig);
    let (prefix, mut a, b) = two_readers(&rig, 3);
    wait(&a.privatise(2 * g, g, stream.stream(), WAIT).unwrap());
    a.grow_to(5 * g, |_| Ok::<(), ()>(())).unwrap();
    fill(a.addr() + 2 * g, 3 * g, 60);
    let report = a.offload_to(&host, stream.stream(), WAIT).unwrap();
    assert_eq!(report.released, 3 * g);
    assert_eq!(rig.pool.used(), 3 * g, "only the shared prefix stays charged");
    assert!(holds(b.addr(), 3 * g, 9));
    wait(&a.restore(stream.stream()).unwrap());
    assert!(holds(a.addr() + 2 * g, 3 * g, 60));
    assert!(holds(a.addr(), 2 * g, 9));
    assert_eq!(rig.pool.used(), 6 * g);
    drop((a, b, prefix));
    ends_exact(&rig, &[host.pool()], stream);
}

#[test]
fn privatise_without_a_prefix_is_refused() {
    let rig = Rig::cpu("cow-refusals", 64 * MIB);
    let stream = CpuStream::new(rig.mechanism());
    let g = granule(&rig);
    let mut r = rig.binding.reserve_virtual(4 * g).unwrap();
    let Err(e) = r.privatise(0, g, stream.stream(), WAIT) else { panic!("privatised without a prefix") };
    assert!(matches!(e, BindingError::State(_)) && e.to_string().contains("no shared prefix"), "{e}");
    assert_eq!(rig.pool.used(), 0);
}

#[test]
fn the_default_offload_target_of_cpu_memory_is_cpu_memory() {
    let rig = Rig::cpu("offload-target", 64 * MIB);
    let target = rig.manager.offload_context(&rig.context).unwrap();
    assert_eq!(target.mechanism().device().0, CPU0);
}
