//! ABI 1.1 on the CPU plugin: sharing physical objects across processes as
//! file descriptors (`export_fd`/`import_fd`, `MEMPLUG_CAP_SHARED_EXPORT`),
//! and the allocation-class tag of requests.
//!
//! The two-process test runs this same test binary a second time as the
//! other process (`child_side_of_two_process_sharing`, a no-op unless the
//! parent set `MEMPLUG_EXPORT_CHILD_SOCKET`), and passes the descriptor
//! over a Unix socket with `SCM_RIGHTS`.

mod common;
use common::*;
use memplug_plugin_cpu::live_physical_objects;
use memplug_sdk::RequestClass;
use memplug_test_support::fd_passing::{accept_child, recv_fd, send_fd};
use rustix::fd::{AsFd, AsRawFd};
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::time::Duration;

const RW: u32 = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;
const CHILD_TEST: &str = "child_side_of_two_process_sharing";
const CHILD_SOCKET: &str = "MEMPLUG_EXPORT_CHILD_SOCKET";
const FROM_PARENT: &[u8] = b"written by the parent process";
const FROM_CHILD: &[u8] = b"written by the child process";

/// A reservation of `len` bytes with `object` mapped read-write over it.
fn mapped(h: &Harness, object: &MemplugObjectRef, len: u64) -> MemplugObjectRef {
    let r = h.reserve(len).unwrap();
    h.map(object, 0, &r, 0, len, RW).unwrap();
    r
}

fn unmap_and_release(h: &Harness, r: &MemplugObjectRef, len: u64) {
    h.unmap(r, 0, len).unwrap();
    h.release_reservation(r).unwrap();
}

unsafe fn write_at(addr: u64, bytes: &[u8]) {
    std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len());
}

unsafe fn read_at(addr: u64, len: usize) -> Vec<u8> {
    std::slice::from_raw_parts(addr as *const u8, len).to_vec()
}

#[test]
fn a_1_0_host_gets_the_1_0_view_and_a_1_1_host_the_export_slots() {
    let _h = harness();
    let entry = memplug_plugin_cpu::memplug_plugin_v1;
    let n = negotiate(entry, &host_info(1, 0, 0)).unwrap();
    assert_eq!(n.agreed_minor, 0);
    let mech = unsafe { &**(*n.plugin).mechanisms };
    assert_eq!(mech.capabilities, MEMPLUG_CAP_ALL_1_0, "no 1.1 bit for a 1.0 host");
    let sm = unsafe { &*mech.shared_mapping };
    assert_eq!(sm.struct_size, MEMPLUG_SHARED_MAPPING_SIZE_1_0);

    let n = negotiate(entry, &host_info(1, 0, 1)).unwrap();
    assert_eq!(n.agreed_minor, 1);
    let mech = unsafe { &**(*n.plugin).mechanisms };
    assert_eq!(mech.capabilities, MEMPLUG_CAP_ALL_1_1);
    let sm = unsafe { &*mech.shared_mapping };
    assert_eq!(sm.struct_size, MEMPLUG_SHARED_MAPPING_SIZE_1_1);
    assert!(sm.export_fd.is_some() && sm.import_fd.is_some());
    // Nothing of 1.2: no typed export, no identity (the mechanism ends
    // before its pointer).
    assert_eq!(mech.capabilities & MEMPLUG_CAP_TYPED_EXPORT, 0);
    assert_eq!(mech.struct_size, MEMPLUG_MECHANISM_SIZE_1_1);
    assert!(sm.export_handle.is_none() && sm.import_handle.is_none());
    // Both views drive the same instance.
    assert_eq!(mech.ctx, unsafe {
        (**(*negotiate(entry, &host_info(1, 0, 0)).unwrap().plugin).mechanisms).ctx
    });
}

#[test]
fn an_exported_descriptor_imports_as_an_object_showing_the_same_pages() {
    let h = harness();
    let len = 2 * h.page();
    let memfds = plugin_memfds();
    let a = h.create(len).unwrap();
    let ra = mapped(&h, &a, len);
    unsafe { write_at(ra.addr + h.page() + 8, FROM_PARENT) };

    let fd = h.export_fd(&a).unwrap();
    assert_eq!(plugin_memfds(), memfds + 2, "the caller's descriptor is a second one to the same memfd");
    let b = h.import_fd(fd.as_fd(), len).unwrap();
    assert_eq!(h.live(), h.baseline + 3, "two objects and a reservation");
    let rb = mapped(&h, &b, len);
    assert_eq!(unsafe { read_at(rb.addr + h.page() + 8, FROM_PARENT.len()) }, FROM_PARENT);
    unsafe { write_at(rb.addr, FROM_CHILD) };
    assert_eq!(unsafe { read_at(ra.addr, FROM_CHILD.len()) }, FROM_CHILD);

    // The caller's descriptor is the caller's: closing it changes nothing
    // for the imported object, which kept its own duplicate.
    drop(fd);
    assert_eq!(unsafe { read_at(rb.addr, FROM_CHILD.len()) }, FROM_CHILD);
    unmap_and_release(&h, &rb, len);
    unmap_and_release(&h, &ra, len);
    h.release_object(&a).unwrap();
    h.release_object(&b).unwrap();
    assert_eq!(plugin_memfds(), memfds, "every duplicate closed with its object");
    h.assert_balanced();
}

#[test]
fn an_exported_descriptor_keeps_the_memory_after_the_object_is_released() {
    let h = harness();
    let len = h.page();
    let a = h.create(len).unwrap();
    let ra = mapped(&h, &a, len);
    unsafe { write_at(ra.addr, FROM_PARENT) };
    let fd = h.export_fd(&a).unwrap();
    unmap_and_release(&h, &ra, len);
    h.release_object(&a).unwrap();
    h.assert_balanced();
    // The handle is gone, the memory is not: the descriptor holds it.
    refused(h.export_fd(&a), Status::UnknownAllocation);
    let b = h.import_fd(fd.as_fd(), len).unwrap();
    let rb = mapped(&h, &b, len);
    assert_eq!(unsafe { read_at(rb.addr, FROM_PARENT.len()) }, FROM_PARENT);
    unmap_and_release(&h, &rb, len);
    h.release_object(&b).unwrap();
    h.assert_balanced();
}

#[test]
fn export_refuses_foreign_and_unknown_objects_and_a_null_out_fd() {
    let h = harness();
    let a = h.create(h.page()).unwrap();
    let foreign = MemplugObjectRef { mechanism_id: 77, ..a };
    refused(h.export_fd(&foreign), Status::WrongMechanism);
    let forged = MemplugObjectRef { handle: a.handle + 1000, ..a };
    refused(h.export_fd(&forged), Status::UnknownAllocation);
    let st = call(|sink| unsafe { h.sm.export_fd.unwrap()(h.ctx as *mut _, &a, std::ptr::null_mut(), sink) });
    refused(st, Status::InvalidArgument);
    h.release_object(&a).unwrap();
    h.assert_balanced();
}

#[test]
fn import_refuses_descriptors_it_cannot_map_and_imports_nothing() {
    let h = harness();
    let page = h.page();
    let memfds = plugin_memfds();

    refused(h.import_raw(-1, &h.request(page, 1)), Status::InvalidArgument);

    // A regular file is not memory of this mechanism.
    let file = std::fs::File::open("/proc/self/exe").unwrap();
    let msg = refused(h.import_fd(file.as_fd(), page), Status::InvalidArgument);
    assert!(msg.contains("memfd"), "{msg}");

    // A memfd whose pages could vanish under a mapping (not sealed).
    let unsealed = rustix::fs::memfd_create("unsealed", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&unsealed, page).unwrap();
    let msg = refused(h.import_fd(unsealed.as_fd(), page), Status::InvalidArgument);
    assert!(msg.contains("sealed"), "{msg}");

    // Smaller than asked, and read-only: exported from a real object.
    let a = h.create(page).unwrap();
    let fd = h.export_fd(&a).unwrap();
    let msg = refused(h.import_fd(fd.as_fd(), 2 * page), Status::OutOfRange);
    assert!(msg.contains("less than"), "{msg}");
    let read_only = std::fs::File::open(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
    let msg = refused(h.import_fd(read_only.as_fd(), page), Status::InvalidArgument);
    assert!(msg.contains("reading and writing"), "{msg}");

    // Malformed requests are refused as `create` refuses them.
    let zero = MemplugRequest { size: 0, ..h.request(page, 1) };
    refused(h.import_raw(fd.as_raw_fd(), &zero), Status::InvalidArgument);
    let short = MemplugRequest { struct_size: MEMPLUG_REQUEST_SIZE_1_0 - 8, ..h.request(page, 1) };
    refused(h.import_raw(fd.as_raw_fd(), &short), Status::InvalidArgument);

    drop((fd, read_only));
    h.release_object(&a).unwrap();
    assert_eq!(plugin_memfds(), memfds);
    h.assert_balanced();
}

#[test]
fn class_tags_reach_the_plugin_and_unknown_tags_count_as_other() {
    let h = harness();
    let page = h.page();
    let before: Vec<u64> = RequestClass::ALL.iter().map(|&c| live_physical_objects(c)).collect();
    let delta = |c: RequestClass| live_physical_objects(c) - before[c.tag() as usize];

    let mut made = Vec::new();
    let mut create = |struct_size: u32, tag: u32| {
        let r = MemplugRequest { struct_size, class_tag: tag, ..h.request(page, 1) };
        let b = h.create_raw(&r).unwrap();
        made.push(h.object_ref(&r, &b));
    };
    create(MEMPLUG_REQUEST_SIZE_1_1, MEMPLUG_CLASS_WEIGHTS);
    create(MEMPLUG_REQUEST_SIZE_1_1, MEMPLUG_CLASS_KV);
    create(MEMPLUG_REQUEST_SIZE_1_1, MEMPLUG_CLASS_KV);
    create(MEMPLUG_REQUEST_SIZE_1_1, MEMPLUG_CLASS_ACTIVATIONS);
    create(MEMPLUG_REQUEST_SIZE_1_1, MEMPLUG_CLASS_WORKSPACE);
    create(MEMPLUG_REQUEST_SIZE_1_1, 99); // unknown: OTHER
    create(MEMPLUG_REQUEST_SIZE_1_0, MEMPLUG_CLASS_KV); // past a 1.0 host's struct: not read
    assert_eq!(delta(RequestClass::Weights), 1);
    assert_eq!(delta(RequestClass::Kv), 2);
    assert_eq!(delta(RequestClass::Activations), 1);
    assert_eq!(delta(RequestClass::Workspace), 1);
    assert_eq!(delta(RequestClass::Other), 2);

    // Imports are tagged by their own request.
    let fd = h.export_fd(&made[0]).unwrap();
    let r = MemplugRequest { class_tag: MEMPLUG_CLASS_WORKSPACE, ..h.request(page, 1) };
    let b = h.import_raw(fd.as_raw_fd(), &r).unwrap();
    made.push(h.object_ref(&r, &b));
    assert_eq!(delta(RequestClass::Workspace), 2);

    for o in &made {
        h.release_object(o).unwrap();
    }
    for c in RequestClass::ALL {
        assert_eq!(delta(c), 0, "{c:?} counted until its object went");
    }
    h.assert_balanced();
}

// ---- two processes ----

/// The other process of `two_processes_share_one_physical_object`: imports
/// the descriptor it is sent, checks the parent's bytes, writes its own,
/// and says so. Does nothing in an ordinary test run.
#[test]
fn child_side_of_two_process_sharing() {
    let Some(path) = std::env::var_os(CHILD_SOCKET) else {
        return;
    };
    let mut stream = UnixStream::connect(path).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (fd, payload) = recv_fd(&stream);
    let len = u64::from_le_bytes(payload[..8].try_into().unwrap());

    let h = harness();
    let object = h.import_fd(fd.as_fd(), len).unwrap();
    drop(fd); // the plugin keeps its own duplicate
    let r = mapped(&h, &object, len);
    assert_eq!(unsafe { read_at(r.addr + len - 64, FROM_PARENT.len()) }, FROM_PARENT, "the parent's write");
    unsafe { write_at(r.addr, FROM_CHILD) };
    unmap_and_release(&h, &r, len);
    h.release_object(&object).unwrap();
    h.assert_balanced();
    stream.write_all(b"k").unwrap();
}

#[test]
fn two_processes_share_one_physical_object_over_scm_rights() {
    let h = harness();
    let len = 2 * h.page();
    let dir = std::env::temp_dir().join(format!("memplug-export-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("socket");
    let listener = UnixListener::bind(&path).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", CHILD_TEST, "--nocapture", "--test-threads=1"])
        .env(CHILD_SOCKET, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stream = accept_child(&listener, &mut child, Duration::from_secs(30), child_output);

    let object = h.create(len).unwrap();
    let r = mapped(&h, &object, len);
    unsafe { write_at(r.addr + len - 64, FROM_PARENT) };
    let fd = h.export_fd(&object).unwrap();
    send_fd(&stream, fd.as_fd(), &len.to_le_bytes());
    drop(fd);

    let mut ack = [0u8; 1];
    let acked = stream.read(&mut ack).unwrap_or(0);
    let out = child.wait_with_output().unwrap();
    assert!(acked == 1 && out.status.success(), "the child failed ({}):\n{}", out.status, child_output(&out));
    assert_eq!(unsafe { read_at(r.addr, FROM_CHILD.len()) }, FROM_CHILD, "the child's write, seen here");

    unmap_and_release(&h, &r, len);
    h.release_object(&object).unwrap();
    h.assert_balanced();
    let _ = std::fs::remove_dir_all(&dir);
}

fn child_output(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}
