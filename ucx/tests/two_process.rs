//! Two real processes over UCX (TCP on loopback, and shared memory), each
//! with the CPU plugin dlopen'd and its own pool: one offers ranges of its
//! regions, the other reads and writes them. The child is this executable
//! re-run on its `child` test.

mod common;

use common::*;
use memplug_host::Region;
use memplug_ucx::{Access, Peer, Ucx, UcxError};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// The child's side of every scenario; an ordinary run does nothing here.
#[test]
fn child() {
    let Some((role, ucx, peer)) = child_side() else { return };
    match role.as_str() {
        "export" => export(ucx, peer),
        "revoke" => revoke(ucx, peer),
        "offer4" => offer(ucx, peer, 4 * MIB),
        "offer64" => offer(ucx, peer, 64 * MIB),
        "hold" => hold(peer),
        "stall" => stall(ucx, peer),
        r => panic!("unknown role {r}"),
    }
}

fn filled_region(m: &Memory, len: u64, seed: u8) -> Region {
    let mut region = m.kv.reserve_virtual(256 * MIB).unwrap();
    region.grow_to(len, |_| Ok::<(), String>(())).unwrap();
    // SAFETY: CPU memory, committed just now, used by this thread only.
    unsafe { fill(region.addr(), len, seed) };
    region
}

/// Offers 4 MiB; checks the range stays resident while the parent holds
/// it; checks the parent's write; deregisters after the release.
fn export(ucx: Ucx, mut peer: Peer) {
    let m = memory(64 * MIB);
    let mut region = filled_region(&m, 4 * MIB, 7);
    let reg = ucx.register_region(&m.context, &mut region, 0, 4 * MIB, Access::ReadWrite).unwrap();
    peer.offer(&reg, 1).unwrap();
    // Held by the peer: no deregistration.
    let (reg, e) = reg.deregister().unwrap_err();
    assert!(matches!(e, UcxError::Busy(_)), "{e}");
    // A shrink over the registered range is queued behind the pin: the
    // tail stays committed and charged, and cannot be grown back into.
    region.shrink_to(2 * MIB, Vec::new()).unwrap();
    m.manager.poll();
    assert_eq!(m.pool.used(), 4 * MIB);
    let e = region.grow_to(4 * MIB, |_| Ok::<(), String>(())).unwrap_err();
    assert!(e.to_string().contains("waits for its decommit"), "{e}");
    // Serve the peer's reads and writes until it gives the range back.
    let deadline = Instant::now() + TIMEOUT;
    while peer.exported() > 0 {
        assert!(Instant::now() < deadline, "the parent did not release the range");
        ucx.progress();
        peer.pump().unwrap();
    }
    // The parent wrote 64 KiB of 0xAB at +1 MiB, flushed before its release.
    // SAFETY: committed CPU memory of the region.
    let wrote = unsafe { std::slice::from_raw_parts((region.addr() + MIB) as *const u8, 64 << 10) };
    assert!(wrote.iter().all(|&b| b == 0xAB), "the parent's put did not land");
    // SAFETY: as above.
    assert!(unsafe { holds(region.addr(), MIB, 7, 0) });
    reg.deregister().map_err(|(_, e)| e).unwrap();
    m.manager.poll();
    assert_eq!(m.pool.used(), 2 * MIB, "the queued shrink ran once deregistered");
    peer.serve(TIMEOUT).unwrap();
}

/// Offers two ranges (read-only and writable), revokes the second while the
/// parent uses it, deregisters it, then serves until the parent leaves.
fn revoke(ucx: Ucx, mut peer: Peer) {
    let m = memory(64 * MIB);
    let mut region = filled_region(&m, 2 * MIB, 9);
    let ro = ucx.register_region(&m.context, &mut region, 0, MIB, Access::Read).unwrap();
    let rw = ucx.register_region(&m.context, &mut region, MIB, MIB, Access::ReadWrite).unwrap();
    peer.offer(&ro, 1).unwrap();
    let id = peer.offer(&rw, 2).unwrap();
    // Let the parent use it for a moment first.
    let _ = peer.serve(Duration::from_millis(200));
    peer.revoke(id, TIMEOUT).unwrap();
    rw.deregister().map_err(|(_, e)| e).unwrap();
    peer.serve(TIMEOUT).unwrap();
    drop(ro);
}

/// Offers `len` bytes and serves until the parent leaves (or kills it).
fn offer(ucx: Ucx, mut peer: Peer, len: u64) {
    let m = memory(len + MIB);
    let mut region = filled_region(&m, len, 5);
    let reg = ucx.register_region(&m.context, &mut region, 0, len, Access::ReadWrite).unwrap();
    peer.offer(&reg, 1).unwrap();
    peer.serve(Duration::from_secs(30)).unwrap();
}

/// Offers 4 MiB, then does not progress for a second (a get through its
/// worker stalls), then serves until the parent's release arrives.
fn stall(ucx: Ucx, mut peer: Peer) {
    let m = memory(16 * MIB);
    let mut region = filled_region(&m, 4 * MIB, 5);
    let reg = ucx.register_region(&m.context, &mut region, 0, 4 * MIB, Access::Read).unwrap();
    peer.offer(&reg, 1).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let deadline = Instant::now() + TIMEOUT;
    while peer.exported() > 0 {
        assert!(Instant::now() < deadline, "the release never came");
        ucx.progress();
        peer.pump().unwrap();
    }
    reg.deregister().map_err(|(_, e)| e).unwrap();
    peer.serve(TIMEOUT).unwrap();
}

/// Takes the parent's offer, reads from it, and waits to be killed.
fn hold(mut peer: Peer) {
    let m = memory(16 * MIB);
    let r = peer.next_offer(TIMEOUT).unwrap();
    let mut region = m.kv.reserve_virtual(16 * MIB).unwrap();
    peer.pull_into_region(&mut region, 0, &r, 0, MIB).unwrap().wait(TIMEOUT).unwrap();
    println!("holding");
    std::thread::sleep(Duration::from_secs(30));
}

fn get_put_and_residency(test: &str, net: Net) {
    let Some(()) = ucx_or_skip(test) else { return };
    let m = memory(64 * MIB);
    let mut c = spawn("export", net);
    let r = c.peer.next_offer(TIMEOUT).unwrap();
    assert_eq!((r.len, r.writable, r.tag), (4 * MIB, true, 1));
    let mut region = m.kv.reserve_virtual(64 * MIB).unwrap();
    // The pull grows the region first: the pool is charged before any byte.
    let t = c.peer.pull_into_region(&mut region, 0, &r, 0, 4 * MIB).unwrap();
    t.wait(TIMEOUT).unwrap();
    assert_eq!((region.len(), m.pool.used()), (4 * MIB, 4 * MIB));
    // SAFETY: the region's committed CPU memory; the transfer completed.
    assert!(unsafe { holds(region.addr(), 4 * MIB, 7, 0) }, "pulled bytes differ");
    // SAFETY: as above.
    unsafe { std::ptr::write_bytes(region.addr() as *mut u8, 0xAB, 64 << 10) };
    let t = c.peer.push_from_region(&mut region, 0, &r, MIB, 64 << 10).unwrap();
    t.wait(TIMEOUT).unwrap();
    // A shrink over a range a pull is still writing is ordered behind the
    // transfer: the range stays committed and charged until it completes.
    let t = c.peer.pull_into_region(&mut region, 0, &r, 0, 4 * MIB).unwrap();
    let pending = !t.is_complete();
    region.shrink_to(0, Vec::new()).unwrap();
    m.manager.poll();
    if pending && !t.is_complete() {
        assert_eq!(m.pool.used(), 4 * MIB, "decommitted under a transfer");
    }
    t.wait(TIMEOUT).unwrap();
    m.manager.poll();
    assert_eq!((region.len(), m.pool.used()), (0, 0));
    c.peer.release(&r, TIMEOUT).unwrap();
    // The key is gone with the release.
    let e = c.peer.pull_into_region(&mut region, 0, &r, 0, 4096).unwrap_err();
    assert!(matches!(e, UcxError::Revoked { .. }) && e.to_string().contains("released"), "{e}");
    c.join();
    drop(region);
    m.manager.poll();
    assert_eq!(m.pool.used(), 0);
}

#[test]
fn get_put_and_residency_over_tcp() {
    get_put_and_residency("get_put_and_residency_over_tcp", TCP);
}

#[test]
fn get_put_and_residency_over_shared_memory() {
    get_put_and_residency("get_put_and_residency_over_shared_memory", SHM);
}

#[test]
fn revoked_ranges_and_bad_requests_are_refused() {
    let Some(()) = ucx_or_skip("revoked_ranges_and_bad_requests_are_refused") else { return };
    let m = memory(16 * MIB);
    let mut c = spawn("revoke", SHM);
    let ro = c.peer.next_offer(TIMEOUT).unwrap();
    let rw = c.peer.next_offer(TIMEOUT).unwrap();
    assert_eq!((ro.writable, rw.writable), (false, true));
    let mut region = m.kv.reserve_virtual(16 * MIB).unwrap();
    // Bad requests: nothing issued, nothing charged.
    let e = c.peer.push_from_region(&mut region, 0, &ro, 0, 4096).unwrap_err();
    assert!(matches!(e, UcxError::Invalid(_)), "{e}");
    let e = c.peer.pull_into_region(&mut region, 0, &ro, MIB - 4096, 8192).unwrap_err();
    assert!(e.to_string().contains("not inside remote range"), "{e}");
    let e = c.peer.pull_into_region(&mut region, 0, &ro, 0, 0).unwrap_err();
    assert!(e.to_string().contains("0 bytes"), "{e}");
    let e = c.peer.pull_into_region(&mut region, 32 * MIB, &ro, 0, 4096).unwrap_err();
    assert!(e.to_string().contains("past the region's reservation"), "{e}");
    assert_eq!((region.len(), m.pool.used()), (0, 0));
    // Use the writable range until its owner revokes it.
    let deadline = Instant::now() + TIMEOUT;
    let e = loop {
        assert!(Instant::now() < deadline, "the revoke never arrived");
        match c.peer.pull_into_region(&mut region, 0, &rw, 0, MIB) {
            Ok(t) => {
                t.wait(TIMEOUT).unwrap();
                // SAFETY: committed CPU memory; the transfer completed.
                assert!(unsafe { holds(region.addr(), MIB, 9, MIB) });
            }
            Err(e) => break e,
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(matches!(e, UcxError::Revoked { .. }) && e.to_string().contains("revoked by its owner"), "{e}");
    // The read-only range still works.
    c.peer.pull_into_region(&mut region, 0, &ro, 0, MIB).unwrap().wait(TIMEOUT).unwrap();
    // SAFETY: as above.
    assert!(unsafe { holds(region.addr(), MIB, 9, 0) });
    c.peer.release(&ro, TIMEOUT).unwrap();
    c.join();
}

#[test]
fn the_receiver_is_charged_before_any_byte_moves() {
    let Some(()) = ucx_or_skip("the_receiver_is_charged_before_any_byte_moves") else { return };
    let m = memory(MIB);
    let mut c = spawn("offer4", SHM);
    let r = c.peer.next_offer(TIMEOUT).unwrap();
    let mut region = m.kv.reserve_virtual(16 * MIB).unwrap();
    let e = c.peer.pull_into_region(&mut region, 0, &r, 0, 4 * MIB).unwrap_err();
    assert!(e.is_out_of_budget(), "{e}");
    assert_eq!((region.len(), m.pool.used()), (0, 0), "nothing charged, nothing transferred");
    // What fits moves.
    c.peer.pull_into_region(&mut region, 0, &r, 0, MIB).unwrap().wait(TIMEOUT).unwrap();
    assert_eq!(m.pool.used(), MIB);
    // SAFETY: committed CPU memory; the transfer completed.
    assert!(unsafe { holds(region.addr(), MIB, 5, 0) });
    c.peer.release(&r, TIMEOUT).unwrap();
    c.join();
    drop(region);
    m.manager.poll();
    assert_eq!(m.pool.used(), 0);
}

#[test]
fn a_peer_killed_mid_transfer_is_a_clear_error_and_nothing_leaks() {
    let Some(()) = ucx_or_skip("a_peer_killed_mid_transfer_is_a_clear_error_and_nothing_leaks") else {
        return;
    };
    let m = memory(128 * MIB);
    let mut c = spawn("offer64", TCP);
    let r = c.peer.next_offer(TIMEOUT).unwrap();
    let mut region = m.kv.reserve_virtual(128 * MIB).unwrap();
    let t = c.peer.pull_into_region(&mut region, 0, &r, 0, 64 * MIB).unwrap();
    c.child.kill().unwrap();
    c.child.wait().unwrap();
    let e = t.wait(TIMEOUT).unwrap_err();
    assert!(matches!(e, UcxError::PeerLost(_) | UcxError::Timeout { .. }), "{e}");
    assert!(t.is_complete(), "a failed transfer is over: its fence frees");
    // The peer is known lost; nothing more is issued.
    let e = c.peer.pull_into_region(&mut region, 0, &r, 0, 4096).unwrap_err();
    assert!(matches!(e, UcxError::PeerLost(_)), "{e}");
    // The region (charged 64 MiB) is freed behind the failed transfer.
    assert_eq!(m.pool.used(), 64 * MIB);
    drop(region);
    let report = m.manager.drain(Duration::from_secs(2));
    assert!(report.stuck.is_none(), "{report:?}");
    assert_eq!(m.pool.used(), 0);
}

#[test]
fn a_holder_killed_gives_its_ranges_back_and_the_owner_ends_exact() {
    let Some(()) = ucx_or_skip("a_holder_killed_gives_its_ranges_back_and_the_owner_ends_exact") else {
        return;
    };
    let m = memory(16 * MIB);
    let mut c = spawn("hold", TCP);
    let mut region = m.kv.reserve_virtual(16 * MIB).unwrap();
    region.grow_to(4 * MIB, |_| Ok::<(), String>(())).unwrap();
    let reg = c.ucx.register_region(&m.context, &mut region, 0, 4 * MIB, Access::Read).unwrap();
    c.peer.offer(&reg, 3).unwrap();
    assert_eq!(reg.holders(), 1);
    // Serve its read for a moment, then kill it while it holds the key.
    assert!(matches!(c.peer.serve(Duration::from_millis(300)), Err(UcxError::Timeout { .. })));
    c.child.kill().unwrap();
    c.child.wait().unwrap();
    let why = c.peer.serve(TIMEOUT).unwrap();
    assert!(why.contains("closed") || why.contains("endpoint"), "{why}");
    assert_eq!((reg.holders(), c.peer.exported()), (0, 0), "the lost peer's hold is given back");
    reg.deregister().map_err(|(_, e)| e).unwrap();
    drop(region);
    m.manager.poll();
    assert_eq!(m.pool.used(), 0);
}

#[test]
fn a_region_dropped_mid_transfer_is_freed_by_the_reaper_behind_it() {
    let Some(()) = ucx_or_skip("a_region_dropped_mid_transfer_is_freed_by_the_reaper_behind_it") else {
        return;
    };
    let m = memory(64 * MIB);
    m.manager.start_reaper(Duration::from_millis(1));
    let mut c = spawn("offer4", SHM);
    let r = c.peer.next_offer(TIMEOUT).unwrap();
    let mut region = m.kv.reserve_virtual(64 * MIB).unwrap();
    // Eight pulls in flight, nobody waiting: the region's release is queued
    // behind their fences, which the reaper's queries progress (from its
    // own thread, beside this one).
    let transfers: Vec<_> =
        (0..8).map(|i| c.peer.pull_into_region(&mut region, i * 4 * MIB, &r, 0, 4 * MIB).unwrap()).collect();
    assert_eq!(m.pool.used(), 32 * MIB);
    drop(region);
    let deadline = Instant::now() + TIMEOUT;
    while m.pool.used() != 0 {
        assert!(Instant::now() < deadline, "the region was not freed behind its transfers");
        std::thread::sleep(Duration::from_millis(2));
    }
    // Freed only once every transfer had completed.
    assert!(transfers.iter().all(|t| t.is_complete()));
    for t in transfers {
        t.wait(TIMEOUT).unwrap();
    }
    c.peer.release(&r, TIMEOUT).unwrap();
    c.join();
}

#[test]
fn a_release_waits_for_a_transfer_it_cannot_cancel() {
    let Some(()) = ucx_or_skip("a_release_waits_for_a_transfer_it_cannot_cancel") else { return };
    let m = memory(16 * MIB);
    let mut c = spawn("stall", SHM);
    let r = c.peer.next_offer(TIMEOUT).unwrap();
    let mut region = m.kv.reserve_virtual(16 * MIB).unwrap();
    let t = c.peer.pull_into_region(&mut region, 0, &r, 0, 4 * MIB).unwrap();
    // The owner does not progress: the get cannot complete, and without
    // peer-failure handling it cannot be cancelled either.
    let e = c.peer.release(&r, Duration::from_millis(100)).unwrap_err();
    assert!(matches!(e, UcxError::Busy(_)) && e.to_string().contains("still in flight"), "{e}");
    // No new transfer on a range being given back.
    let e = c.peer.pull_into_region(&mut region, 0, &r, 0, 4096).unwrap_err();
    assert!(matches!(e, UcxError::Revoked { .. }), "{e}");
    // Once the owner serves again the get completes, and the release goes
    // out (the owner waits for it before deregistering).
    t.wait(TIMEOUT).unwrap();
    // SAFETY: committed CPU memory; the transfer completed.
    assert!(unsafe { holds(region.addr(), 4 * MIB, 5, 0) });
    c.peer.pump().unwrap();
    c.join();
}

#[test]
fn allocations_pull_and_push_and_bad_ranges_are_refused() {
    let Some(()) = ucx_or_skip("allocations_pull_and_push_and_bad_ranges_are_refused") else { return };
    let m = memory(16 * MIB);
    let mut c = spawn("offer4", SHM);
    let r = c.peer.next_offer(TIMEOUT).unwrap();
    // The receiving side's charge is the allocation, made before any byte.
    let mut a = m.kv.allocate(2 * MIB, 4096).unwrap();
    c.peer.pull_into_allocation(&mut a, 0, &r, 0, MIB).unwrap().wait(TIMEOUT).unwrap();
    // SAFETY: the allocation's CPU memory; the transfer completed.
    assert!(unsafe { holds(a.addr(), MIB, 5, 0) });
    // SAFETY: as above.
    unsafe { std::ptr::write_bytes((a.addr() + MIB) as *mut u8, 0xCD, MIB as usize) };
    c.peer.push_from_allocation(&mut a, MIB, &r, 2 * MIB, MIB).unwrap().wait(TIMEOUT).unwrap();
    c.peer.pull_into_allocation(&mut a, 0, &r, 2 * MIB, MIB).unwrap().wait(TIMEOUT).unwrap();
    // SAFETY: as above.
    let back = unsafe { std::slice::from_raw_parts(a.addr() as *const u8, MIB as usize) };
    assert!(back.iter().all(|&b| b == 0xCD), "the pushed bytes did not come back");
    let e = c.peer.pull_into_allocation(&mut a, MIB + 1, &r, 0, MIB).unwrap_err();
    assert!(e.to_string().contains("not inside the allocation"), "{e}");
    let e = c.peer.push_from_allocation(&mut a, 0, &r, 4 * MIB - 4096, 8192).unwrap_err();
    assert!(e.to_string().contains("not inside remote range"), "{e}");
    // Freed behind a transfer still in flight: charged until it completes.
    let t = c.peer.pull_into_allocation(&mut a, 0, &r, 0, 2 * MIB).unwrap();
    drop(a);
    t.wait(TIMEOUT).unwrap();
    m.manager.poll();
    assert_eq!(m.pool.used(), 0);
    c.peer.release(&r, TIMEOUT).unwrap();
    c.join();
}
