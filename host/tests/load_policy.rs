//! The loading policy checks the file that gets loaded, and nothing else:
//! a plugin file is opened once, every check runs on that descriptor, and
//! that same descriptor is what the dynamic loader maps. `/proc/self/maps`
//! is the witness: the tests look there for the inode of the file that was
//! checked (and for the absence of any other).
//!
//! Scenarios that need a fresh process (`LD_LIBRARY_PATH` is read at start;
//! descriptor numbers must be reused deterministically) run in a child: this
//! test binary again, running only [`child_scenario`] with
//! `MEMPLUG_LOAD_POLICY_CHILD` naming the scenario.

use memplug_host::{LoadError, LoadOptions, Plugin};
use memplug_test_support::{compile_c_plugin, find_cdylib, repo_root, test_tmp_dir};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

const CHILD_ENV: &str = "MEMPLUG_LOAD_POLICY_CHILD";
const CPU_FILE: &str = "libmemplug_plugin_cpu.so";
const C_EXAMPLE_NAME: &str = "memplug-c-example";

fn cpu_plugin() -> PathBuf {
    find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN")
}

fn c_example(out_name: &str) -> PathBuf {
    compile_c_plugin(&repo_root().join("c-examples/plugin/example_plugin.c"), &[], out_name)
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A fresh directory only its owner can write.
fn private_dir(name: &str) -> PathBuf {
    let dir = test_tmp_dir(name);
    chmod(&dir, 0o755);
    dir
}

/// Copies `src` to `dir/name` with `mode`.
fn copy_as(src: &Path, dir: &Path, name: &str, mode: u32) -> PathBuf {
    let to = dir.join(name);
    std::fs::copy(src, &to).unwrap();
    chmod(&to, mode);
    to
}

fn sha256(p: &Path) -> String {
    memplug_host::policy::sha256_hex(&mut std::fs::File::open(p).unwrap()).unwrap()
}

fn pinned(hash: &str) -> LoadOptions {
    LoadOptions { expected_sha256: Some(hash.into()), ..Default::default() }
}

/// True when the file at `p` (by device and inode, whatever name it was
/// mapped under) is mapped in this process.
fn mapped(p: &Path) -> bool {
    let md = std::fs::metadata(p).unwrap();
    inode_mapped(md.dev(), md.ino())
}

/// True when the file `(dev, ino)` is mapped in this process.
fn inode_mapped(dev: u64, ino: u64) -> bool {
    let want_dev = format!("{:02x}:{:02x}", libc::major(dev), libc::minor(dev));
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().any(|l| {
        // address perms offset dev inode [path]
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() >= 5 && f[3] == want_dev && f[4].parse::<u64>().ok() == Some(ino)
    })
}

fn assert_mentions(e: &LoadError, parts: &[&str]) {
    let text = e.to_string();
    for p in parts {
        assert!(text.contains(p), "message {text:?} does not mention {p:?}");
    }
}

/// Runs [`child_scenario`] in a fresh process of this test binary and
/// returns its standard output (it must succeed).
fn run_child(scenario: &str, cwd: &Path, env: &[(&str, &Path)]) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_scenario", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, scenario)
        .current_dir(cwd);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("re-run the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "child {scenario} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The value of `KEY=value` lines the child printed.
fn field<'a>(out: &'a str, key: &str) -> &'a str {
    let prefix = format!("{key}=");
    out.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("child printed no {key}:\n{out}"))
}

fn outcome(r: &Result<Plugin, LoadError>) -> String {
    match r {
        Ok(p) => format!("loaded {}", p.name()),
        Err(e) => format!("refused {e}"),
    }
}

fn env_path(key: &str) -> PathBuf {
    PathBuf::from(std::env::var_os(key).unwrap_or_else(|| panic!("{key} is not set")))
}

/// The child side of the scenarios; does nothing in a normal test run.
#[test]
fn child_scenario() {
    let Ok(scenario) = std::env::var(CHILD_ENV) else {
        return;
    };
    // Off the harness's "test child_scenario ... " line.
    println!();
    match scenario.as_str() {
        // cwd holds a good CPU plugin; LD_LIBRARY_PATH a world-writable
        // library of the same file name.
        "bare_name" => {
            let good = env_path("GOOD");
            let evil = env_path("EVIL");
            let bare = Plugin::load(CPU_FILE);
            println!("BARE={}", outcome(&bare));
            println!("BARE_GOOD_MAPPED={}", mapped(&good));
            println!("BARE_EVIL_MAPPED={}", mapped(&evil));
            drop(bare);
            let dotted = Plugin::load(format!("./{CPU_FILE}"));
            println!("DOTTED={}", outcome(&dotted));
            println!("DOTTED_GOOD_MAPPED={}", mapped(&good));
            println!("DOTTED_EVIL_MAPPED={}", mapped(&evil));
        }
        // Two different plugins, each pinned, loaded one after the other
        // while the first stays loaded: the second must be the second file
        // (a loader that reuses a descriptor number, and so a
        // `/proc/self/fd/N` name, must not be handed the first library).
        "two_pins" => {
            let first = env_path("FIRST");
            let second = env_path("SECOND");
            let a = Plugin::load_with(&first, &pinned(&sha256(&first)));
            println!("FIRST={}", outcome(&a));
            let b = Plugin::load_with(&second, &pinned(&sha256(&second)));
            println!("SECOND={}", outcome(&b));
            println!("SECOND_MAPPED={}", mapped(&second));
            // And once more without a pin, through the same path.
            let c = Plugin::load(&second);
            println!("THIRD={}", outcome(&c));
        }
        // A file loaded a second time while its first load lives makes
        // the loader keep the second `/proc/self/fd/N` as an alias of it; a
        // different file loaded later through a descriptor of the same
        // number must not be answered with that first library.
        "alias" => {
            let first = env_path("FIRST");
            let second = env_path("SECOND");
            let a = Plugin::load(&first);
            println!("A={}", outcome(&a));
            let again = Plugin::load(&first);
            println!("AGAIN={}", outcome(&again));
            drop(again);
            let b = Plugin::load(&second);
            println!("B={}", outcome(&b));
            println!("B_MAPPED={}", mapped(&second));
        }
        other => panic!("unknown scenario {other}"),
    }
}

#[test]
fn a_bare_name_never_loads_a_library_found_elsewhere() {
    let a = private_dir("bare_good");
    let good = copy_as(&cpu_plugin(), &a, CPU_FILE, 0o755);
    // A different library, world-writable, in a world-writable directory,
    // under the same file name, on LD_LIBRARY_PATH.
    let b = test_tmp_dir("bare_evil");
    chmod(&b, 0o777);
    let evil = copy_as(&c_example("bare_evil"), &b, CPU_FILE, 0o666);
    let out = run_child("bare_name", &a, &[("LD_LIBRARY_PATH", &b), ("GOOD", &good), ("EVIL", &evil)]);
    assert_eq!(field(&out, "BARE_EVIL_MAPPED"), "false", "{out}");
    let bare = field(&out, "BARE");
    // The rule: a bare name is refused, with the path to give instead.
    assert!(bare.starts_with("refused"), "{out}");
    assert!(bare.contains(&format!("./{CPU_FILE}")), "{out}");
    assert_eq!(field(&out, "BARE_GOOD_MAPPED"), "false", "{out}");
    // The same file named as a path loads, and it is the file checked.
    assert_eq!(field(&out, "DOTTED"), "loaded memplug-cpu", "{out}");
    assert_eq!(field(&out, "DOTTED_GOOD_MAPPED"), "true", "{out}");
    assert_eq!(field(&out, "DOTTED_EVIL_MAPPED"), "false", "{out}");
    chmod(&b, 0o755);
}

#[test]
fn a_bare_name_is_refused_saying_which_path_to_give() {
    let e = Plugin::load(CPU_FILE).unwrap_err();
    assert!(matches!(e, LoadError::Policy { .. }), "{e}");
    assert_mentions(&e, &[CPU_FILE, &format!("./{CPU_FILE}")]);
}

#[test]
fn each_pinned_load_maps_the_file_whose_bytes_were_hashed() {
    let dir = private_dir("two_pins");
    let first = copy_as(&cpu_plugin(), &dir, "libfirst.so", 0o755);
    let second = copy_as(&c_example("two_pins"), &dir, "libsecond.so", 0o755);
    let out = run_child("two_pins", &dir, &[("FIRST", &first), ("SECOND", &second)]);
    assert_eq!(field(&out, "FIRST"), "loaded memplug-cpu", "{out}");
    assert_eq!(field(&out, "SECOND"), format!("loaded {C_EXAMPLE_NAME}"), "{out}");
    assert_eq!(field(&out, "SECOND_MAPPED"), "true", "{out}");
    assert_eq!(field(&out, "THIRD"), format!("loaded {C_EXAMPLE_NAME}"), "{out}");
}

#[test]
fn a_descriptor_name_the_loader_saw_before_never_loads_the_old_library() {
    let dir = private_dir("alias");
    let first = copy_as(&cpu_plugin(), &dir, "libfirst.so", 0o755);
    let second = copy_as(&c_example("alias"), &dir, "libsecond.so", 0o755);
    let out = run_child("alias", &dir, &[("FIRST", &first), ("SECOND", &second)]);
    assert_eq!(field(&out, "A"), "loaded memplug-cpu", "{out}");
    assert_eq!(field(&out, "AGAIN"), "loaded memplug-cpu", "{out}");
    assert_eq!(field(&out, "B"), format!("loaded {C_EXAMPLE_NAME}"), "{out}");
    assert_eq!(field(&out, "B_MAPPED"), "true", "{out}");
}

#[test]
fn a_pinned_plugin_is_mapped_from_the_hashed_inode() {
    let dir = private_dir("pin_inode");
    let so = copy_as(&cpu_plugin(), &dir, "libpinned.so", 0o755);
    let p = Plugin::load_with(&so, &pinned(&sha256(&so))).expect("matching pin loads");
    assert_eq!(p.name(), "memplug-cpu");
    assert!(mapped(&so), "the pinned file's inode is not in /proc/self/maps");
    let e = Plugin::load_with(&so, &pinned(&"0".repeat(64))).unwrap_err();
    assert!(matches!(e, LoadError::Policy { .. }), "{e}");
    assert_mentions(&e, &["SHA-256 mismatch", &sha256(&so)]);
}

#[test]
fn the_file_checked_is_the_file_loaded_even_if_its_name_changes_hands() {
    let dir = private_dir("swap");
    let so = copy_as(&cpu_plugin(), &dir, "libswap.so", 0o755);
    let other = copy_as(&c_example("swap"), &dir, "libother.so", 0o755);
    let checked = memplug_host::policy::open_checked(&so, &pinned(&sha256(&so))).expect("checks pass");
    let md = std::fs::metadata(&so).unwrap();
    assert_eq!(checked.real_path(), so.canonicalize().unwrap());
    // The name now names another library.
    std::fs::rename(&other, &so).unwrap();
    // SAFETY: the workspace's CPU plugin.
    let lib = unsafe { checked.dlopen() }.expect("loads");
    assert!(inode_mapped(md.dev(), md.ino()), "the checked (and hashed) inode is not mapped");
    assert!(!mapped(&so), "the library now at the checked name was mapped");
    drop(lib);
}

#[test]
fn a_file_writable_by_others_is_refused() {
    let dir = private_dir("file_writable");
    let so = copy_as(&cpu_plugin(), &dir, "libw.so", 0o666);
    let e = Plugin::load(&so).unwrap_err();
    assert!(matches!(e, LoadError::Policy { .. }), "{e}");
    assert_mentions(&e, &["libw.so", "666", "writable by others"]);
    let allow = LoadOptions { allow_writable_by_others: true, ..Default::default() };
    Plugin::load_with(&so, &allow).expect("explicitly allowed");
}

#[test]
fn a_path_through_a_world_writable_directory_is_refused() {
    let dir = test_tmp_dir("dir_writable");
    chmod(&dir, 0o777);
    let so = copy_as(&cpu_plugin(), &dir, "libd.so", 0o755);
    let e = Plugin::load(&so).unwrap_err();
    assert!(matches!(e, LoadError::Policy { .. }), "{e}");
    assert_mentions(&e, &["777", "writable by others"]);
    // A sticky world-writable directory (like /tmp) is acceptable: others
    // can add files there but not replace this one.
    chmod(&dir, 0o1777);
    Plugin::load(&so).expect("sticky directory");
    chmod(&dir, 0o755);
}

#[test]
fn a_symlink_is_checked_where_it_lives_and_where_it_points() {
    // A private link to a file in a world-writable directory.
    let open = test_tmp_dir("link_target_open");
    chmod(&open, 0o777);
    let target = copy_as(&cpu_plugin(), &open, "libt.so", 0o755);
    let private = private_dir("link_private");
    let link = private.join("liblink.so");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let e = Plugin::load(&link).unwrap_err();
    assert_mentions(&e, &["777", "writable by others"]);
    chmod(&open, 0o755);
    // A link in a world-writable directory (anyone may re-point it) to a
    // good file.
    let good_dir = private_dir("link_target_good");
    let good = copy_as(&cpu_plugin(), &good_dir, "libg.so", 0o755);
    let shared = test_tmp_dir("link_in_open_dir");
    chmod(&shared, 0o777);
    let link = shared.join("liblink.so");
    std::os::unix::fs::symlink(&good, &link).unwrap();
    let e = Plugin::load(&link).unwrap_err();
    assert!(matches!(e, LoadError::Policy { .. }), "{e}");
    assert_mentions(&e, &["777", "writable by others"]);
    chmod(&shared, 0o755);
    Plugin::load(&link).expect("the same link in a private directory");
}

#[test]
fn what_is_not_a_regular_file_is_refused_without_blocking() {
    let dir = private_dir("not_regular");
    let e = Plugin::load(&dir).unwrap_err();
    assert!(matches!(e, LoadError::NotALibrary { .. }), "{e}");
    assert_mentions(&e, &["not a regular file"]);
    // A FIFO: opening it for reading must not wait for a writer.
    let fifo = dir.join("libfifo.so");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(Plugin::load(&fifo).map(|p| p.name().to_string()).map_err(|e| e.to_string()));
    });
    let r = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("loading a FIFO blocked");
    let e = r.unwrap_err();
    assert!(e.contains("not a regular file"), "{e}");
}

#[test]
fn a_missing_file_is_not_found() {
    let e = Plugin::load("/nonexistent/libnothing.so").unwrap_err();
    assert!(matches!(e, LoadError::NotFound(_)), "{e}");
    assert_mentions(&e, &["/nonexistent/libnothing.so", "does not exist"]);
}

/// Whether a descriptor of this process refers to `(dev, ino)`.
fn inode_held_open(dev: u64, ino: u64) -> bool {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .any(|e| std::fs::metadata(e.path()).is_ok_and(|m| m.dev() == dev && m.ino() == ino))
}

#[test]
fn a_library_the_loader_keeps_mapped_after_unload_keeps_its_inode_pinned() {
    // A CPU plugin instance that ran a stream: its worker thread's
    // thread-local destructors keep glibc from unmapping the library at
    // dlclose. If its file were then deleted and the inode reused, the
    // next file with that inode would be answered with this library.
    let dir = private_dir("pin-after-unload");
    let lib = copy_as(&cpu_plugin(), &dir, "libmemplug_plugin_cpu_pin.so", 0o755);
    let md = std::fs::metadata(&lib).unwrap();
    let (dev, ino) = (md.dev(), md.ino());
    let p = Plugin::load(&lib).unwrap();
    let m = p.mechanism("cpu").unwrap().clone();
    let sync = m.sync().unwrap();
    let s = sync.stream_create().unwrap();
    sync.enqueue(&s, || {}).unwrap();
    sync.stream_destroy(s).unwrap();
    drop(m);
    p.unload().unwrap();
    std::fs::remove_file(&lib).unwrap();
    if inode_mapped(dev, ino) {
        assert!(
            inode_held_open(dev, ino),
            "the library is still mapped after unload, but no descriptor pins its inode: a new file could reuse it"
        );
    } else {
        assert!(!inode_held_open(dev, ino), "unmapped, so nothing need stay open");
    }
}
