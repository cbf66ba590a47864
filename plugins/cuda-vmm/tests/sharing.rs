//! Sharing physical objects (ABI 1.2 typed export, ABI 1.1 descriptors) on
//! the CUDA plugin, against the fake driver (or a real GPU with
//! MEMPLUG_CUDA_TEST_REAL=1): an object created with `export_types`
//! MEMPLUG_HANDLE_OPAQUE_FD is one shareable CUDA allocation, exported as
//! a POSIX descriptor (`cuMemExportToShareableHandle`) and imported
//! (`cuMemImportFromShareableHandle`) here or in another process.
//!
//! The two-process test runs this test binary again as the other process
//! (`child_side_of_two_process_sharing`, ignored unless run so) and passes
//! the descriptor over a Unix socket with `SCM_RIGHTS`. The fake reads
//! MEMPLUG_FAKE_CUDA_NO_POSIX_FD at its first `cuInit`, so the test of a
//! device without POSIX-fd handles runs in a child process too.

mod common;

use common::*;
use memplug_host::governor::AllocationClass;
use memplug_host::{Access, Mechanism, Placement, Plugin, Status};
use memplug_sdk::abi::{MEMPLUG_HANDLE_DMABUF_FD, MEMPLUG_HANDLE_MEMFD, MEMPLUG_HANDLE_OPAQUE_FD};
use memplug_sdk::{Handle, HandleRef};
use memplug_test_support::fd_passing::{accept_child, recv_fd, send_fd};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::time::Duration;

const OPAQUE: u32 = MEMPLUG_HANDLE_OPAQUE_FD;
const FROM_PARENT: &[u8] = b"written by the parent process";
const FROM_CHILD: &[u8] = b"written by the child process";
const CHILD_TEST: &str = "child_side_of_two_process_sharing";
const CHILD_SOCKET: &str = "MEMPLUG_CUDA_SHARE_CHILD_SOCKET";

/// The descriptor of a typed export of kind OPAQUE_FD.
fn fd_of(h: Handle) -> OwnedFd {
    match h {
        Handle::Fd { kind, fd } => {
            assert_eq!(kind, OPAQUE);
            fd
        }
        other => panic!("not a descriptor: {other:?}"),
    }
}

#[test]
fn the_untyped_1_1_export_is_not_offered() {
    // ABI 1.1's export means any physical object exports; CUDA makes an
    // allocation shareable only when asked at cuMemCreate, which only a 1.2
    // request (export_types) can say.
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    assert!(!m.capabilities().shared_export(), "{:?}", m.capabilities());
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let plain = sm.create(m.properties().granularity).unwrap();
    assert_eq!(sm.export_fd(&plain).unwrap_err().status, Status::Unsupported);
    sm.release(plain).unwrap();
    drop(m);
    unload_released(p);
}

fn exportable() -> Placement {
    Placement { export_types: OPAQUE, ..Placement::default() }
}

/// Whether this whole run told the fake to have no POSIX-fd handles.
fn no_posix_fd_env() -> bool {
    !real() && std::env::var("MEMPLUG_FAKE_CUDA_NO_POSIX_FD").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Whether `m` offers OPAQUE_FD export; in fake mode it must (unless the
/// run set MEMPLUG_FAKE_CUDA_NO_POSIX_FD). In real mode a device without
/// POSIX-fd handles skips the test (with a note).
fn offers_export(m: &Mechanism) -> bool {
    let d = m.properties().descriptor;
    if d.export_types & OPAQUE != 0 {
        return true;
    }
    assert!(
        real() || no_posix_fd_env(),
        "the fake supports POSIX-fd handles by default, yet export_types is {:#x}",
        d.export_types
    );
    println!("NOTE: {} offers no export kinds on this device; skipped", m.name());
    false
}

/// CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED of
/// device 0, asked of the driver directly.
fn posix_fd_attribute() -> i32 {
    let d = drv();
    let mut v = -1;
    let r = unsafe {
        (d.api.device_get_attribute)(
            &mut v,
            memplug_plugin_cuda_vmm::driver::ATTR_POSIX_FD_SUPPORTED,
            d.devices[0].device,
        )
    };
    assert_eq!(r, 0, "cuDeviceGetAttribute");
    v
}

fn calls(name: &str) -> i64 {
    fake_entry_calls(name).unwrap_or(0)
}

/// Two used-byte readings of device 0 differ by `delta` (fake mode only).
#[track_caller]
fn assert_used(before: Option<u64>, delta: i64, what: &str) {
    if let (Some(b), Some(now)) = (before, fake_used(0)) {
        assert_eq!(now as i64 - b as i64, delta, "{what}");
    }
}

#[test]
fn exportable_objects_are_offered_and_made_as_one_zeroed_shareable_allocation() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let d = m.properties().descriptor;
    assert!(!d.maps_at_offsets, "CUDA maps a shareable handle only from offset 0");
    if !real() && !no_posix_fd_env() {
        assert_eq!(posix_fd_attribute(), 1, "the fake supports POSIX-fd handles by default");
        assert_eq!(d.export_types, OPAQUE, "exactly MEMPLUG_HANDLE_OPAQUE_FD is offered");
    }
    if !offers_export(&m) {
        return;
    }
    let g = m.properties().granularity;
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let used = fake_used(0);

    // Exportable: one cuMemCreate for all three granules.
    let creates = calls("cuMemCreate");
    let obj = sm.create_placed(3 * g - 1, AllocationClass::Other, &exportable()).unwrap();
    assert_eq!(obj.size(), 3 * g, "rounded to whole granules");
    if !real() {
        assert_eq!(calls("cuMemCreate") - creates, 1, "an exportable object is one CUDA allocation");
    }
    assert_used(used, 3 * g as i64, "the object's memory");
    // A plain one: a chunk per granule.
    let creates = calls("cuMemCreate");
    let plain = sm.create(3 * g).unwrap();
    if !real() {
        assert_eq!(calls("cuMemCreate") - creates, 3, "a plain object is one chunk per granule");
    }

    let r = vb.reserve(3 * g).unwrap();
    sm.map(&obj, 0, &r, 0, 3 * g, Access::ReadWrite).unwrap();
    assert_eq!(read(r.addr(), 64), vec![0; 64], "zero-filled (the fake's fresh memory is 0xa5)");
    assert_eq!(read(r.addr() + 3 * g - 64, 64), vec![0; 64], "zero-filled to the end");
    stamp(r.addr() + g, 5);
    assert!(has_stamp(r.addr() + g, 5));
    sm.unmap(&r, 0, 3 * g).unwrap();
    vb.release(r).unwrap();
    sm.release(obj).unwrap();
    sm.release(plain).unwrap();
    assert_used(used, 0, "every byte back");
    drop(m);
    unload_released(p);
}

#[test]
fn an_exported_handle_imports_in_this_process_as_the_same_memory_counted_once() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    if !offers_export(&m) {
        return;
    }
    let g = m.properties().granularity;
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let used = fake_used(0);
    let len = 2 * g;

    let a = sm.create_placed(len, AllocationClass::Other, &exportable()).unwrap();
    let ra = vb.reserve(len).unwrap();
    sm.map(&a, 0, &ra, 0, len, Access::ReadWrite).unwrap();
    write(ra.addr() + g + 8, FROM_PARENT).unwrap();

    let Handle::Fd { kind, fd } = sm.export_handle(&a, OPAQUE).unwrap() else {
        panic!("an OPAQUE_FD export is a descriptor");
    };
    assert_eq!(kind, OPAQUE);
    // Never a standard stream's number, and not inherited by a child.
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    assert!(raw >= 3, "exported fd {raw}");
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFD) };
    assert!(flags >= 0 && flags & libc::FD_CLOEXEC != 0, "exported fd {raw} is not close-on-exec");
    let b = sm.import_handle(HandleRef::Fd { kind: OPAQUE, fd: fd.as_fd() }, len).unwrap();
    assert_eq!(b.size(), len);
    // The caller's descriptor stays the caller's: closing it changes
    // nothing for the imported object.
    drop(fd);
    assert_used(used, len as i64, "one memory, counted once, for two objects");
    assert_eq!(p.plugin_live_objects(), 3, "two objects and a reservation");

    let rb = vb.reserve(len).unwrap();
    sm.map(&b, 0, &rb, 0, len, Access::ReadWrite).unwrap();
    assert_eq!(
        read(rb.addr() + g + 8, FROM_PARENT.len()),
        FROM_PARENT,
        "the import shows the exporter's bytes"
    );
    write(rb.addr(), FROM_CHILD).unwrap();
    assert_eq!(read(ra.addr(), FROM_CHILD.len()), FROM_CHILD, "and the exporter sees the importer's");

    // An import exports again, and a smaller import of the same memory
    // works. (The untyped export of ABI 1.1 is not offered: see
    // `the_untyped_1_1_export_is_not_offered`.)
    let fd = fd_of(sm.export_handle(&b, OPAQUE).expect("an imported object exports again"));
    let c = sm
        .import_handle(HandleRef::Fd { kind: OPAQUE, fd: fd.as_fd() }, g)
        .expect("a smaller import of the same memory");
    drop(fd);
    let rc = vb.reserve(g).unwrap();
    sm.map(&c, 0, &rc, 0, g, Access::ReadWrite).unwrap();
    assert_eq!(read(rc.addr(), FROM_CHILD.len()), FROM_CHILD);
    assert_used(used, len as i64, "still counted once");

    // The exporter goes first: the imports keep the memory.
    sm.unmap(&ra, 0, len).unwrap();
    vb.release(ra).unwrap();
    sm.release(a).unwrap();
    assert_used(used, len as i64, "the imports hold the memory");
    assert_eq!(read(rb.addr() + g + 8, FROM_PARENT.len()), FROM_PARENT);
    // Releasing a reservation unmaps a whole mapping of a shareable object.
    vb.release(rb).unwrap();
    vb.release(rc).unwrap();
    sm.release(b).unwrap();
    sm.release(c).unwrap();
    assert_used(used, 0, "every byte back once no handle shows the memory");
    drop(m);
    unload_released(p);
}

#[test]
fn export_of_an_object_not_created_exportable_is_unsupported() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    if !offers_export(&m) {
        return;
    }
    let g = m.properties().granularity;
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let plain = sm.create(g).unwrap();
    let exports = calls("cuMemExportToShareableHandle");
    let e = sm.export_handle(&plain, OPAQUE).unwrap_err();
    assert_eq!(e.status, Status::Unsupported, "{e}");
    assert!(e.message.contains("export_types"), "says the object was not created exportable: {e}");
    assert_eq!(calls("cuMemExportToShareableHandle"), exports, "refused before the driver");
    sm.release(plain).unwrap();
    drop(m);
    unload_released(p);
}

#[test]
fn an_exportable_object_maps_only_whole_from_offset_zero() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    if !offers_export(&m) {
        return;
    }
    let g = m.properties().granularity;
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let obj = sm.create_placed(2 * g, AllocationClass::Other, &exportable()).unwrap();
    let r = vb.reserve(4 * g).unwrap();
    let maps = calls("cuMemMap");
    for (offset, len, what) in [(g, g, "at an offset"), (0, g, "a part from offset 0")] {
        let e = sm.map(&obj, offset, &r, 0, len, Access::ReadWrite).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument, "{what}: {e}");
        assert!(e.message.contains("only whole") && e.message.contains("nothing was changed"), "{what}: {e}");
    }
    assert_eq!(calls("cuMemMap"), maps, "refused before the driver");
    // Nothing changed: the same range maps the object whole, and a plain
    // object still maps at an offset.
    sm.map(&obj, 0, &r, 0, 2 * g, Access::ReadWrite).unwrap();
    let plain = sm.create(2 * g).unwrap();
    sm.map(&plain, g, &r, 2 * g, g, Access::ReadWrite).unwrap();
    sm.unmap(&r, 0, 2 * g).unwrap();
    sm.unmap(&r, 2 * g, g).unwrap();
    vb.release(r).unwrap();
    sm.release(obj).unwrap();
    sm.release(plain).unwrap();
    drop(m);
    unload_released(p);
}

#[test]
fn import_refuses_descriptors_that_are_not_cuda_shareable_handles_and_sizes_past_the_allocation() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    if !offers_export(&m) {
        return;
    }
    let g = m.properties().granularity;
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let used = fake_used(0);

    // A pipe.
    let mut ends = [-1 as RawFd; 2];
    assert_eq!(unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
    let e = sm.import_handle(HandleRef::Fd { kind: OPAQUE, fd: rd.as_fd() }, g).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "a pipe: {e}");
    assert!(e.message.contains("not a CUDA shareable handle"), "{e}");
    drop((rd, wr));

    // A memfd the driver did not export, of a plausible size.
    let memfd = unsafe { libc::memfd_create(c"not-from-cuda".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(memfd >= 0);
    let memfd = unsafe { OwnedFd::from_raw_fd(memfd) };
    assert_eq!(unsafe { libc::ftruncate(memfd.as_raw_fd(), g as i64) }, 0);
    let e = sm.import_handle(HandleRef::Fd { kind: OPAQUE, fd: memfd.as_fd() }, g).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "a foreign memfd: {e}");

    // A genuine handle, asked for more than it holds.
    let a = sm.create_placed(g, AllocationClass::Other, &exportable()).unwrap();
    let fd = fd_of(sm.export_handle(&a, OPAQUE).unwrap());
    let e = sm.import_handle(HandleRef::Fd { kind: OPAQUE, fd: fd.as_fd() }, 2 * g).unwrap_err();
    assert_eq!(e.status, Status::OutOfRange, "larger than the allocation: {e}");
    assert!(e.message.contains("more than the imported allocation"), "{e}");
    // A kind this mechanism does not import is the SDK's refusal.
    let e =
        sm.import_handle(HandleRef::Fd { kind: MEMPLUG_HANDLE_DMABUF_FD, fd: fd.as_fd() }, g).unwrap_err();
    assert_eq!(e.status, Status::Unsupported, "{e}");

    drop(fd);
    assert_eq!(p.plugin_live_objects(), 1, "nothing was imported");
    sm.release(a).unwrap();
    assert_used(used, 0, "nothing left");
    drop(m);
    unload_released(p);
}

#[test]
fn kinds_not_offered_are_refused_by_the_sdk() {
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let g = m.properties().granularity;
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let creates = calls("cuMemCreate");
    for kind in [MEMPLUG_HANDLE_DMABUF_FD, MEMPLUG_HANDLE_MEMFD, OPAQUE | MEMPLUG_HANDLE_MEMFD] {
        let placement = Placement { export_types: kind, ..Placement::default() };
        let e = sm.create_placed(g, AllocationClass::Other, &placement).unwrap_err();
        assert_eq!(e.status, Status::Unsupported, "export_types {kind:#x}: {e}");
        assert!(e.message.contains("export kinds"), "{e}");
    }
    assert_eq!(calls("cuMemCreate"), creates, "nothing was made");
    if offers_export(&m) {
        let obj = sm.create_placed(g, AllocationClass::Other, &exportable()).unwrap();
        for kind in [MEMPLUG_HANDLE_DMABUF_FD, MEMPLUG_HANDLE_MEMFD] {
            let e = sm.export_handle(&obj, kind).unwrap_err();
            assert_eq!(e.status, Status::Unsupported, "export as {kind:#x}: {e}");
        }
        sm.release(obj).unwrap();
    }
    drop(m);
    unload_released(p);
}

#[test]
fn a_whole_mapping_unmaps_in_one_call_on_a_one_mapping_per_call_driver() {
    if real() {
        println!("NOTE: fake-only (fake_cuda_set_unmap_one_mapping); skipped");
        return;
    }
    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let g = m.properties().granularity;
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    if !offers_export(&m) {
        return;
    }
    let before = fake_set_unmap_one_mapping(true);
    // The mechanism learns that this driver unmaps one mapping per call
    // (a two-granule decommit falls back to granule by granule) ...
    let r = vb.reserve(4 * g).unwrap();
    vb.commit(&r, 2 * g, 2 * g).unwrap();
    vb.decommit(&r, 2 * g, 2 * g).unwrap();
    // ... yet a shareable object's two-granule mapping is one mapping:
    // one cuMemUnmap, never one per granule.
    let obj = sm.create_placed(2 * g, AllocationClass::Other, &exportable()).unwrap();
    sm.map(&obj, 0, &r, 0, 2 * g, Access::ReadWrite).unwrap();
    let unmaps = calls("cuMemUnmap");
    let unmapped = sm.unmap(&r, 0, 2 * g);
    let one_call = calls("cuMemUnmap") - unmaps;
    // And a reservation's release unmaps it whole too, beside a committed
    // granule.
    sm.map(&obj, 0, &r, 0, 2 * g, Access::ReadWrite)
        .unwrap_or_else(|e| panic!("map again: {e} ({unmapped:?})"));
    vb.commit(&r, 3 * g, g).unwrap();
    let released = vb.release(r);
    fake_set_unmap_one_mapping(before);
    unmapped.unwrap();
    assert_eq!(one_call, 1, "one cuMemUnmap for the whole mapping");
    released.unwrap();
    sm.release(obj).unwrap();
    drop(m);
    unload_released(p);
}

// ---- a device without POSIX-fd handles (a child process) ----

#[test]
fn without_posix_fd_handles_the_plugin_offers_no_export() {
    if real() {
        println!("NOTE: fake-only (MEMPLUG_FAKE_CUDA_NO_POSIX_FD); skipped");
        return;
    }
    let out = run_child("no_posix_fd_child", &[("MEMPLUG_FAKE_CUDA_NO_POSIX_FD", Some("1".as_ref()))]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("CHILD: no export kinds"), "the child checked nothing:\n{text}");
}

/// Run by `without_posix_fd_handles_the_plugin_offers_no_export` with
/// MEMPLUG_FAKE_CUDA_NO_POSIX_FD=1.
#[test]
#[ignore = "run in a child process by without_posix_fd_handles_the_plugin_offers_no_export"]
fn no_posix_fd_child() {
    assert!(is_child(), "run only as a child");
    let _s = serial();
    assert_eq!(posix_fd_attribute(), 0, "the switch reached the fake");
    let p = load();
    let m = cuda0(&p);
    let g = m.properties().granularity;
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    assert_eq!(m.properties().descriptor.export_types, 0, "no export kinds offered");
    let e = sm.create_placed(g, AllocationClass::Other, &exportable()).unwrap_err();
    assert_eq!(e.status, Status::Unsupported, "{e}");
    let plain = sm.create(g).unwrap();
    let memfd = unsafe { libc::memfd_create(c"anything".as_ptr(), libc::MFD_CLOEXEC) };
    let memfd = unsafe { OwnedFd::from_raw_fd(memfd) };
    let e = sm.import_handle(HandleRef::Fd { kind: OPAQUE, fd: memfd.as_fd() }, g).unwrap_err();
    assert_eq!(e.status, Status::Unsupported, "{e}");
    sm.release(plain).unwrap();
    drop(m);
    unload_released(p);
    println!("CHILD: no export kinds");
}

// ---- two processes ----

/// The other process of `two_processes_share_one_exportable_object`:
/// imports the descriptor it is sent, reads the parent's bytes, writes its
/// own, releases everything and acknowledges.
#[test]
#[ignore = "run in a child process by two_processes_share_one_exportable_object_over_scm_rights"]
fn child_side_of_two_process_sharing() {
    let Some(path) = std::env::var_os(CHILD_SOCKET) else {
        println!("not started by the two-process test; nothing to do");
        return;
    };
    let mut stream = UnixStream::connect(path).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let (fd, payload) = recv_fd(&stream);
    let len = u64::from_le_bytes(payload[..8].try_into().unwrap());

    let _s = serial();
    let p = load();
    let m = cuda0(&p);
    let g = m.properties().granularity;
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let used = fake_used(0);
    let obj = sm.import_handle(HandleRef::Fd { kind: OPAQUE, fd: fd.as_fd() }, len).unwrap();
    drop(fd); // the driver keeps its own
    assert_used(used, len as i64, "the imported memory counts in this process's driver");
    let r = vb.reserve(len).unwrap();
    sm.map(&obj, 0, &r, 0, len, Access::ReadWrite).unwrap();
    assert_eq!(read(r.addr() + g + 8, FROM_PARENT.len()), FROM_PARENT, "the parent's write");
    write(r.addr(), FROM_CHILD).unwrap();
    sm.unmap(&r, 0, len).unwrap();
    vb.release(r).unwrap();
    sm.release(obj).unwrap();
    assert_used(used, 0, "released here");
    drop(m);
    unload_released(p);
    stream.write_all(b"k").unwrap();
}

#[test]
fn two_processes_share_one_exportable_object_over_scm_rights() {
    let _s = serial();
    let p: Plugin = load();
    let m = cuda0(&p);
    if !offers_export(&m) {
        return;
    }
    let g = m.properties().granularity;
    let len = 2 * g;
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let used = fake_used(0);

    let dir = std::env::temp_dir().join(format!("memplug-cuda-share-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("socket");
    let listener = UnixListener::bind(&path).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([CHILD_TEST, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("MEMPLUG_CUDA_CHILD", "1")
        .env("MEMPLUG_CUDA_PLUGIN", plugin_path())
        .env(CHILD_SOCKET, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stream = accept_child(&listener, &mut child, Duration::from_secs(60), output);

    let obj = sm.create_placed(len, AllocationClass::Other, &exportable()).unwrap();
    let r = vb.reserve(len).unwrap();
    sm.map(&obj, 0, &r, 0, len, Access::ReadWrite).unwrap();
    write(r.addr() + g + 8, FROM_PARENT).unwrap();
    let Handle::Fd { fd, .. } = sm.export_handle(&obj, OPAQUE).unwrap() else {
        panic!("an OPAQUE_FD export is a descriptor");
    };
    send_fd(&stream, fd.as_fd(), &len.to_le_bytes());
    drop(fd);

    let mut ack = [0u8; 1];
    let acked = stream.read(&mut ack).unwrap_or(0);
    let out = child.wait_with_output().unwrap();
    let text = output(&out);
    assert!(acked == 1 && out.status.success(), "the child failed ({}):\n{text}", out.status);
    assert!(text.contains("1 passed"), "the child ran no test:\n{text}");
    assert_eq!(read(r.addr(), FROM_CHILD.len()), FROM_CHILD, "the child's write, seen here");
    assert_eq!(read(r.addr() + g + 8, FROM_PARENT.len()), FROM_PARENT, "the parent's own bytes kept");

    sm.unmap(&r, 0, len).unwrap();
    vb.release(r).unwrap();
    sm.release(obj).unwrap();
    assert_used(used, 0, "every byte back");
    drop(m);
    unload_released(p);
    let _ = std::fs::remove_dir_all(&dir);
}

fn output(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}
