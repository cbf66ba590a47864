//! File descriptors crossing the boundary: a plugin's `export_fd` that
//! returns a number that is not a new descriptor for memory, and an
//! `import_fd` that closes the descriptor it was given. The host must
//! refuse the first without closing anything (the number may be its own)
//! and must never let the second close the caller's descriptor.
//!
//! The tests run one at a time (`ONE_AT_A_TIME`): a plugin returning a
//! number it closed races with any other thread opening a file, which
//! could get that number between the close and the host's check.

mod contained;

use contained::load_contained;
use memplug_host::Status;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Mutex;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// What descriptor `fd` of this process is open on (`/proc/self/fd`), or
/// `None` when it is not open.
fn open_file(fd: i32) -> Option<(PathBuf, u64, u64)> {
    let link = PathBuf::from(format!("/proc/self/fd/{fd}"));
    let target = std::fs::read_link(&link).ok()?;
    let meta = std::fs::metadata(&link).ok()?;
    Some((target, meta.dev(), meta.ino()))
}

/// Makes sure fd 0 is open (on /dev/null when the harness closed it), so a
/// file the test opens cannot be given the number 0.
fn stdin_open() -> (PathBuf, u64, u64) {
    if open_file(0).is_none() {
        let null = File::open("/dev/null").unwrap();
        assert_eq!(null.as_raw_fd(), 0, "the lowest free number is 0");
        std::mem::forget(null);
    }
    open_file(0).unwrap()
}

/// A host file with known content, and what it is.
fn host_file() -> (File, (PathBuf, u64, u64)) {
    let path = memplug_test_support::test_tmp_dir("descriptors").join("precious.txt");
    let mut f = File::options().create(true).truncate(true).read(true).write(true).open(&path).unwrap();
    f.write_all(b"the host's own file").unwrap();
    let id = open_file(f.as_raw_fd()).unwrap();
    (f, id)
}

fn intact(f: &mut File) -> bool {
    let mut s = String::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_string(&mut s).unwrap();
    s == "the host's own file"
}

/// The number in "returned fd N," of a refusal.
fn returned_fd(message: &str) -> i32 {
    let rest = message.split("returned fd ").nth(1).unwrap_or_else(|| panic!("{message}"));
    rest.split(|c: char| !c.is_ascii_digit() && c != '-').next().unwrap().parse().unwrap()
}

#[test]
fn exported_numbers_that_are_not_new_memory_descriptors_are_refused_and_left_open() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let stdin = stdin_open();
    let (mut file, file_id) = host_file();
    let cases = [
        ("BAD_EXPORT_FD_STDIN", "one of the standard descriptors"),
        ("BAD_EXPORT_FD_CLOSED", "which is not open"),
        ("BAD_EXPORT_FD_PIPE", "a pipe or FIFO"),
    ];
    for (variant, why) in cases {
        let p = load_contained(variant);
        assert_eq!(p.abi_version(), (1, 1), "{variant}");
        let m = p.mechanisms()[0].clone();
        let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
        assert!(sm.can_export());
        let o = sm.create(m.properties().granularity).unwrap();
        let e = sm.export_fd(&o).unwrap_err();
        assert_eq!(e.status, Status::Internal, "{variant}: {e}");
        assert!(e.message.contains(why), "{variant}: {e}");
        let fd = returned_fd(&e.message);
        match variant {
            "BAD_EXPORT_FD_STDIN" => assert_eq!(fd, 0),
            "BAD_EXPORT_FD_CLOSED" => assert!(open_file(fd).is_none(), "fd {fd} was closed by the plugin"),
            _ => {
                // A new descriptor, given away by the plugin: the host
                // closes it rather than leak it.
                assert!(e.message.contains("the host closed it"), "{variant}: {e}");
                assert!(open_file(fd).is_none(), "the refused pipe {fd} is closed");
            }
        }
        if variant != "BAD_EXPORT_FD_PIPE" {
            assert!(e.message.contains("does not own it and leaves it as it is"), "{variant}: {e}");
        }
        // The host's own descriptors are open and unchanged.
        assert_eq!(open_file(0), Some(stdin.clone()), "{variant}: stdin");
        assert_eq!(open_file(file.as_raw_fd()), Some(file_id.clone()), "{variant}: the host's file");
        assert!(intact(&mut file), "{variant}: the host's file content");
        sm.release(o).unwrap();
        drop(m);
        p.unload().unwrap();
    }
}

#[test]
fn a_plugin_that_closes_a_lent_descriptor_closes_only_a_duplicate() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let p = load_contained("BAD_IMPORT_CLOSES_FD");
    let m = p.mechanisms()[0].clone();
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let g = m.properties().granularity;
    let o = sm.create(g).unwrap();
    // This variant's export is correct: a memfd, accepted.
    let fd = sm.export_fd(&o).unwrap();
    let before = open_file(fd.as_raw_fd()).unwrap();
    assert!(before.0.to_string_lossy().starts_with("/memfd:"), "{before:?}");
    let e = sm.import_fd(fd.as_fd(), g).unwrap_err();
    assert_eq!(e.status, Status::Internal, "{e}");
    assert!(e.message.contains("closed the descriptor it was lent"), "{e}");
    assert!(e.message.contains("reported success"), "{e}");
    // The caller's descriptor is open, on the same memory.
    assert_eq!(open_file(fd.as_raw_fd()), Some(before));
    assert_eq!(m.live(memplug_host::ObjectKind::PhysicalObject), 1, "the import is not counted");
    sm.release(o).unwrap();
    // The object the plugin made from the import is not released by the
    // host (it was refused); the plugin still holds it.
    assert_eq!(p.plugin_live_objects(), 1);
    drop(fd);
}

#[test]
fn an_export_that_is_not_memory_or_not_new_is_refused_naming_what_it_is() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let stdin = stdin_open();
    let (mut file, file_id) = host_file();
    let p = load_contained("BAD_EXPORT_NOT_MEMFD");
    let m = p.mechanisms()[0].clone();
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let o = sm.create(m.properties().granularity).unwrap();
    // A regular file that is not memory (before: taken as the export, and
    // closed by its caller as documented).
    let e = sm.export_fd(&o).unwrap_err();
    assert_eq!(e.status, Status::Internal, "{e}");
    assert_eq!(e.slot, "shared_mapping.export_fd");
    for part in ["not shared memory", "/proc/", "status", "the host closed it"] {
        assert!(e.message.contains(part), "{part:?}: {e}");
    }
    let fd = returned_fd(&e.message);
    assert!(open_file(fd).is_none(), "the plugin's new file {fd} is closed, not leaked");
    // A descriptor that was open before the call: not the plugin's to give,
    // not the host's to close.
    let e = sm.export_fd(&o).unwrap_err();
    assert_eq!(e.status, Status::Internal, "{e}");
    for part in ["open before the call", "/memfd:", "leaves it as it is"] {
        assert!(e.message.contains(part), "{part:?}: {e}");
    }
    let fd = returned_fd(&e.message);
    let (target, ..) = open_file(fd).expect("left open");
    assert!(target.to_string_lossy().starts_with("/memfd:"), "{target:?}");
    drop(unsafe { OwnedFd::from_raw_fd(fd) }); // the plugin leaked it
    assert_eq!(open_file(0), Some(stdin), "stdin");
    assert_eq!(open_file(file.as_raw_fd()), Some(file_id), "the host's file");
    assert!(intact(&mut file));
    sm.release(o).unwrap();
    drop(m);
    p.unload().unwrap();
}
