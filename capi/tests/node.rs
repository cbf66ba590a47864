//! API 1.3, one budget across processes, from the Rust side of the C API
//! (the C and C++ programs `c-examples/tests/node.{c,cpp}` run it from C
//! under CMake; this runs in `cargo test`): an authority embedded through
//! the C API, a manager's pool joined to it, a grant past the held budget
//! leasing a chunk, the statistics and the books, the out-parameters left
//! alone on refusals, the wrong kind of node handle refused, a link
//! leaving and an authority stopping with the manager.

mod common;

use common::{last_error, ok, plugin_path};
use memplug_host_capi::*;
use std::ffi::CString;
use std::mem::size_of;
use std::ptr::{null, null_mut};

const MIB: u64 = 1 << 20;

fn stats(link: MemplugHostNodeLink) -> MemplugHostNodeLinkStats {
    let mut s = MemplugHostNodeLinkStats {
        struct_size: size_of::<MemplugHostNodeLinkStats>() as u32,
        ..Default::default()
    };
    ok(unsafe { memplug_host_node_link_stats(link, &mut s) });
    s
}

#[test]
fn a_pool_joined_through_the_c_api_leases_its_budget_and_the_books_agree() {
    let dir = std::env::temp_dir().join(format!("memplug-capi-node-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = CString::new(dir.join("n.sock").to_str().unwrap()).unwrap();
    let mut m = MemplugHostManager::default();
    ok(unsafe { memplug_host_manager_create(&mut m) });
    ok(unsafe { memplug_host_manager_load_plugin(m, plugin_path().as_ptr()) });
    let mut mech = MemplugHostMechanism::default();
    ok(unsafe { memplug_host_manager_mechanism(m, 0, &mut mech) });

    let cpu0 = CString::new("cpu0").unwrap();
    let caps = [MemplugHostNodeCapacity { device: cpu0.as_ptr(), capacity: 16 * MIB }];
    let ao = MemplugHostNodeAuthorityOptions {
        struct_size: size_of::<MemplugHostNodeAuthorityOptions>() as u32,
        chunk: MIB,
        rejoin_grace_ns: 1,
        ..Default::default()
    };
    let short = MemplugHostNodeAuthorityOptions { struct_size: 8, ..ao };
    let mut a = MemplugHostNodeAuthority::default();
    let s = unsafe {
        memplug_host_manager_start_node_authority(m, socket.as_ptr(), caps.as_ptr(), 1, &short, &mut a)
    };
    assert_eq!(s, MemplugHostStatus::InvalidArgument, "{}", last_error());
    assert_eq!(a.id, 0, "nothing written on a refusal");
    ok(unsafe {
        memplug_host_manager_start_node_authority(m, socket.as_ptr(), caps.as_ptr(), 1, &ao, &mut a)
    });

    let mut pool = MemplugHostPool::default();
    ok(unsafe { memplug_host_pool_create(m, cpu0.as_ptr(), 0, &mut pool) });
    let mut b = MemplugHostBinding::default();
    ok(unsafe { memplug_host_binding_create(m, mech, pool, null(), &mut b) });
    let dev = [MemplugHostNodeDevice { device: cpu0.as_ptr(), pool, priority: 0, classes: 0 }];
    let mut link = MemplugHostNodeLink::default();
    let s = unsafe { memplug_host_manager_join_node(m, socket.as_ptr(), null(), 1, null(), &mut link) };
    assert_eq!(s, MemplugHostStatus::NullArgument);
    assert_eq!(link.id, 0);
    ok(unsafe { memplug_host_manager_join_node(m, socket.as_ptr(), dev.as_ptr(), 1, null(), &mut link) });

    // A grant past the held budget leases a chunk; one inside it does not.
    let (mut x, mut y) = (MemplugHostAllocation::default(), MemplugHostAllocation::default());
    let mut addr = 0;
    ok(unsafe { memplug_host_allocate(b, 4096, 64, &mut x, &mut addr) });
    ok(unsafe { memplug_host_allocate(b, 4096, 64, &mut y, &mut addr) });
    let st = stats(link);
    assert_eq!((st.connected, st.chunk, st.held, st.leases_granted, st.bytes_leased), (1, MIB, MIB, 1, MIB));

    // The books, from the authority and over the link, agree.
    let mut buf = vec![0u8; 8192];
    let mut n = 0usize;
    ok(unsafe {
        memplug_host_node_authority_status(
            a,
            MEMPLUG_HOST_NODE_STATUS_JSON,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut n,
        )
    });
    let books = std::str::from_utf8(&buf[..n]).unwrap();
    assert!(
        books.contains(&format!("\"leased\":{MIB}")) && books.contains("\"books_exact\":true"),
        "{books}"
    );
    ok(unsafe {
        memplug_host_node_link_status(
            link,
            MEMPLUG_HOST_NODE_STATUS_PROMETHEUS,
            2_000_000_000,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut n,
        )
    });
    let text = std::str::from_utf8(&buf[..n]).unwrap();
    assert!(text.contains(&format!("memplug_node_leased_bytes{{device=\"cpu0\"}} {MIB}")), "{text}");

    // One kind of handle for both, each function naming the one it wants.
    let as_link = MemplugHostNodeLink { id: a.id };
    let mut st = MemplugHostNodeLinkStats { struct_size: 96, ..Default::default() };
    assert_eq!(unsafe { memplug_host_node_link_stats(as_link, &mut st) }, MemplugHostStatus::InvalidHandle);
    assert!(last_error().contains("not a node link"), "{}", last_error());
    assert_eq!(st.chunk, 0);
    assert_eq!(unsafe { memplug_host_node_link_stats(link, null_mut()) }, MemplugHostStatus::NullArgument);

    ok(memplug_host_allocation_free(x));
    ok(memplug_host_allocation_free(y));
    ok(memplug_host_node_link_leave(link));
    assert_eq!(memplug_host_node_link_leave(link), MemplugHostStatus::StaleHandle);
    ok(memplug_host_binding_destroy(b));
    ok(memplug_host_pool_release(pool));
    ok(memplug_host_mechanism_release(mech));
    // The authority goes with its manager.
    ok(memplug_host_manager_destroy(m));
    assert_eq!(memplug_host_node_authority_stop(a), MemplugHostStatus::StaleHandle);
    assert!(!dir.join("n.sock").exists(), "the socket file is removed when the authority stops");
    let _ = std::fs::remove_dir_all(&dir);
}

/// This process's effective user and group ids (what `SO_PEERCRED` gives
/// the authority), from `/proc/self/status`.
fn effective_ids() -> (u32, u32) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| -> u32 {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace().nth(2).unwrap().parse().unwrap()
    };
    (field("Uid:"), field("Gid:"))
}

fn link_last_error(link: MemplugHostNodeLink) -> String {
    let mut buf = vec![0u8; 4096];
    let mut n = 0usize;
    ok(unsafe { memplug_host_node_link_last_error(link, buf.as_mut_ptr().cast(), buf.len(), &mut n) });
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Quotas set from C (`MemplugHostNodeAuthorityOptions::quotas`): bad
/// lists are refused and write nothing; a member past its user's quota,
/// then one past its group's, is refused, and the refusal its link reads
/// names the quota that bound.
#[test]
fn quotas_from_c_bind_and_a_refusal_names_the_quota() {
    let dir = std::env::temp_dir().join(format!("memplug-capi-node-quota-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (uid, gid) = effective_ids();
    let mut m = MemplugHostManager::default();
    ok(unsafe { memplug_host_manager_create(&mut m) });
    ok(unsafe { memplug_host_manager_load_plugin(m, plugin_path().as_ptr()) });
    let mut mech = MemplugHostMechanism::default();
    ok(unsafe { memplug_host_manager_mechanism(m, 0, &mut mech) });
    let cpu0 = CString::new("cpu0").unwrap();
    let caps = [MemplugHostNodeCapacity { device: cpu0.as_ptr(), capacity: 16 * MIB }];
    let options = |quotas: &[MemplugHostNodeQuota]| MemplugHostNodeAuthorityOptions {
        struct_size: size_of::<MemplugHostNodeAuthorityOptions>() as u32,
        chunk: MIB,
        rejoin_grace_ns: 1,
        quotas: quotas.as_ptr(),
        quota_count: quotas.len(),
        ..Default::default()
    };
    let user = |id, bytes| MemplugHostNodeQuota { kind: MEMPLUG_HOST_NODE_QUOTA_USER, id, bytes };
    let group = |id, bytes| MemplugHostNodeQuota { kind: MEMPLUG_HOST_NODE_QUOTA_GROUP, id, bytes };

    // Refusals: nothing served, nothing written.
    let socket = CString::new(dir.join("u.sock").to_str().unwrap()).unwrap();
    let start = |o: &MemplugHostNodeAuthorityOptions, a: &mut MemplugHostNodeAuthority| unsafe {
        memplug_host_manager_start_node_authority(m, socket.as_ptr(), caps.as_ptr(), 1, o, a)
    };
    let mut a = MemplugHostNodeAuthority::default();
    let bad_kind = [MemplugHostNodeQuota { kind: 7, id: uid, bytes: MIB }];
    assert_eq!(start(&options(&bad_kind), &mut a), MemplugHostStatus::InvalidArgument);
    assert!(last_error().contains("kind 7"), "{}", last_error());
    let twice = [user(uid, MIB), group(uid, MIB), user(uid, 2 * MIB)];
    assert_eq!(start(&options(&twice), &mut a), MemplugHostStatus::InvalidArgument);
    assert!(last_error().contains(&format!("quotas[2]: user {uid} has a quota already")), "{}", last_error());
    let no_list = MemplugHostNodeAuthorityOptions { quotas: null(), quota_count: 1, ..options(&[]) };
    assert_eq!(start(&no_list, &mut a), MemplugHostStatus::NullArgument);
    assert_eq!(a.id, 0, "nothing written on a refusal");
    assert!(!dir.join("u.sock").exists(), "nothing served on a refusal");
    // A caller built before the quotas (32 bytes) is still read, without them.
    let first = MemplugHostNodeAuthorityOptions { struct_size: 32, ..options(&bad_kind) };
    ok(start(&first, &mut a));
    ok(memplug_host_node_authority_stop(a));

    // user quota 2 MiB, another user's group quota that does not apply.
    ok(start(&options(&[user(uid, 2 * MIB), group(gid.wrapping_add(1), MIB)]), &mut a));
    let refused = |what: &str, quota: String, socket: &CString| {
        let mut pool = MemplugHostPool::default();
        let name = CString::new(format!("cpu0-{what}")).unwrap();
        ok(unsafe { memplug_host_pool_create(m, name.as_ptr(), 0, &mut pool) });
        let mut b = MemplugHostBinding::default();
        ok(unsafe { memplug_host_binding_create(m, mech, pool, null(), &mut b) });
        let dev = [MemplugHostNodeDevice { device: cpu0.as_ptr(), pool, priority: 0, classes: 0 }];
        let mut link = MemplugHostNodeLink::default();
        ok(unsafe { memplug_host_manager_join_node(m, socket.as_ptr(), dev.as_ptr(), 1, null(), &mut link) });
        let (mut x, mut y) = (MemplugHostAllocation::default(), MemplugHostAllocation::default());
        let mut addr = 0;
        ok(unsafe { memplug_host_allocate(b, MIB, 64, &mut x, &mut addr) });
        let s = unsafe { memplug_host_allocate(b, 2 * MIB, 64, &mut y, &mut addr) };
        assert_eq!(s, MemplugHostStatus::OutOfBudget, "{what}: past the quota");
        assert_eq!(y.id, 0);
        let why = link_last_error(link);
        assert!(why.contains(&quota), "{what}: the refusal names the quota: {why}");
        // Within it, a lease is granted.
        ok(unsafe { memplug_host_allocate(b, 4096, 64, &mut y, &mut addr) });
        ok(memplug_host_allocation_free(x));
        ok(memplug_host_allocation_free(y));
        ok(memplug_host_node_link_leave(link));
        ok(memplug_host_binding_destroy(b));
        ok(memplug_host_pool_release(pool));
    };
    refused("user", format!("user {uid}'s quota leaves {MIB} B of {} B", 2 * MIB), &socket);
    ok(memplug_host_node_authority_stop(a));

    // A group quota of 1.5 MiB on this process's group binds too.
    let socket = CString::new(dir.join("g.sock").to_str().unwrap()).unwrap();
    let quotas = [group(gid, 3 * MIB / 2)];
    ok(unsafe {
        memplug_host_manager_start_node_authority(
            m,
            socket.as_ptr(),
            caps.as_ptr(),
            1,
            &options(&quotas),
            &mut a,
        )
    });
    refused("group", format!("group {gid}'s quota leaves {} B of {} B", MIB / 2, 3 * MIB / 2), &socket);
    ok(memplug_host_node_authority_stop(a));

    ok(memplug_host_mechanism_release(mech));
    ok(memplug_host_manager_destroy(m));
    let _ = std::fs::remove_dir_all(&dir);
}
