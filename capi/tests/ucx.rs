//! The C API's UCX calls (`memplug_host_ucx_*`, feature `ucx`) refuse bad
//! input with a status and leave out-parameters alone, in one process:
//! settings that are not NAME=VALUE, NULL outs, forged and other-kind
//! handles, descriptors that are no stream socket, a registration's
//! residency (a pinned region cannot shrink under it; deregistered, it
//! can), zero handles as no-ops. The two-process transfers are
//! `c-examples/tests/ucx.{c,cpp}` (ctest `c_ucx`, `cpp_ucx`). Skipped,
//! saying why, without UCX.
#![cfg(feature = "ucx")]

mod common;

use common::{last_error, ok, plugin_path};
use memplug_host_capi::*;
use std::os::fd::AsRawFd;
use std::ptr::null_mut;

const MIB: u64 = 1 << 20;

#[test]
fn bad_input_is_refused_and_a_registration_pins_its_range() {
    if memplug_host_ucx_available() != MemplugHostStatus::Ok {
        eprintln!("skipped: UCX is not usable here: {}", last_error());
        return;
    }
    let mut u = MemplugHostUcx::default();
    let mut untouched = MemplugHostUcx { id: 42 };
    assert_eq!(
        unsafe { memplug_host_ucx_create(c"TLS".as_ptr(), &mut untouched) },
        MemplugHostStatus::InvalidArgument
    );
    assert!(last_error().contains("NAME=VALUE"), "{}", last_error());
    assert_eq!(untouched.id, 42);
    assert_eq!(
        unsafe { memplug_host_ucx_create(std::ptr::null(), null_mut()) },
        MemplugHostStatus::NullArgument
    );
    ok(unsafe { memplug_host_ucx_create(c"TLS=tcp;NET_DEVICES=lo".as_ptr(), &mut u) });

    let (mut m, mut mech, mut pool, mut b, mut r) = Default::default();
    ok(unsafe { memplug_host_manager_create(&mut m) });
    ok(unsafe { memplug_host_manager_load_plugin(m, plugin_path().as_ptr()) });
    ok(unsafe { memplug_host_manager_find_mechanism(m, c"memplug-cpu/cpu".as_ptr(), &mut mech) });
    ok(unsafe { memplug_host_pool_create(m, c"ucx".as_ptr(), 8 * MIB, &mut pool) });
    ok(unsafe { memplug_host_binding_create(m, mech, pool, std::ptr::null(), &mut b) });
    ok(unsafe { memplug_host_region_reserve(b, 4 * MIB, &mut r) });
    ok(unsafe { memplug_host_region_grow(r, 2 * MIB, None, null_mut()) });

    // A pool handle is not a UCX context.
    let mut reg = MemplugHostUcxRegistration { id: 7 };
    let as_ucx = MemplugHostUcx { id: pool.id };
    let read = MEMPLUG_HOST_UCX_ACCESS_READ;
    assert_eq!(
        unsafe { memplug_host_ucx_register_region(as_ucx, mech, r, 0, MIB, read, &mut reg) },
        MemplugHostStatus::InvalidHandle
    );
    assert_eq!(reg.id, 7);

    // Registered: the range is pinned, so a shrink over it is queued and
    // the bytes stay charged; deregistered, the shrink goes through.
    ok(unsafe { memplug_host_ucx_register_region(u, mech, r, MIB, MIB, read, &mut reg) });
    ok(unsafe { memplug_host_region_shrink(r, MIB, std::ptr::null(), 0) });
    ok(unsafe { memplug_host_manager_poll(m, null_mut()) });
    assert_eq!(used(pool), 2 * MIB, "a registered range was decommitted");
    ok(memplug_host_ucx_deregister(reg));
    assert_eq!(memplug_host_ucx_deregister(reg), MemplugHostStatus::StaleHandle);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while used(pool) != MIB && std::time::Instant::now() < deadline {
        ok(unsafe { memplug_host_manager_poll(m, null_mut()) });
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(used(pool), MIB, "the shrink did not run once deregistered");

    // Descriptors UCX cannot use, refused before any handshake.
    let mut peer = MemplugHostUcxPeer { id: 9 };
    let file = std::fs::File::open("/dev/null").unwrap();
    let none = MEMPLUG_HOST_UCX_ERRORS_NONE;
    assert_eq!(
        unsafe { memplug_host_ucx_peer_connect(u, file.as_raw_fd(), none, 1_000_000, &mut peer) },
        MemplugHostStatus::InvalidArgument
    );
    assert!(last_error().contains("not a socket"), "{}", last_error());
    let (udp, _other) = std::os::unix::net::UnixDatagram::pair().unwrap();
    assert_eq!(
        unsafe { memplug_host_ucx_peer_connect(u, udp.as_raw_fd(), none, 1_000_000, &mut peer) },
        MemplugHostStatus::InvalidArgument
    );
    assert!(last_error().contains("not a stream socket"), "{}", last_error());
    assert_eq!(
        unsafe { memplug_host_ucx_peer_connect(u, 0, 7, 0, &mut peer) },
        MemplugHostStatus::InvalidArgument
    );
    assert_eq!(peer.id, 9);

    // Zero handles are no-ops; waits on nothing are refused.
    ok(memplug_host_ucx_deregister(MemplugHostUcxRegistration::default()));
    ok(memplug_host_ucx_registration_release(MemplugHostUcxRegistration::default()));
    ok(memplug_host_ucx_peer_destroy(MemplugHostUcxPeer::default()));
    ok(memplug_host_ucx_transfer_release(MemplugHostUcxTransfer::default()));
    ok(memplug_host_ucx_destroy(MemplugHostUcx::default()));
    assert_eq!(
        memplug_host_ucx_transfer_wait(MemplugHostUcxTransfer::default(), 0),
        MemplugHostStatus::InvalidHandle
    );

    ok(memplug_host_ucx_destroy(u));
    assert_eq!(memplug_host_ucx_destroy(u), MemplugHostStatus::StaleHandle);
    ok(memplug_host_region_free(r));
    ok(memplug_host_binding_destroy(b));
    ok(memplug_host_pool_release(pool));
    ok(memplug_host_mechanism_release(mech));
    ok(memplug_host_manager_destroy(m));
}

fn used(pool: MemplugHostPool) -> u64 {
    let mut s = MemplugHostPoolStats {
        struct_size: std::mem::size_of::<MemplugHostPoolStats>() as u32,
        ..Default::default()
    };
    ok(unsafe { memplug_host_pool_stats(pool, &mut s) });
    s.used
}
