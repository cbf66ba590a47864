//! The compatibility matrix: every host this project can meet × every kind of
//! plugin, each cell negotiated, checked as far as both versions allow, and
//! labelled with what it degraded to.
//!
//! Hosts:
//! * **C host 1.0** and **C host 1.1**: `abi-tests/c/matrix_host.c`, compiled
//!   against the frozen 1.0 and 1.1 headers (`abi-tests/frozen/1.x/memplug.h`):
//!   dlopen, negotiate 1.0..=1.x, prefix reads, the checks that minor allows
//!   (1.1: export/import, 48-byte class-tagged requests), one line per
//!   check. Their 24-byte host info has no `services` and ends at a
//!   PROT_NONE page, so a 1.2 plugin reading past it crashes the cell.
//! * **Rust host pinned to 1.1**: the current `memplug-host` with
//!   `LoadOptions { max_minor: 1, .. }` (it still passes its 1.2 host info,
//!   services included; a plugin that agreed on 1.1 must not use them, and
//!   the host refuses them if it does).
//! * **Rust host pinned to 1.2**: the current `memplug-host` with
//!   `max_minor: 2`, the 1.2-speaking negotiation a 1.3 plugin must still
//!   serve (no copy slot read, no copy spaces asked for).
//! * **Rust host 1.3**: the current `memplug-host` (`Plugin::load`), with
//!   host-level checks (allocate, virtual backing, export/import through
//!   `SharedMappingApi`, what the plugin did with the services, the 1.2
//!   memory descriptor, device identity and typed export, 1.3's
//!   stream-ordered copy, unload) and the vendor conformance kit
//!   (`memplug-conformance`) on the same library.
//!
//! (No C host is frozen at 1.2 yet: `matrix_host.c` speaks the 24-byte host
//! info of 1.0 and 1.1; the 1.2-speaking host is the pinned Rust one.)
//!
//! Plugins: the Rust CPU plugin (SDK, 1.0..=1.3), the C example (it speaks
//! 1.0) built against the 1.0 header and against the current header, a C
//! plugin released with 1.1 (`abi-tests/c/plugin_1_1.c`, built against the
//! frozen 1.1 header, 1.0..=1.1), one released with 1.2
//! (`abi-tests/c/plugin_1_2.c`, built against the frozen 1.2 header,
//! 1.0..=1.2: a 1.3 host agrees on 1.2 with it), a simulated future plugin
//! (`abi-tests/c/future_plugin.c`: 1.0..=1.4, every struct longer than any
//! header, unknown capability bits from its 1.2 view on, the 1.2 memory
//! descriptor and device identity in every view, the kit's device-loss
//! test trigger), the C full plugin (`c-examples/plugin/full_plugin.c`,
//! 1.0..=1.3: every capability but peer access, a descriptor per agreed
//! minor, the kit's device-loss test trigger), and a library exporting `memplug_plugin_v1` and
//! `memplug_plugin_v2` (`abi-tests/c/two_majors.c`: a major-1 host must pick
//! v1).
//!
//! Every cell asserts the agreed minor (the newest both speak), that the
//! plugin works (allocate/free, and the rest of what it publishes), what
//! the Rust host sees of 1.2's memory descriptor, device identity and
//! typed export (exactly what the plugin publishes when 1.2 was agreed —
//! the CPU plugin's, and the future plugin's, which it puts in every view
//! so that the rows below 1.2 show none of it read — and nothing below;
//! typed handles round-trip memory through `export_handle` and
//! `import_handle`), and whether services were offered and used: never
//! called unless a loss happens; in the Rust rows the future plugin's
//! trigger is pulled, and the loss reaches a 1.2 host through the services
//! (DEVICE_LOST from then on) but not a host pinned to 1.1 (no report;
//! DEVICE_UNAVAILABLE, never DEVICE_LOST).
//!
//! The table is written to stdout directly (not through the test harness's
//! capture, so it shows without `--nocapture`) and to
//! `target/tmp/compat-matrix.txt`; every cell is also asserted.
//!
//! Further tests here: the C hosts' fence catches a plugin reading
//! `services` past a 24-byte host info; SDK plugins in process, between
//! hosts of different minors (services reach only a host that agreed on
//! 1.2; a 1.1 SDK plugin takes none; the SDK reads `services` only where
//! `struct_size` covers it); the host refuses the services below 1.2 and
//! after unload; the current host refuses the 1.1 capability claimed above the
//! agreed minor, with a short table, or without shared mapping, and 1.2's
//! typed export likewise (and its slots published without the bit); pinned to
//! 1.0 it degrades export/import to an explicit `Unsupported`; a
//! binding's allocation class reaches the plugin as the 1.1 tag only when
//! 1.1 was agreed; and `stream_wait_fence` reaches the CPU plugin (a stream
//! really waits for another's fence) only at 1.2, the host answering it
//! `Unsupported` below (each Rust cell checks the same refusal, that no
//! plugin of the matrix shows peer access, and that queued binding shows
//! only where the CPU plugin claims it at 1.2).

use memplug_host::governor::AllocationClass;
use memplug_host::{
    Access, BindingSpec, Descriptor, DeviceIdentity, LifeState, LoadError, LoadOptions, Location, Mechanism,
    Plugin, ProcessMemoryManager, Requirements, ServiceStats, Status, HOST_MAX_MINOR,
};
use memplug_plugin_cpu::live_physical_objects;
use memplug_sdk::abi::*;
use memplug_sdk::RequestClass;
use memplug_test_support::{
    c_compiler, compile_c_plugin, exported_symbols, find_cdylib, include_dir, repo_root, run_tool,
    target_dir, test_tmp_dir, C_PLUGIN_FLAGS, STRICT_WARNINGS,
};
use std::io::Write as _;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

#[path = "compat_matrix/checks_1_2.rs"]
mod checks_1_2;
use checks_1_2::{abi_1_2_checks, cross_stream_wait, ordering_checks, refused_wait};
#[path = "compat_matrix/checks_1_3.rs"]
mod checks_1_3;
use checks_1_3::copy_checks;

const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

fn frozen(minor: u32) -> PathBuf {
    repo_root().join(format!("abi-tests/frozen/1.{minor}"))
}

fn c_dir() -> PathBuf {
    repo_root().join("abi-tests/c")
}

/// A plugin compiled with the strict plugin flags against the header in
/// `include` (plus `-g`, so the library could be inspected).
fn compile_plugin_against(src: &Path, include: &Path, defines: &[&str], out_name: &str) -> PathBuf {
    let out = test_tmp_dir(out_name).join(memplug_test_support::cdylib_file_name(out_name));
    let mut cmd = c_compiler(None);
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
    /// The plugin's own range, as its descriptor states it.
    range: (u32, u32),
    /// Its mechanism claims `MEMPLUG_CAP_SHARED_EXPORT` at 1.1 and newer.
    exports: bool,
    /// It exports the kit's device-loss test trigger
    /// (`memplug_test_trigger_device_lost`, `future_plugin.c`): the host
    /// cell pulls it and checks what a loss looks like at the agreed minor.
    trigger: bool,
    /// What it publishes when 1.2 (or newer) is agreed; `None`: nothing
    /// (it never agrees on 1.2).
    at_1_2: Option<Published>,
    /// The `MEMPLUG_COPY_*` spaces of its copy slot when 1.3 (or newer)
    /// is agreed; `None`: no copy slot.
    copy_kinds_1_3: Option<u32>,
}

/// What a plugin says of its memory and device at ABI 1.2.
struct Published {
    /// The memory descriptor of the mechanism of this name, given its
    /// granularity.
    descriptor: fn(&str, u64) -> Descriptor,
    /// The device identity (`struct_size` aside) of the mechanism of this
    /// name, as the host keeps it: the `valid` bits of later minors
    /// dropped.
    identity: fn(&str) -> Option<DeviceIdentity>,
    /// Its sync table publishes `stream_wait_fence` (optional in 1.2).
    wait_fence: bool,
    /// It claims queue-ordered binding (`MEMPLUG_CAP_QUEUED_BINDING`).
    queued_binding: bool,
}

/// The NUMA node of a CPU plugin mechanism: `"cpu-node<N>"` is node N;
/// the others name node 0's ordinal.
fn cpu_plugin_node(name: &str) -> Option<u32> {
    name.strip_prefix("cpu-node").map(|n| n.parse().expect("cpu-node<N>"))
}

/// The CPU plugin's mechanisms: `"cpu"` (base pages, no placement),
/// `"cpu-node<N>"` (bound to node N, zero-filled), `"cpu-huge-2m"` (2 MiB
/// pages, zero-filled, no shared mapping) and, where the kernel has a
/// system dma-buf heap, `"dmabuf-system"` (base pages in 2 MiB granules,
/// not coherent, dma-buf exports).
fn cpu_plugin_descriptor(name: &str, granularity: u64) -> Descriptor {
    const HOST: u32 = MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_HOST_COHERENT;
    let base = Descriptor {
        recommended_granularity: 0,
        page_sizes: Descriptor::page_size_bit(granularity),
        attributes: HOST | MEMPLUG_ATTR_READ_ONLY_ENFORCED,
        export_types: MEMPLUG_HANDLE_MEMFD,
        location: Location::HOST,
        maps_at_offsets: true,
    };
    match (name, cpu_plugin_node(name)) {
        ("cpu", _) => base,
        (_, Some(node)) => Descriptor {
            attributes: base.attributes | MEMPLUG_ATTR_ZERO_FILLED,
            location: Location::numa_node(node),
            ..base
        },
        ("cpu-huge-2m", _) => Descriptor {
            attributes: HOST | MEMPLUG_ATTR_ZERO_FILLED,
            export_types: 0,
            maps_at_offsets: false,
            ..base
        },
        ("dmabuf-system", _) => Descriptor {
            attributes: MEMPLUG_ATTR_HOST_VISIBLE
                | MEMPLUG_ATTR_READ_ONLY_ENFORCED
                | MEMPLUG_ATTR_ZERO_FILLED,
            export_types: MEMPLUG_HANDLE_DMABUF_FD,
            page_sizes: Descriptor::page_size_bit(4096),
            ..base
        },
        _ => panic!("the CPU plugin has no mechanism {name:?}"),
    }
}

fn cpu_plugin_identity(name: &str) -> Option<DeviceIdentity> {
    let numa_node = cpu_plugin_node(name).unwrap_or(0);
    Some(DeviceIdentity { valid: MEMPLUG_IDENTITY_NUMA_NODE, numa_node, ..Default::default() })
}

/// `c-examples/plugin/full_plugin.c`'s one mechanism, `c-full`: host
/// memory on no particular node, base pages, memfd exports, zero-filled.
fn full_plugin_descriptor(_name: &str, granularity: u64) -> Descriptor {
    Descriptor {
        recommended_granularity: 0,
        page_sizes: Descriptor::page_size_bit(granularity),
        attributes: MEMPLUG_ATTR_HOST_VISIBLE
            | MEMPLUG_ATTR_HOST_COHERENT
            | MEMPLUG_ATTR_READ_ONLY_ENFORCED
            | MEMPLUG_ATTR_ZERO_FILLED,
        export_types: MEMPLUG_HANDLE_MEMFD,
        location: Location::HOST,
        maps_at_offsets: true,
    }
}

/// `future_plugin.c`'s `FUTURE_*` values.
fn future_plugin_descriptor(_name: &str, granularity: u64) -> Descriptor {
    Descriptor {
        recommended_granularity: 16 * granularity,
        page_sizes: Descriptor::page_size_bit(granularity),
        attributes: MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_HOST_COHERENT,
        export_types: 0,
        location: Location::HOST,
        maps_at_offsets: false,
    }
}

impl Subject {
    /// The minor a host speaking 1.0..=1.`host_max` must agree on.
    fn agreed_with(&self, host_max: u32) -> u32 {
        host_max.min(self.range.1)
    }
}

fn subjects() -> Vec<Subject> {
    let example = repo_root().join("c-examples/plugin/example_plugin.c");
    let full_src = repo_root().join("c-examples/plugin/full_plugin.c");
    let cpu = find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN");
    // Compile the C plugins side by side (each is one gcc run).
    let (ex10, ex_now, p11, p12, future, two, full) = std::thread::scope(|s| {
        let a = s.spawn(|| compile_plugin_against(&example, &frozen(0), &[], "memplug_example_h10"));
        let b = s.spawn(|| compile_plugin_against(&example, &include_dir(), &[], "memplug_example_h_now"));
        let c = s.spawn(|| {
            compile_plugin_against(&c_dir().join("plugin_1_1.c"), &frozen(1), &[], "memplug_c_1_1")
        });
        let c2 = s.spawn(|| {
            compile_plugin_against(&c_dir().join("plugin_1_2.c"), &frozen(2), &[], "memplug_c_1_2")
        });
        let d = s.spawn(|| future_plugin(None));
        let e = s.spawn(|| compile_c_plugin(&c_dir().join("two_majors.c"), &[], "memplug_two_majors"));
        let f = s.spawn(|| compile_plugin_against(&full_src, &include_dir(), &[], "memplug_full_plugin"));
        let j = |h: std::thread::ScopedJoinHandle<PathBuf>| h.join().unwrap();
        (j(a), j(b), j(c), j(c2), j(d), j(e), j(f))
    });
    let s = |label, path, range, exports, trigger| Subject {
        label,
        path,
        range,
        exports,
        trigger,
        at_1_2: None,
        copy_kinds_1_3: None,
    };
    let cpu_1_2 = Published {
        descriptor: cpu_plugin_descriptor,
        identity: cpu_plugin_identity,
        wait_fence: true,
        queued_binding: true,
    };
    let future_1_2 = Published {
        descriptor: future_plugin_descriptor,
        identity: |_| {
            Some(DeviceIdentity {
                valid: MEMPLUG_IDENTITY_UUID | MEMPLUG_IDENTITY_NUMA_NODE,
                uuid: *b"memplug-future!!",
                numa_node: 0,
                ..Default::default()
            })
        },
        // It has no sync capability at all.
        wait_fence: false,
        queued_binding: false,
    };
    vec![
        Subject {
            at_1_2: Some(cpu_1_2),
            copy_kinds_1_3: Some(MEMPLUG_COPY_DEVICE | MEMPLUG_COPY_HOST),
            ..s("Rust CPU plugin (1.0..=1.3)", cpu, (0, 3), true, false)
        },
        s("C example, 1.0 header", ex10, (0, 0), false, false),
        s("C example, current header", ex_now, (0, 0), false, false),
        s("C plugin 1.1 (frozen 1.1 header)", p11, (0, 1), false, false),
        s("C plugin 1.2 (frozen 1.2 header)", p12, (0, 2), false, false),
        Subject { at_1_2: Some(future_1_2), ..s("future plugin (1.0..=1.4)", future, (0, 4), false, true) },
        s("two majors (v1 + v2)", two, (0, 0), false, false),
        Subject {
            at_1_2: Some(Published {
                descriptor: full_plugin_descriptor,
                identity: |_| {
                    Some(DeviceIdentity {
                        valid: MEMPLUG_IDENTITY_NUMA_NODE,
                        numa_node: 0,
                        ..Default::default()
                    })
                },
                wait_fence: true,
                queued_binding: true,
            }),
            copy_kinds_1_3: Some(MEMPLUG_COPY_DEVICE | MEMPLUG_COPY_HOST),
            ..s("C full plugin (1.0..=1.3)", full, (0, 3), true, true)
        },
    ]
}

/// One cell of the table.
struct Cell {
    host: String,
    plugin: &'static str,
    agreed: String,
    checks: String,
    degraded: Vec<String>,
    problems: Vec<String>,
}

impl Cell {
    fn new(host: String, s: &Subject) -> Cell {
        Cell {
            host,
            plugin: s.label,
            agreed: "-".into(),
            checks: String::new(),
            degraded: Vec::new(),
            problems: Vec::new(),
        }
    }
}

// ---- the C hosts, frozen at 1.0 and 1.1 ----

/// `matrix_host.c` compiled against the frozen header of 1.`minor`.
fn build_matrix_host(minor: u32) -> PathBuf {
    let exe = test_tmp_dir(&format!("matrix_host_1_{minor}")).join("matrix_host");
    let mut cmd = c_compiler(None);
    cmd.arg("-std=c99")
        .args(STRICT_WARNINGS)
        .arg("-I")
        .arg(frozen(minor))
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

fn c_host_cell(host_minor: u32, s: &Subject, child: Child) -> Cell {
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let mut cell = Cell::new(format!("C host, 1.{host_minor} header"), s);
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
    let agreed = s.agreed_with(host_minor);
    if cell.agreed != format!("1.{agreed}") {
        cell.problems.push(format!("agreed {} with a 1.{host_minor} host; expected 1.{agreed}", cell.agreed));
    }
    for l in lines.iter().filter(|l| l[2] == "fail") {
        cell.problems.push(format!("{}: {}", l[1], l[3]));
    }
    cell.checks = format!("{} pass, {} skip", count("pass"), count("skip"));
    // What a host of this minor must see of each plugin.
    let expect = |cell: &mut Cell, name: &str, want: Option<&str>| {
        let got = outcome(name);
        if got != want {
            cell.problems.push(format!("check {name}: expected {want:?}, got {got:?} ({})", detail(name)));
        }
    };
    expect(&mut cell, "allocator", Some("pass"));
    expect(&mut cell, "virtual_backing", Some("pass"));
    expect(&mut cell, "live_objects", Some("pass"));
    expect(&mut cell, "services", Some("degraded"));
    let export = match (host_minor, agreed, s.exports) {
        (0, _, _) | (_, 0, _) => "degraded",
        (_, _, true) => "pass",
        (_, _, false) => "skip",
    };
    expect(&mut cell, "export_import", Some(export));
    expect(&mut cell, "class_tag", Some(if agreed >= 1 { "pass" } else { "degraded" }));
    let newer = s.range.1 > host_minor;
    expect(&mut cell, "negotiate.newer_plugin", newer.then_some("degraded"));
    if newer {
        cell.degraded.push(format!("plugin's 1.{} used as 1.{agreed}", s.range.1));
    }
    match s.label {
        l if l.starts_with("Rust CPU plugin") || l.starts_with("C full plugin") => {
            // The SDK answers with the descriptor of the agreed minor: no
            // bit the host cannot know, everything of that minor usable.
            expect(&mut cell, "capabilities.unknown_bits", None);
            expect(&mut cell, "shared_mapping", Some("pass"));
            expect(&mut cell, "sync", Some("pass"));
            cell.degraded.push(format!("the plugin's 1.{agreed} view"));
        }
        l if l.starts_with("future plugin") => {
            // Its unknown bits are in its 1.2-and-newer views only: a 1.0
            // or 1.1 host gets that minor's descriptor.
            expect(&mut cell, "capabilities.unknown_bits", None);
            cell.degraded.push(format!("longer structs read as 1.{agreed} prefixes"));
        }
        l if l.starts_with("two majors") => {
            if stderr.contains("memplug_plugin_v2 called") {
                cell.problems.push(format!("the 1.{host_minor} host called memplug_plugin_v2"));
            }
            cell.degraded.push("memplug_plugin_v1 used; v2 is beyond this host".into());
        }
        _ => {}
    }
    cell.degraded.push(match export {
        "pass" => "export/import: shared across descriptors".to_string(),
        "skip" => "export/import: not published".to_string(),
        _ => format!("export/import: unavailable at 1.{agreed}"),
    });
    cell.degraded.push(
        if agreed >= 1 {
            "class tag: sent (48-byte requests)"
        } else {
            "class tag: not sent (40-byte requests)"
        }
        .into(),
    );
    cell.degraded.push(format!("services: none in 1.{host_minor} (24-byte host info, nothing read past it)"));
    if outcome("sync") == Some("pass") {
        cell.degraded
            .push(format!("stream_wait_fence: not in the 1.{host_minor} header (sync read as its prefix)"));
    }
    if outcome("properties") == Some("pass") {
        cell.degraded.push(
            "descriptor, identity: not in this header (32-byte properties, nothing written past them)".into(),
        );
    }
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
    if m.life_state() != LifeState::Active {
        fail(format!("is {:?} after the checks ({:?})", m.life_state(), m.life_reason()));
    }
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

/// What the plugin did with the host's services (ABI 1.2), as the host
/// counted them: nothing, unless the test trigger of a plugin that has one
/// is pulled; then a loss reaches the host, and the mechanism fails the way
/// the agreed minor allows (DEVICE_LOST at 1.2, never below).
fn services_used(s: &Subject, plugin: &Plugin, agreed: u32, problems: &mut Vec<String>) -> String {
    let stats = plugin.service_stats();
    if stats != ServiceStats::default() {
        problems.push(format!("the plugin called the services before any loss: {stats:?}"));
    }
    let offered = if agreed >= 2 { "offered" } else { "passed, not for this minor" };
    if !s.trigger {
        return format!("services: {offered}, never called");
    }
    let m = &plugin.mechanisms()[0];
    // The library the host loaded (dlopen of the same file gives the same
    // instance).
    // SAFETY: a plugin library of this test, already loaded.
    let lib = unsafe { libloading::Library::new(&s.path) }.unwrap();
    // SAFETY: the trigger's C signature (LOSS_TRIGGERS).
    let trigger = unsafe {
        lib.get::<unsafe extern "C" fn(u64) -> memplug_sdk::abi::MemplugStatus>(
            b"memplug_test_trigger_device_lost\0",
        )
    }
    .unwrap();
    // SAFETY: the trigger takes a mechanism id.
    let st = unsafe { trigger(m.id()) };
    let stats = plugin.service_stats();
    let after = unsafe { m.ungoverned() }.allocator().allocate(64, 16).map(|a| {
        let _ = unsafe { m.ungoverned() }.allocator().deallocate(a);
    });
    let mut fail = |what: String| problems.push(format!("after the trigger (status {st}): {what}"));
    if agreed >= 2 {
        if (stats.losses, stats.refused) != (1, 0) || m.life_state() != LifeState::Lost {
            fail(format!(
                "expected the host told once and the mechanism lost: {stats:?}, {:?}",
                m.life_state()
            ));
        }
        if !matches!(&after, Err(e) if e.status == Status::DeviceLost) {
            fail(format!("allocate answered {after:?}, not DEVICE_LOST"));
        }
        "services: offered; the trigger's loss reported through them, the mechanism lost, DEVICE_LOST".into()
    } else {
        if stats != ServiceStats::default() || m.life_state() != LifeState::Active {
            fail(format!("a 1.{agreed} plugin must not report: {stats:?}, {:?}", m.life_state()));
        }
        if !matches!(&after, Err(e) if e.status == Status::DeviceUnavailable && e.raw != 15) {
            fail(format!("allocate answered {after:?}, not DEVICE_UNAVAILABLE (DEVICE_LOST is 1.2's)"));
        }
        format!("services: {offered}; after the trigger no report, DEVICE_UNAVAILABLE (no DEVICE_LOST at 1.{agreed})")
    }
}

/// The Rust host speaking up to 1.`host_max` (the newest it knows, or
/// pinned lower); `kit`: also run the conformance kit on the library.
fn rust_host_cell(s: &Subject, host_max: u32, kit: bool) -> Cell {
    let label = if host_max == HOST_MAX_MINOR {
        format!("Rust host, 1.{host_max}")
    } else {
        format!("Rust host, pinned to 1.{host_max}")
    };
    let mut cell = Cell::new(label, s);
    let opts = LoadOptions { max_minor: host_max, ..Default::default() };
    let plugin = match Plugin::load_with(&s.path, &opts) {
        Ok(p) => p,
        Err(e) => {
            cell.problems.push(format!("load: {e}"));
            return cell;
        }
    };
    let (_, agreed) = plugin.abi_version();
    cell.agreed = format!("1.{agreed}");
    let want = s.agreed_with(host_max);
    if agreed != want || plugin.plugin_minor_range() != s.range {
        cell.problems.push(format!(
            "agreed 1.{agreed} with a plugin declaring {:?}; expected 1.{want} and {:?}",
            plugin.plugin_minor_range(),
            s.range
        ));
    }
    if s.range.1 > host_max {
        cell.degraded.push(format!("plugin's 1.{} used as 1.{host_max}", s.range.1));
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
        cell.degraded.extend(abi_1_2_checks(s, m, agreed, &mut cell.problems));
        cell.degraded.extend(ordering_checks(s, m, agreed, &mut cell.problems));
        cell.degraded.extend(copy_checks(s, m, agreed, &mut cell.problems));
    }
    let used = services_used(s, &plugin, agreed, &mut cell.problems);
    cell.degraded.push(used);
    if let Err(refused) = plugin.unload() {
        cell.problems.push(format!("unload refused: {}", refused.report));
    }
    if !kit {
        cell.checks = "host checks".into();
        return cell;
    }
    // The conformance kit on the same library (the same instance: objects
    // of the host's checks are all released above).
    // Compatibility, not thread safety (conformance/tests/concurrency.rs
    // measures that): storms of a few stalls keep the cells quick.
    let opts = memplug_conformance::Options {
        threads: 2,
        iterations: 200,
        storm_stalls: Some(10),
        ..Default::default()
    };
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
                c.host.clone(),
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
    assert_eq!(
        HOST_MAX_MINOR, 3,
        "a new minor: add its row (a host pinned to the minor before) and its cells"
    );
    let (hosts, subjects) = std::thread::scope(|s| {
        let h0 = s.spawn(|| build_matrix_host(0));
        let h1 = s.spawn(|| build_matrix_host(1));
        let subjects = subjects();
        ([(0, h0.join().unwrap()), (1, h1.join().unwrap())], subjects)
    });
    // The C hosts run in their own processes while this one does the Rust
    // rows, one plugin at a time.
    let children: Vec<(u32, &Subject, Child)> = hosts
        .iter()
        .flat_map(|(minor, exe)| subjects.iter().map(move |s| (*minor, s, spawn_c_host(exe, &s.path))))
        .collect();
    let mut cells: Vec<Cell> = subjects.iter().map(|s| rust_host_cell(s, HOST_MAX_MINOR, true)).collect();
    cells.extend(subjects.iter().map(|s| rust_host_cell(s, 2, false)));
    cells.extend(subjects.iter().map(|s| rust_host_cell(s, 1, false)));
    cells.extend(children.into_iter().map(|(minor, s, c)| c_host_cell(minor, s, c)));

    let text = format!("\nmemplug compatibility matrix (ABI 1.{HOST_MAX_MINOR})\n\n{}", table(&cells));
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
    assert_eq!(cells.len(), 40, "5 hosts × 8 plugins");
}

/// The C hosts' fence is real: a plugin that reads the 1.2 `services` field
/// whatever the host info's `struct_size` crashes a 1.0 and a 1.1 host (so
/// the plugins that pass those cells read nothing past 24 bytes), and the
/// same plugin without the peek passes.
#[test]
fn a_plugin_reading_services_past_a_frozen_host_info_crashes_the_c_host() {
    use std::os::unix::process::ExitStatusExt as _;
    let (peek, host_1_0, host_1_1) = std::thread::scope(|s| {
        let p = s.spawn(|| future_plugin(Some("FUTURE_PEEK_SERVICES")));
        let h0 = s.spawn(|| build_matrix_host(0));
        let h1 = s.spawn(|| build_matrix_host(1));
        (p.join().unwrap(), h0.join().unwrap(), h1.join().unwrap())
    });
    for host in [&host_1_0, &host_1_1] {
        let out = spawn_c_host(host, &peek).wait_with_output().unwrap();
        assert_eq!(
            out.status.signal(),
            Some(libc_sigsegv()),
            "{}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // In process, with the current host's 32-byte host info, the same peek
    // reads a valid field: the plugin loads and works.
    let p = Plugin::load(&peek).unwrap();
    assert_eq!(p.abi_version(), (1, HOST_MAX_MINOR));
    p.unload().unwrap();
}

fn libc_sigsegv() -> i32 {
    11 // SIGSEGV on Linux (every architecture this project builds for)
}

#[path = "compat_matrix/sdk_services.rs"]
mod sdk_services;

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

// ---- the 1.2 rules of typed export, enforced by the current host ----

/// `MEMPLUG_CAP_TYPED_EXPORT` is valid only with a shared mapping, at an
/// agreed minor of at least 2, with a table long enough for
/// `export_handle`/`import_handle`; and the slots are published if and only
/// if the bit is. Each way of breaking that is refused at load with a
/// message; the same libraries within the rules (another minor) load.
#[test]
fn the_host_refuses_typed_export_claimed_against_the_rules() {
    let [at_1_1, short, alone, slots] = std::thread::scope(|s| {
        ["FUTURE_TYPED_AT_1_1", "FUTURE_SHORT_TYPED", "FUTURE_TYPED_ALONE", "FUTURE_TYPED_SLOTS"]
            .map(|v| s.spawn(move || future_plugin(Some(v))))
            .map(|h| h.join().unwrap())
    });
    let pinned_1_1 = LoadOptions { max_minor: 1, ..Default::default() };
    let msg = load_error(&at_1_1, &pinned_1_1);
    assert!(msg.contains("above the agreed minor") && msg.contains("MEMPLUG_CAP_TYPED_EXPORT"), "{msg}");
    // The same library at 1.2 (and the current host's newer minor) is
    // within the rules.
    let p = Plugin::load(&at_1_1).unwrap();
    assert_eq!(p.abi_version(), (1, HOST_MAX_MINOR));
    let c = p.mechanisms()[0].capabilities();
    assert!(c.typed_export() && c.shared_export(), "{c:?}");
    p.unload().unwrap();

    let msg = load_error(&short, &LoadOptions::default());
    assert!(msg.contains("too short") && msg.contains(&MEMPLUG_SHARED_MAPPING_SIZE_1_1.to_string()), "{msg}");
    // Pinned to 1.1 the plugin claims no typed export, and its 1.1 table is
    // long enough.
    let p = Plugin::load_with(&short, &pinned_1_1).unwrap();
    assert!(!p.mechanisms()[0].capabilities().typed_export());
    p.unload().unwrap();

    let msg = load_error(&slots, &LoadOptions::default());
    assert!(
        msg.contains("export_handle/import_handle") && msg.contains("MEMPLUG_CAP_TYPED_EXPORT is not"),
        "{msg}"
    );
    // At 1.1 the same slots are past what the host reads: it loads.
    let p = Plugin::load_with(&slots, &pinned_1_1).unwrap();
    assert!(!p.mechanisms()[0].capabilities().typed_export());
    p.unload().unwrap();

    // Without a shared mapping there is no table for the slots to be in.
    let msg = load_error(&alone, &LoadOptions::default());
    assert!(
        msg.contains("MEMPLUG_CAP_TYPED_EXPORT") && msg.contains("without MEMPLUG_CAP_SHARED_MAPPING"),
        "{msg}"
    );
}

/// The in-process CPU plugin is one instance for the whole test binary, and
/// its class counts are process-wide: the tests using it take turns.
static IN_PROCESS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn cpu_in_process(max_minor: u32) -> Plugin {
    let opts = LoadOptions { max_minor, ..Default::default() };
    // SAFETY: the CPU plugin's own in-process entry.
    unsafe { Plugin::from_entry(memplug_plugin_cpu::cpu_plugin_entry, "cpu", &opts) }.unwrap()
}

/// `stream_wait_fence` reaches the CPU plugin when 1.2 was agreed: a stream
/// waiting for a fence of another, gated stream runs its work only once the
/// gate opens. Pinned to 1.1 or 1.0 the host answers it `Unsupported`
/// itself (the plugin's 1.1 view has no such slot).
#[test]
fn stream_wait_fence_reaches_the_cpu_plugin_only_at_1_2() {
    let _turn = IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    for minor in [2, 1, 0] {
        let plugin = cpu_in_process(minor);
        let sync = plugin.mechanisms()[0].sync().unwrap();
        let r = if minor >= 2 { cross_stream_wait(&sync) } else { refused_wait(&sync) };
        r.unwrap_or_else(|e| panic!("at 1.{minor}: {e}"));
        plugin.unload().unwrap();
    }
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
