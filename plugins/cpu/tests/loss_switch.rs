//! The test-only loss switch `memplug_cpu_test_report_loss` (see the
//! plugin's `test_switches` module): off unless `MEMPLUG_CPU_TEST_SWITCHES=1`
//! was set when the plugin instance was built; on, it reports the mechanism
//! lost through the plugin's `HostLink`.
//!
//! Each scenario runs in a child process of this test binary: the switch
//! reads the environment when the instance is built, and a lost mechanism
//! stays lost for the life of the instance. The child loads the cdylib with
//! the host and opens the same file with `libloading` (the same library,
//! so the same instance) for the switch and for a second, raw host that
//! calls the slots directly — the host itself refuses every call into a
//! lost mechanism, so only a raw caller sees what the plugin answers.

mod common;

use common::*;
use libloading::{Library, Symbol};
use memplug_host::{LifeState, Plugin};
use memplug_plugin_cpu::test_switches::{LOSS_REASON, SWITCHES_ENV};
use memplug_test_support::find_cdylib;
use std::path::PathBuf;
use std::process::Command;

const CHILD_ENV: &str = "MEMPLUG_CPU_LOSS_CHILD";

type SwitchFn = unsafe extern "C" fn(u64) -> MemplugStatus;

fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

fn plugin_path() -> PathBuf {
    find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN")
}

/// Runs the ignored test `name` of this binary in a child, with
/// `MEMPLUG_CPU_TEST_SWITCHES` set to `switches` (or removed); asserts it
/// passed and printed `marker`.
fn run_child(name: &str, switches: Option<&str>, marker: &str) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([name, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env("MEMPLUG_CPU_PLUGIN", plugin_path());
    match switches {
        Some(v) => cmd.env(SWITCHES_ENV, v),
        None => cmd.env_remove(SWITCHES_ENV),
    };
    let out = cmd.output().expect("spawn the child test");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "child {name} ({SWITCHES_ENV}={switches:?}) failed ({}):\n{text}",
        out.status
    );
    assert!(text.contains("1 passed"), "child {name} ran no test:\n{text}");
    assert!(text.contains(marker), "child {name} did not get to {marker}:\n{text}");
}

/// The library the host loaded, opened again by path: `dlopen` hands back
/// the same library, so these symbols are the loaded instance's.
struct Same {
    lib: Library,
}

impl Same {
    fn open() -> Same {
        // SAFETY: the CPU plugin's cdylib, already loaded by the host.
        Same { lib: unsafe { Library::new(plugin_path()) }.expect("dlopen the plugin again") }
    }

    fn switch(&self, mechanism_id: u64) -> MemplugStatus {
        // SAFETY: the switch's documented C signature.
        let f: Symbol<SwitchFn> =
            unsafe { self.lib.get(b"memplug_cpu_test_report_loss") }.expect("the switch is exported");
        unsafe { f(mechanism_id) }
    }

    /// A second host that agrees on the newest minor (1.2 or later) without
    /// services, calling the slots of the same instance directly.
    fn raw_host(&self) -> Api {
        // SAFETY: the entry symbol's ABI type.
        let entry: Symbol<MemplugEntryV1> = unsafe { self.lib.get(b"memplug_plugin_v1") }.unwrap();
        let n = negotiate(*entry, &host_info(MEMPLUG_ABI_MAJOR, 0, MEMPLUG_ABI_MINOR)).expect("negotiation");
        assert_eq!(n.agreed_minor, MEMPLUG_ABI_MINOR, "the CPU plugin speaks the newest minor");
        Api::from_descriptor(unsafe { &*n.plugin })
    }
}

#[test]
fn the_loss_switch_is_off_unless_the_environment_turned_it_on_at_build() {
    if is_child() {
        return;
    }
    run_child("child_switch_off", None, "SWITCH OFF OK");
    // Only "1" turns it on.
    run_child("child_switch_off", Some("0"), "SWITCH OFF OK");
    run_child("child_switch_off", Some("yes"), "SWITCH OFF OK");
}

#[test]
fn the_loss_switch_on_loses_the_mechanism_for_the_host_and_every_slot() {
    if is_child() {
        return;
    }
    run_child("child_switch_on", Some("1"), "SWITCH ON OK");
}

#[test]
#[ignore = "run by the_loss_switch_is_off_unless_the_environment_turned_it_on_at_build in a child process"]
fn child_switch_off() {
    if !is_child() {
        return;
    }
    let same_before = Same::open();
    // No instance built yet: refused.
    assert_eq!(same_before.switch(1), MEMPLUG_STATUS_INVALID_STATE);
    // The copy of the plugin linked into this test binary has no instance either.
    assert_eq!(memplug_plugin_cpu::memplug_cpu_test_report_loss(1), MEMPLUG_STATUS_INVALID_STATE);

    let p = Plugin::load(plugin_path()).expect("load the CPU plugin");
    assert_eq!(p.abi_version(), (1, memplug_host::HOST_MAX_MINOR));
    let m = p.mechanism("cpu").unwrap().clone();
    let same = Same::open();
    assert_eq!(same.switch(1), MEMPLUG_STATUS_INVALID_STATE, "built without switches: refused");
    // Read when the instance was built, not later.
    std::env::set_var(SWITCHES_ENV, "1");
    assert_eq!(same.switch(1), MEMPLUG_STATUS_INVALID_STATE, "turned on after the build: still refused");
    assert_eq!(same.switch(999), MEMPLUG_STATUS_INVALID_STATE, "refused before the id is even looked at");

    // Nothing was lost: the host and the plugin both still serve.
    assert_eq!(m.life_state(), LifeState::Active);
    let stats = p.service_stats();
    assert_eq!((stats.losses, stats.repeats, stats.refused), (0, 0, 0), "{stats:?}");
    let a = unsafe { m.ungoverned() }.allocator();
    let block = a.allocate(4096, 64).expect("allocate through the host");
    a.deallocate(block).expect("deallocate through the host");
    assert!(m.memory_info().unwrap().is_ok());
    let raw = same.raw_host();
    let r = raw.allocate(64, 16).expect("a raw slot still works");
    raw.deallocate(&r).unwrap();
    println!("SWITCH OFF OK");
    std::mem::forget(p);
}

#[test]
#[ignore = "run by the_loss_switch_on_loses_the_mechanism_for_the_host_and_every_slot in a child process"]
fn child_switch_on() {
    if !is_child() {
        return;
    }
    assert_eq!(std::env::var(SWITCHES_ENV).as_deref(), Ok("1"));
    let p = Plugin::load(plugin_path()).expect("load the CPU plugin");
    assert_eq!(p.abi_version(), (1, memplug_host::HOST_MAX_MINOR));
    let m = p.mechanism("cpu").unwrap().clone();
    let same = Same::open();
    let raw = same.raw_host();
    let page = raw.properties().unwrap().granularity;

    // Objects alive when the loss comes: one the host made, one the raw host made.
    let a = unsafe { m.ungoverned() }.allocator();
    let host_block = a.allocate(4096, 64).expect("allocate through the host");
    let raw_block = raw.allocate(4096, 64).expect("raw allocate");
    let live = raw.live();
    assert!(live >= 2, "the raw host sees the host's instance: {live} live objects");

    // An id no mechanism has: refused, nothing lost.
    assert_eq!(same.switch(999), MEMPLUG_STATUS_WRONG_MECHANISM);
    assert_eq!(m.life_state(), LifeState::Active);
    assert_eq!(p.service_stats().losses, 0);

    assert_eq!(same.switch(1), MEMPLUG_STATUS_OK);
    assert_eq!(m.life_state(), LifeState::Lost);
    let reason = m.life_reason().expect("a lost context keeps its reason");
    assert!(reason.contains(LOSS_REASON), "{reason}");
    let stats = p.service_stats();
    assert_eq!((stats.losses, stats.repeats, stats.refused), (1, 0, 0), "{stats:?}");

    // A second report changes nothing.
    assert_eq!(same.switch(1), MEMPLUG_STATUS_OK);
    let stats = p.service_stats();
    assert_eq!((stats.losses, stats.repeats), (1, 1), "{stats:?}");

    // The host refuses every call into the mechanism.
    assert_eq!(m.memory_info().unwrap().unwrap_err().status, Status::DeviceLost);
    assert_eq!(a.allocate(4096, 64).unwrap_err().status, Status::DeviceLost);
    let e = a.deallocate(host_block).unwrap_err();
    assert_eq!(e.error.status, Status::DeviceLost, "{}", e.error);
    let _ = e.object.into_raw();

    // Every slot of the plugin answers DEVICE_LOST, without the CPU code
    // running (nothing is made or freed).
    for (what, r) in [
        ("properties", raw.properties().map(drop)),
        ("memory_info", raw.memory_info().map(drop)),
        ("allocate", raw.allocate(64, 16).map(drop)),
        ("deallocate", raw.deallocate(&raw_block)),
        ("reserve", raw.reserve(page).map(drop)),
        ("create", raw.create(page).map(drop)),
        ("stream_create", raw.stream_create().map(drop)),
    ] {
        let msg = refused(r, Status::DeviceLost);
        assert!(msg.contains("reported lost"), "{what}: {msg}");
    }
    assert_eq!(raw.live(), live, "a lost mechanism's slots made or freed nothing");
    println!("SWITCH ON OK");
    std::mem::forget(p);
}
