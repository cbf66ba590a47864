//! The compatibility matrix: every host this project can meet × every kind of
//! plugin, each cell negotiated, checked as far as both versions allow, and
//! labelled with what it degraded to.
//!
//! Hosts:
//! * **C host 1.0**: `abi-tests/c/matrix_host.c`, compiled against the frozen
//!   1.0 header (`abi-tests/frozen/1.0/memplug.h`): dlopen, negotiate
//!   1.0..=1.0, prefix reads, the 1.0 checks, one line per check.
//! * **Rust host 1.1**: the current `memplug-host` (`Plugin::load`), with
//!   host-level checks (allocate, virtual backing, export/import through
//!   `SharedMappingApi`, unload) and the vendor conformance kit
//!   (`memplug-conformance`) on the same library.
//!
//! Plugins: the Rust CPU plugin (1.0..=1.1), the C example built against the
//! 1.0 header and against the current header (it speaks 1.0 either way),
//! a simulated future plugin (`abi-tests/c/future_plugin.c`: 1.0..=1.2,
//! every struct longer than any header, unknown capability bits), and a
//! library exporting `memplug_plugin_v1` and `memplug_plugin_v2`
//! (`abi-tests/c/two_majors.c`: a major-1 host must pick v1).
//!
//! The table is written to stdout directly (not through the test harness's
//! capture, so it shows without `--nocapture`) and to
//! `target/tmp/compat-matrix.txt`; every cell is also asserted.
//!
//! Further tests here: the current host refuses the 1.1 capability claimed
//! above the agreed minor, with a short table, or without shared mapping;
//! pinned to 1.0 it degrades export/import to an explicit `Unsupported`;
//! and a binding's allocation class reaches the plugin as the 1.1 tag only
//! when 1.1 was agreed.

use memplug_host::governor::AllocationClass;
use memplug_host::{
    Access, BindingSpec, LoadError, LoadOptions, Mechanism, Plugin, ProcessMemoryManager, Requirements,
    Status,
};
use memplug_plugin_cpu::live_physical_objects;
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use memplug_sdk::RequestClass;
use memplug_test_support::{
    compile_c_plugin, exported_symbols, find_cdylib, include_dir, repo_root, run_tool, target_dir,
    test_tmp_dir, C_PLUGIN_FLAGS, STRICT_WARNINGS,
};
use std::io::Write as _;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

fn frozen_1_0() -> PathBuf {
    repo_root().join("abi-tests/frozen/1.0")
}

fn c_dir() -> PathBuf {
    repo_root().join("abi-tests/c")
}

/// A plugin compiled with the strict plugin flags against the header in
/// `include` (plus `-g`, so the library could be inspected).
fn compile_plugin_against(src: &Path, include: &Path, defines: &[&str], out_name: &str) -> PathBuf {
    let out = test_tmp_dir(out_name).join(memplug_test_support::cdylib_file_name(out_name));
    let mut cmd = Command::new("gcc");
    cmd.args(C_PLUGIN_FLAGS)
        .arg("-I")
        .arg(include)
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg(src)
        .arg("-o")
        .arg(&out)
        .arg("-lpthread");
    run_tool(cmd);
    out
}

fn future_plugin(variant: Option<&str>) -> PathBuf {
    let name = match variant {
        Some(v) => format!("memplug_future_{}", v.to_ascii_lowercase()),
        None => "memplug_future".into(),
    };
    compile_c_plugin(&c_dir().join("future_plugin.c"), &variant.into_iter().collect::<Vec<_>>(), &name)
}

/// What a plugin is expected to do in each row.
struct Subject {
    label: &'static str,
    path: PathBuf,
    /// Minor agreed with the current (1.1) Rust host.
    rust_agreed: u32,
    /// The plugin's own range, as its descriptor states it.
    range: (u32, u32),
}

fn subjects() -> Vec<Subject> {
    let example = repo_root().join("c-examples/plugin/example_plugin.c");
    let cpu = find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN");
    // Compile the C plugins side by side (each is one gcc run).
    let (ex10, ex11, future, two) = std::thread::scope(|s| {
        let a = s.spawn(|| compile_plugin_against(&example, &frozen_1_0(), &[], "memplug_example_h10"));
        let b = s.spawn(|| compile_plugin_against(&example, &include_dir(), &[], "memplug_example_h11"));
        let c = s.spawn(|| future_plugin(None));
        let d = s.spawn(|| compile_c_plugin(&c_dir().join("two_majors.c"), &[], "memplug_two_majors"));
        (a.join().unwrap(), b.join().unwrap(), c.join().unwrap(), d.join().unwrap())
    });
    vec![
        Subject { label: "Rust CPU plugin", path: cpu, rust_agreed: 1, range: (0, 1) },
        Subject { label: "C example, 1.0 header", path: ex10, rust_agreed: 0, range: (0, 0) },
        Subject { label: "C example, 1.1 header", path: ex11, rust_agreed: 0, range: (0, 0) },
        Subject { label: "future plugin (1.0..=1.2)", path: future, rust_agreed: 1, range: (0, 2) },
        Subject { label: "two majors (v1 + v2)", path: two, rust_agreed: 0, range: (0, 0) },
    ]
}

/// One cell of the table.
struct Cell {
    host: &'static str,
    plugin: &'static str,
    agreed: String,
    checks: String,
    degraded: Vec<String>,
    problems: Vec<String>,
}

// ---- the C host, frozen at 1.0 ----

fn build_matrix_host() -> PathBuf {
    let exe = test_tmp_dir("matrix_host").join("matrix_host");
    let mut cmd = Command::new("gcc");
    cmd.arg("-std=c99")
        .args(STRICT_WARNINGS)
        .arg("-I")
        .arg(frozen_1_0())
        .arg(c_dir().join("matrix_host.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-ldl");
    run_tool(cmd);
    exe
}

fn spawn_c_host(host: &Path, plugin: &Path) -> Child {
    Command::new(host)
        .arg(plugin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", host.display()))
}

fn c_host_cell(s: &Subject, child: Child) -> Cell {
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let mut cell = Cell {
        host: "C host, 1.0 header",
        plugin: s.label,
        agreed: "-".into(),
        checks: String::new(),
        degraded: Vec::new(),
        problems: Vec::new(),
    };
    let lines: Vec<Vec<&str>> =
        stdout.lines().filter(|l| l.starts_with("check\t")).map(|l| l.splitn(4, '\t').collect()).collect();
    let outcome = |name: &str| lines.iter().find(|l| l[1] == name).map(|l| l[2]);
    let detail = |name: &str| lines.iter().find(|l| l[1] == name).map(|l| l[3]).unwrap_or("");
    let count = |o: &str| lines.iter().filter(|l| l[2] == o).count();
    if !out.status.success() || !stdout.lines().any(|l| l.starts_with("summary\tpass")) {
        cell.problems.push(format!("matrix_host failed ({}):\n{stdout}{stderr}", out.status));
    }
    if let Some(d) = detail("negotiate").strip_prefix("agreed ") {
        cell.agreed = d.split_whitespace().next().unwrap_or("?").into();
    }
    if cell.agreed != "1.0" {
        cell.problems.push(format!("agreed {} with a 1.0 host", cell.agreed));
    }
    for l in lines.iter().filter(|l| l[2] == "fail") {
        cell.problems.push(format!("{}: {}", l[1], l[3]));
    }
    cell.checks = format!("{} pass, {} skip", count("pass"), count("skip"));
    // What a 1.0 host must see of each plugin.
    let expect = |cell: &mut Cell, name: &str, want: Option<&str>| {
        let got = outcome(name);
        if got != want {
            cell.problems.push(format!("check {name}: expected {want:?}, got {got:?} ({})", detail(name)));
        }
    };
    expect(&mut cell, "export_import", Some("degraded"));
    expect(&mut cell, "class_tag", Some("degraded"));
    let newer = s.range.1 > 0;
    expect(&mut cell, "negotiate.newer_plugin", newer.then_some("degraded"));
    if newer {
        cell.degraded.push(format!("plugin's 1.{} used as 1.0", s.range.1));
    }
    match s.label {
        "Rust CPU plugin" => {
            // The SDK answers a 1.0 host with its 1.0 view: no bit the host
            // cannot know, everything of 1.0 usable.
            expect(&mut cell, "capabilities.unknown_bits", None);
            expect(&mut cell, "shared_mapping", Some("pass"));
            expect(&mut cell, "sync", Some("pass"));
            cell.degraded.push("the plugin's 1.0 view (no 1.1 bit, 1.0 tables)".into());
        }
        "future plugin (1.0..=1.2)" => {
            expect(&mut cell, "capabilities.unknown_bits", Some("degraded"));
            cell.degraded.push(format!(
                "longer structs read as 1.0 prefixes; {}",
                detail("capabilities.unknown_bits")
            ));
        }
        "two majors (v1 + v2)" => {
            if stderr.contains("memplug_plugin_v2 called") {
                cell.problems.push("the 1.0 host called memplug_plugin_v2".into());
            }
            cell.degraded.push("memplug_plugin_v1 used; v2 is beyond this host".into());
        }
        _ => {}
    }
    cell.degraded.push("export/import: unavailable to a 1.0 host".into());
    cell.degraded.push("class tag: not sent (1.0 requests)".into());
    cell
}

// ---- the current Rust host ----

/// Host-level checks of one mechanism; returns what it degraded to.
fn host_checks(m: &Mechanism, agreed: u32, problems: &mut Vec<String>) -> Vec<String> {
    let mut degraded = Vec::new();
    let mut fail = |what: String| problems.push(format!("mechanism '{}': {what}", m.name()));
    let caps = m.capabilities();
    if caps.unknown_bits() != 0 {
        degraded.push(format!("ignored unknown capability bits {:#x}", caps.unknown_bits()));
    }
    match unsafe { m.ungoverned() }.allocator().allocate_as(64, 16, AllocationClass::Kv) {
        Ok(a) => {
            // SAFETY: a live CPU allocation of at least 64 bytes.
            unsafe { std::ptr::write_bytes(a.addr() as *mut u8, 0x5a, 64) };
            if let Err(e) = unsafe { m.ungoverned() }.allocator().deallocate(a) {
                fail(format!("deallocate: {}", e.error));
            }
        }
        Err(e) => fail(format!("allocate: {e}")),
    }
    if let Some(vb) = unsafe { m.ungoverned() }.virtual_backing() {
        let g = m.properties().granularity;
        match vb.reserve(4 * g) {
            Ok(r) => {
                let ok = vb.commit(&r, 0, g).and_then(|()| vb.committed_bytes(&r));
                if !matches!(ok, Ok(n) if n == g) {
                    fail(format!("commit/committed_bytes: {ok:?}"));
                }
                if let Err(e) = vb.release(r) {
                    fail(format!("release: {}", e.error));
                }
            }
            Err(e) => fail(format!("reserve: {e}")),
        }
    }
    match unsafe { m.ungoverned() }.shared_mapping() {
        None if agreed == 0 => {
            degraded.push("export/import: unsupported by 1.0 peer (and no shared mapping)".into())
        }
        None => degraded.push("export/import: absent (the plugin has no shared mapping)".into()),
        Some(sm) if !sm.can_export() => {
            // Explicit absence: Unsupported, never a no-op.
            match sm.create(m.properties().granularity) {
                Ok(obj) => {
                    match sm.export_fd(&obj) {
                        Err(e) if e.status == Status::Unsupported => {
                            degraded.push(format!("export/import: unsupported ({})", e.message))
                        }
                        other => fail(format!("export_fd without the capability: {other:?}")),
                    }
                    let _ = sm.release(obj);
                }
                Err(e) => fail(format!("create: {e}")),
            }
        }
        Some(_) => match export_import_round_trip(m) {
            Ok(()) => degraded.push("export/import: shared across descriptors".into()),
            Err(e) => fail(format!("export/import: {e}")),
        },
    }
    degraded.push(
        if agreed >= 1 { "class tag: sent (1.1 requests)" } else { "class tag: not sent (1.0 peer)" }.into(),
    );
    degraded
}

/// Create → map → write → export → import → map → read through the host.
fn export_import_round_trip(m: &Mechanism) -> Result<(), String> {
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let vb = unsafe { m.ungoverned() }.virtual_backing().ok_or("no virtual backing to map into")?;
    let g = m.properties().granularity;
    let a = sm.create_as(g, AllocationClass::Weights).map_err(|e| e.to_string())?;
    let ra = vb.reserve(g).map_err(|e| e.to_string())?;
    sm.map(&a, 0, &ra, 0, g, Access::ReadWrite).map_err(|e| e.to_string())?;
    // SAFETY: `ra` maps `a` read-write over `g` bytes.
    unsafe { std::ptr::copy_nonoverlapping(b"matrix".as_ptr(), ra.addr() as *mut u8, 6) };
    let fd = sm.export_fd(&a).map_err(|e| e.to_string())?;
    let b = sm.import_fd(fd.as_fd(), g).map_err(|e| e.to_string())?;
    drop(fd);
    let rb = vb.reserve(g).map_err(|e| e.to_string())?;
    sm.map(&b, 0, &rb, 0, g, Access::ReadOnly).map_err(|e| e.to_string())?;
    // SAFETY: `rb` maps `b` readable over `g` bytes.
    let seen = unsafe { std::slice::from_raw_parts(rb.addr() as *const u8, 6) }.to_vec();
    sm.unmap(&rb, 0, g).map_err(|e| e.to_string())?;
    sm.unmap(&ra, 0, g).map_err(|e| e.to_string())?;
    vb.release(rb).map_err(|e| e.error.to_string())?;
    vb.release(ra).map_err(|e| e.error.to_string())?;
    sm.release(a).map_err(|e| e.error.to_string())?;
    sm.release(b).map_err(|e| e.error.to_string())?;
    if seen != b"matrix" {
        return Err(format!("the imported object reads {seen:?}"));
    }
    Ok(())
}

fn rust_host_cell(s: &Subject) -> Cell {
    let mut cell = Cell {
        host: "Rust host, 1.1",
        plugin: s.label,
        agreed: "-".into(),
        checks: String::new(),
        degraded: Vec::new(),
        problems: Vec::new(),
    };
    let plugin = match Plugin::load(&s.path) {
        Ok(p) => p,
        Err(e) => {
            cell.problems.push(format!("load: {e}"));
            return cell;
        }
    };
    let (_, agreed) = plugin.abi_version();
    cell.agreed = format!("1.{agreed}");
    if agreed != s.rust_agreed || plugin.plugin_minor_range() != s.range {
        cell.problems.push(format!(
            "agreed 1.{agreed} with a plugin declaring {:?}; expected 1.{} and {:?}",
            plugin.plugin_minor_range(),
            s.rust_agreed,
            s.range
        ));
    }
    if s.range.1 > 1 {
        cell.degraded.push(format!("plugin's 1.{} used as 1.1", s.range.1));
    }
    if s.label.starts_with("two majors") {
        let syms = exported_symbols(&s.path);
        if !(syms.contains("memplug_plugin_v1") && syms.contains("memplug_plugin_v2")) {
            cell.problems.push(format!("the library does not export both entries: {syms:?}"));
        }
        // Loading succeeded with a major-1 descriptor: v1 was used (v2
        // refuses a major-1 host, so picking it fails the load).
        cell.degraded.push("memplug_plugin_v1 used (newest major this host knows); v2 ignored".into());
    }
    for m in plugin.mechanisms() {
        cell.degraded.extend(host_checks(m, agreed, &mut cell.problems));
    }
    if let Err(refused) = plugin.unload() {
        cell.problems.push(format!("unload refused: {}", refused.report));
    }
    // The conformance kit on the same library (the same instance: objects
    // of the host's checks are all released above).
    let opts = memplug_conformance::Options { threads: 2, iterations: 200, ..Default::default() };
    match memplug_conformance::run(&s.path, &opts) {
        Ok(report) => {
            use memplug_conformance::Outcome;
            for f in report.failures() {
                cell.problems.push(format!(
                    "conformance {} ({}): {}",
                    f.name,
                    f.mechanism.as_deref().unwrap_or("-"),
                    f.detail
                ));
            }
            cell.checks = format!(
                "conformance {} pass, {} skip",
                report.count(Outcome::Pass),
                report.count(Outcome::Skip)
            );
            if report.abi.as_deref() != Some(cell.agreed.as_str()) {
                cell.problems.push(format!("conformance agreed {:?}, the host {}", report.abi, cell.agreed));
            }
        }
        Err(e) => cell.problems.push(format!("conformance: {e}")),
    }
    cell
}

fn table(cells: &[Cell]) -> String {
    let headers = ["host", "plugin", "ABI", "checks", "degraded to / noted"];
    let rows: Vec<[String; 5]> = cells
        .iter()
        .map(|c| {
            let status = if c.problems.is_empty() { "" } else { "FAILED: " };
            [
                c.host.to_string(),
                c.plugin.to_string(),
                c.agreed.clone(),
                format!("{status}{}", c.checks),
                c.degraded.join("; "),
            ]
        })
        .collect();
    let mut widths = headers.map(str::len);
    for r in &rows {
        for (w, v) in widths.iter_mut().zip(r) {
            *w = (*w).max(v.len());
        }
    }
    let line = |v: &[String]| {
        let mut s = String::from("|");
        for (w, x) in widths.iter().zip(v) {
            s += &format!(" {x:<w$} |");
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(&headers.map(String::from));
    out += &line(&widths.map(|w| "-".repeat(w)));
    for r in &rows {
        out += &line(r);
    }
    out
}

#[test]
fn compatibility_matrix() {
    let (host, subjects) = std::thread::scope(|s| {
        let h = s.spawn(build_matrix_host);
        let subjects = subjects();
        (h.join().unwrap(), subjects)
    });
    // The 1.0 host runs in its own processes while this one does the Rust
    // row, one plugin at a time.
    let children: Vec<Child> = subjects.iter().map(|s| spawn_c_host(&host, &s.path)).collect();
    let mut cells: Vec<Cell> = subjects.iter().map(rust_host_cell).collect();
    cells.extend(subjects.iter().zip(children).map(|(s, c)| c_host_cell(s, c)));

    let text = format!("\nmemplug compatibility matrix (ABI 1.1)\n\n{}", table(&cells));
    // Straight to the process's stdout: the harness captures only print!.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    let file = target_dir().join("tmp").join("compat-matrix.txt");
    let _ = std::fs::create_dir_all(file.parent().unwrap());
    let _ = std::fs::write(&file, &text);

    let problems: Vec<String> = cells
        .iter()
        .flat_map(|c| c.problems.iter().map(move |p| format!("[{} × {}] {p}", c.host, c.plugin)))
        .collect();
    assert!(problems.is_empty(), "{text}\n{}", problems.join("\n"));
    assert_eq!(cells.len(), 10, "2 hosts × 5 plugins");
}

// ---- the 1.1 rules, enforced by the current host ----

fn load_error(path: &Path, opts: &LoadOptions) -> String {
    match Plugin::load_with(path, opts) {
        Ok(p) => panic!("{} loaded as 1.{}; it must be refused", path.display(), p.abi_version().1),
        Err(e @ LoadError::CapabilityMismatch { .. }) => e.to_string(),
        Err(e) => panic!("refused for the wrong reason: {e}"),
    }
}

#[test]
fn the_host_refuses_a_1_1_capability_claimed_against_the_rules() {
    let (at_1_0, short, alone) = std::thread::scope(|s| {
        let a = s.spawn(|| future_plugin(Some("FUTURE_EXPORT_AT_1_0")));
        let b = s.spawn(|| future_plugin(Some("FUTURE_SHORT_EXPORT")));
        let c = s.spawn(|| future_plugin(Some("FUTURE_EXPORT_ALONE")));
        (a.join().unwrap(), b.join().unwrap(), c.join().unwrap())
    });
    let only_1_0 = LoadOptions { max_minor: 0, ..Default::default() };
    let msg = load_error(&at_1_0, &only_1_0);
    assert!(msg.contains("above the agreed minor") && msg.contains("MEMPLUG_CAP_SHARED_EXPORT"), "{msg}");
    // The same library at 1.1 is within the rules.
    let p = Plugin::load(&at_1_0).unwrap();
    assert!(p.mechanisms()[0].capabilities().shared_export());
    p.unload().unwrap();

    let msg = load_error(&short, &LoadOptions::default());
    assert!(msg.contains("too short") && msg.contains("48"), "{msg}");
    let msg = load_error(&alone, &LoadOptions::default());
    assert!(msg.contains("without MEMPLUG_CAP_SHARED_MAPPING"), "{msg}");
}

/// The in-process CPU plugin is one instance for the whole test binary, and
/// its class counts are process-wide: the tests using it take turns.
static IN_PROCESS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn cpu_in_process(max_minor: u32) -> Plugin {
    let opts = LoadOptions { max_minor, ..Default::default() };
    // SAFETY: the CPU plugin's own in-process entry.
    unsafe { Plugin::from_entry(memplug_plugin_cpu::cpu_plugin_entry, "cpu", &opts) }.unwrap()
}

#[test]
fn pinned_to_1_0_the_host_answers_export_and_import_with_unsupported() {
    let _turn = IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    let plugin = cpu_in_process(0);
    assert_eq!(plugin.abi_version(), (1, 0));
    let m = &plugin.mechanisms()[0];
    assert!(!m.capabilities().shared_export() && m.capabilities().shared_mapping());
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    assert!(!sm.can_export());
    let obj = sm.create(4096).unwrap();
    let e = sm.export_fd(&obj).unwrap_err();
    assert_eq!(e.status, Status::Unsupported);
    assert!(e.message.contains("agreed on ABI 1.0"), "{e}");
    let f = std::fs::File::open("/dev/null").unwrap();
    let e = sm.import_fd(f.as_fd(), 4096).unwrap_err();
    assert_eq!(e.status, Status::Unsupported);
    sm.release(obj).unwrap();
    plugin.unload().unwrap();
}

/// The one test here using the in-process CPU plugin's class counts (they
/// are process-wide): bindings tag what they make with their class, and the
/// plugin sees it, when 1.1 was agreed; a 1.0 plugin is sent no tag.
#[test]
fn a_binding_class_reaches_the_plugin_only_at_1_1() {
    let _turn = IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    for (minor, seen) in [(1, RequestClass::Kv), (0, RequestClass::Other)] {
        let manager = ProcessMemoryManager::new();
        manager.register_plugin(cpu_in_process(minor)).unwrap();
        let req = Requirements { virtual_backing: true, shared_mapping: true, sync: false };
        let context = manager.select(CPU0, req).unwrap();
        let pool = manager.create_pool("pool", 1 << 24).unwrap();
        let binding = manager.bind(&context, &pool, BindingSpec::new(AllocationClass::Kv)).unwrap();
        let before = live_physical_objects(seen);
        let prefix = binding.create_shared(4096, |_| {}).unwrap();
        assert_eq!(live_physical_objects(seen) - before, 1, "agreed 1.{minor}: the plugin saw {seen:?}");
        drop(prefix);
        manager.drain(std::time::Duration::from_secs(10));
        assert_eq!(live_physical_objects(seen), before, "released with the prefix");
    }
}
