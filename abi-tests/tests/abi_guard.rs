//! The exported-ABI guard: the built libraries are compared with `abidiff`
//! (libabigail) against the `abidw` baselines in `abi-tests/abi-baseline/`,
//! and the test fails on a change that breaks their binary interface.
//!
//! Libraries guarded:
//! * `libmemplug_plugin_cpu.so`, the Rust CPU plugin (built by cargo as a
//!   dev-dependency; `MEMPLUG_CPU_PLUGIN` overrides the path);
//! * the C example plugin, compiled here with `-g` against `include/`
//!   (`MEMPLUG_ABI_GUARD_INCLUDE` points it at another header directory:
//!   that is how the guard is shown catching a deliberate change);
//! * `libmemplug_host.so`, the host C API (`capi/`), when it has been built
//!   (`cargo test --workspace` builds it; `MEMPLUG_HOST_CAPI_LIB` overrides
//!   the path); skipped with a note otherwise.
//!
//! What fails: `abidiff`'s "incompatible" bit (exit status bit 3: a function
//! or variable removed, ...), a tool error (bits 0 and 1), and — because
//! libabigail reports layout changes only as "ABI changed" (bit 2) — any
//! change the ABI rules of ARCHITECTURE.md section 3 forbid: a field moved
//! ("offset changed"), removed ("deletion"), or retyped ("type name
//! changed"), a struct shrunk, or a field inserted before the end. Fields
//! appended at the end of a struct and new functions are reported and
//! pass: that is how minors grow.
//!
//! abidiff alone does not see everything in a Rust cdylib: libabigail
//! models `Option<unsafe extern "C" fn(...)>` (every slot) as a class whose
//! variants are member types, and does not follow changes through them, so
//! a struct reachable only through slot parameters (`MemplugRequest`,
//! `MemplugBlock`, `MemplugObjectRef`, ...) changes unseen. The guard
//! therefore also compares, from the two `abidw` descriptions, the layout of
//! every `Memplug*` struct the library's debug info describes (size, and
//! each field's offset) under the same append-only rule. (The C example's
//! plain function pointers are followed by abidiff itself.)
//!
//! Rebaseline with `MEMPLUG_ABI_BLESS=1 cargo test -p memplug-abi-tests
//! --test abi_guard`, in the same change as the `docs/ABI-CHANGELOG.md`
//! entry that explains it. Rust cdylibs need debug info for this; the dev
//! and test profiles have it (`debug = true` is cargo's default there).

use memplug_test_support::{
    c_compiler, cdylib_file_name, find_cdylib, include_dir, repo_root, run_tool, target_dir, test_tmp_dir,
    C_PLUGIN_FLAGS,
};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// abidw options: no paths or locations of this machine in the baseline,
/// and type ids derived from the types, so unrelated changes do not
/// renumber the file.
const ABIDW_FLAGS: &[&str] =
    &["--no-corpus-path", "--no-comp-dir-path", "--no-show-locs", "--type-id-style", "hash"];

fn baseline_dir() -> PathBuf {
    repo_root().join("abi-tests").join("abi-baseline")
}

fn blessing() -> bool {
    std::env::var_os("MEMPLUG_ABI_BLESS").is_some_and(|v| v != "0")
}

fn c_example_plugin() -> PathBuf {
    let include =
        std::env::var_os("MEMPLUG_ABI_GUARD_INCLUDE").map(PathBuf::from).unwrap_or_else(include_dir);
    c_example_plugin_against(&include, "abi-guard-c-example")
}

/// The C example plugin compiled with `-g` against the header in `include`.
fn c_example_plugin_against(include: &Path, dir: &str) -> PathBuf {
    let out = test_tmp_dir(dir).join(cdylib_file_name("memplug_example_plugin"));
    // gcc, whatever CC says: the baseline's debug info is gcc's.
    let mut cmd = c_compiler(Some("gcc"));
    cmd.args(C_PLUGIN_FLAGS)
        .arg("-g")
        .arg("-I")
        .arg(include)
        .arg(repo_root().join("c-examples/plugin/example_plugin.c"))
        .arg("-o")
        .arg(&out)
        .arg("-lpthread");
    run_tool(cmd);
    out
}

/// The host C API's shared library (cargo names it `libmemplug_host_capi.so`;
/// installed, it is `libmemplug_host.so.X.Y.Z`), if it has been built.
fn host_capi_lib() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MEMPLUG_HOST_CAPI_LIB") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    let file = cdylib_file_name("memplug_host_capi");
    [deps.join(&file), deps.parent()?.join(&file)].into_iter().find(|p| p.is_file())
}

/// How a comparison came out.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Same,
    /// Allowed growth (appended fields, added functions): what changed.
    Compatible(String),
    /// Forbidden: why.
    Incompatible(String),
}

/// Reads `abidiff`'s exit status and report.
fn classify(status: i32, report: &str) -> Verdict {
    if status & 0b11 != 0 {
        return Verdict::Incompatible(format!("abidiff failed (exit status {status}):\n{report}"));
    }
    let mut why: Vec<String> = Vec::new();
    if status & 0b1000 != 0 {
        why.push("abidiff says the change is incompatible".into());
    }
    let mut old_size: Option<u64> = None;
    for line in report.lines().map(str::trim) {
        let bits_after = |prefix: &str| -> Option<u64> {
            let rest = &line[line.find(prefix)? + prefix.len()..];
            rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
        };
        if line.contains("offset changed from") {
            why.push(format!("a field moved: {line}"));
        } else if line.contains("deletion") {
            why.push(format!("something was removed: {line}"));
        } else if line.contains("type name changed") || line.contains("typedef name changed") {
            why.push(format!("a type changed: {line}"));
        } else if line.starts_with("Functions changes summary")
            || line.starts_with("Variables changes summary")
        {
            let removed = line.split(':').nth(1).and_then(|r| r.split_whitespace().next()).unwrap_or("0");
            if removed != "0" {
                why.push(format!("symbols removed: {line}"));
            }
        } else if line.contains("type size changed from") {
            let from = bits_after("changed from ");
            let to = bits_after(" to ");
            if let (Some(f), Some(t)) = (from, to) {
                if t < f {
                    why.push(format!("a type shrank: {line}"));
                }
                old_size = Some(f);
            }
        } else if line.starts_with('\'') && line.contains(", at offset ") {
            // One inserted data member: "'T name', at offset N (in bits)".
            let at = bits_after(", at offset ");
            match (at, old_size) {
                (Some(at), Some(old)) if at >= old => {}
                _ => why.push(format!("a field was inserted before the end: {line}")),
            }
        }
    }
    if !why.is_empty() {
        Verdict::Incompatible(why.join("\n"))
    } else if status & 0b100 != 0 {
        let summary: Vec<&str> = report
            .lines()
            .map(str::trim)
            .filter(|l| l.contains("insertion") || l.starts_with('\'') || l.contains("Added"))
            .collect();
        Verdict::Compatible(summary.join("; "))
    } else {
        Verdict::Same
    }
}

/// Size (bits) and fields (name, offset in bits) of every `Memplug*` struct
/// an abidw description defines.
type Layouts = std::collections::BTreeMap<String, (u64, Fields)>;
/// Fields of one struct: (name, offset in bits), in declaration order.
type Fields = Vec<(String, u64)>;

fn attr<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!("{name}='"))? + name.len() + 2;
    Some(&line[start..start + line[start..].find('\'')?])
}

fn layouts(xml: &str) -> Layouts {
    let mut out = Layouts::new();
    let mut current: Option<(String, u64, Fields)> = None;
    let mut offset = None;
    for line in xml.lines().map(str::trim) {
        if let Some((name, size, fields)) = current.as_mut() {
            if line.starts_with("</class-decl>") {
                if !fields.is_empty() {
                    out.entry(name.clone()).or_insert((*size, std::mem::take(fields)));
                }
                current = None;
            } else if line.starts_with("<data-member") {
                offset = attr(line, "layout-offset-in-bits").and_then(|v| v.parse().ok());
            } else if line.starts_with("<var-decl") {
                if let (Some(n), Some(o)) = (attr(line, "name"), offset.take()) {
                    fields.push((n.to_string(), o));
                }
            }
            continue;
        }
        if line.starts_with("<class-decl name='Memplug") && !line.ends_with("/>") {
            let name = attr(line, "name").unwrap_or_default().to_string();
            let size = attr(line, "size-in-bits").and_then(|v| v.parse().ok()).unwrap_or(0);
            current = Some((name, size, Vec::new()));
        }
    }
    out
}

/// The append-only rule on every struct of `old`, as `new` describes it.
fn compare_layouts(old: &Layouts, new: &Layouts) -> Vec<String> {
    let mut why = Vec::new();
    for (name, (size, fields)) in old {
        let Some((new_size, new_fields)) = new.get(name) else {
            why.push(format!("struct {name} is no longer described"));
            continue;
        };
        for (i, (field, off)) in fields.iter().enumerate() {
            // By name: a field still there is where it was (a rename alone
            // is harmless to the binary interface; a swap is not).
            if let Some((_, o)) = new_fields.iter().find(|(f, _)| f == field) {
                if o != off {
                    why.push(format!("{name}: field {field} moved from bit {off} to bit {o}"));
                    continue;
                }
            }
            // By position: every old slot keeps its offset.
            match new_fields.get(i) {
                Some((_, o)) if o == off => {}
                Some((f, o)) => {
                    why.push(format!("{name}: field #{i} ({field} at bit {off}) is now {f} at bit {o}"))
                }
                None => why.push(format!("{name}: field {field} was removed")),
            }
        }
        for (f, o) in new_fields.iter().skip(fields.len()) {
            if o < size {
                why.push(format!("{name}: {f} was inserted at bit {o}, inside the old {size}-bit struct"));
            }
        }
        let growable = fields.first().is_some_and(|(f, _)| f == "struct_size");
        if new_size < size || (new_size > size && !growable) {
            why.push(format!(
                "{name} changed size from {size} to {new_size} bits{}",
                if growable { "" } else { " (only structs that start with struct_size may grow)" }
            ));
        }
    }
    why
}

fn abidw(lib: &Path, out: &Path) {
    let mut cmd = Command::new("abidw");
    cmd.args(ABIDW_FLAGS).arg("--out-file").arg(out).arg(lib);
    run_tool(cmd);
    let text = std::fs::read_to_string(out).unwrap();
    std::fs::write(out, without_machine_paths(&text)).unwrap();
}

/// `text` with the paths of this machine that abidw still writes into
/// translation-unit names (C sources compiled by absolute path, crates
/// from cargo's registry) made relative: to the repository, and to
/// `cargo-home/`. Names only; abidiff compares types and symbols.
fn without_machine_paths(text: &str) -> String {
    let root = format!("{}/", repo_root().display());
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
        .map(|p| format!("{}/", p.display()));
    let text = text.replace(&format!("path='{root}"), "path='");
    match cargo_home {
        Some(home) => text.replace(&format!("path='{home}"), "path='cargo-home/"),
        None => text,
    }
}

/// Compares one library with its baseline (or rewrites the baseline).
fn guard(name: &str, lib: &Path) -> Result<String, String> {
    let baseline = baseline_dir().join(format!("{name}.abi"));
    if blessing() {
        std::fs::create_dir_all(baseline_dir()).unwrap();
        abidw(lib, &baseline);
        return Ok(format!("baseline rewritten: {}", baseline.display()));
    }
    if !baseline.is_file() {
        return Err(format!(
            "no baseline {}: create it with MEMPLUG_ABI_BLESS=1 cargo test -p memplug-abi-tests --test abi_guard",
            baseline.display()
        ));
    }
    let out = Command::new("abidiff")
        .arg(&baseline)
        .arg(lib)
        .output()
        .unwrap_or_else(|e| panic!("cannot run abidiff: {e} (install abigail-tools: scripts/setup.sh)"));
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let status = out.status.code().unwrap_or(1);
    let now = test_tmp_dir(&format!("abi-guard-{name}")).join(format!("{name}.abi"));
    abidw(lib, &now);
    let old = layouts(&std::fs::read_to_string(&baseline).unwrap());
    let new = layouts(&std::fs::read_to_string(&now).unwrap());
    if old.is_empty() {
        return Err(format!("{} describes no Memplug struct: built without debug info?", baseline.display()));
    }
    let moved = compare_layouts(&old, &new);
    let grown: Vec<String> = old
        .iter()
        .filter_map(|(n, (size, _))| {
            let (new_size, _) = new.get(n)?;
            (new_size > size).then(|| format!("{n} grew from {size} to {new_size} bits at its end"))
        })
        .collect();
    let verdict = match classify(status, &report) {
        _ if !moved.is_empty() => {
            Verdict::Incompatible(format!("struct layouts (from the debug info):\n{}", moved.join("\n")))
        }
        Verdict::Same if !grown.is_empty() => Verdict::Compatible(grown.join("; ")),
        v => v,
    };
    match verdict {
        Verdict::Same => Ok("unchanged".into()),
        Verdict::Compatible(what) => Ok(format!("compatible change (rebaseline with the changelog): {what}")),
        Verdict::Incompatible(why) => Err(format!(
            "{} breaks the ABI recorded in {}:\n{why}\n\nfull abidiff report:\n{report}\n\
             If the break is intended it needs a new major; a new minor only appends. Rebaseline \
             (MEMPLUG_ABI_BLESS=1) together with docs/ABI-CHANGELOG.md.",
            lib.display(),
            baseline.display()
        )),
    }
}

#[test]
fn built_libraries_keep_the_baseline_abi() {
    // The Rust baselines are of the dev/test profile (full debug info);
    // other profiles describe the same ABI with other debug info.
    let dev = cfg!(debug_assertions);
    let cpu = dev.then(|| find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN"));
    let libs = [
        ("libmemplug_plugin_cpu", cpu),
        ("libmemplug_example_plugin", Some(c_example_plugin())),
        ("libmemplug_host", host_capi_lib().filter(|_| dev)),
    ];

    let results: Vec<(&str, Result<String, String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = libs
            .iter()
            .map(|(name, lib)| {
                s.spawn(move || match lib {
                    Some(lib) => (*name, guard(name, lib)),
                    None if !dev => (*name, Ok("skipped: baselines are of the dev profile".to_string())),
                    None => {
                        (*name, Ok("skipped: not built (cargo test --workspace builds capi/)".to_string()))
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut text = String::from("\nexported-ABI guard (abidiff against abi-tests/abi-baseline/)\n");
    for (name, r) in &results {
        let line = match r {
            Ok(s) => format!("  {name}: {s}\n"),
            Err(_) => format!("  {name}: INCOMPATIBLE\n"),
        };
        text += &line;
    }
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    let _ = std::fs::write(target_dir().join("tmp").join("abi-guard.txt"), &text);
    let failures: Vec<&String> = results.iter().filter_map(|(_, r)| r.as_ref().err()).collect();
    assert!(
        failures.is_empty(),
        "{text}\n{}",
        failures.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n\n")
    );
}

#[test]
fn the_classifier_tells_appends_from_breaks() {
    let appended = "Functions changes summary: 0 Removed, 1 Changed, 0 Added function\n\
                    in unqualified underlying type 'struct MemplugAllocator' at memplug.h:331:1:\n\
                    type size changed from 320 to 384 (in bits)\n\
                    1 data member insertion:\n\
                    'uint64_t appended', at offset 320 (in bits) at memplug.h:356:1\n";
    assert!(matches!(classify(4, appended), Verdict::Compatible(_)));
    let moved =
        "2 data member changes:\n'uint64_t size' offset changed from 64 to 128 (in bits) (by +64 bits)\n";
    assert!(matches!(classify(4, moved), Verdict::Incompatible(_)));
    let retyped =
        "type of 'uint64_t handle' changed:\ntype name changed from 'unsigned long int' to 'unsigned int'\n\
                   type size changed from 64 to 32 (in bits)\n";
    assert!(matches!(classify(4, retyped), Verdict::Incompatible(_)));
    let inserted = "type size changed from 256 to 320 (in bits)\n1 data member insertion:\n\
                    'uint64_t inserted', at offset 64 (in bits) at memplug.h:300:1\n";
    assert!(matches!(classify(4, inserted), Verdict::Incompatible(_)));
    let removed = "Functions changes summary: 1 Removed, 0 Changed, 0 Added function\n";
    assert!(matches!(classify(12, removed), Verdict::Incompatible(_)));
    assert_eq!(classify(0, ""), Verdict::Same);

    let xml = |fields: &str, size: u32| {
        format!(
            "<class-decl name='MemplugX' size-in-bits='{size}' is-struct='yes'>\n{fields}</class-decl>\n\
             <class-decl name='Other' size-in-bits='8'>\n</class-decl>\n"
        )
    };
    let member = |name: &str, off: u32| {
        format!("<data-member access='public' layout-offset-in-bits='{off}'>\n<var-decl name='{name}' type-id='1'/>\n</data-member>\n")
    };
    let base = layouts(&xml(&(member("struct_size", 0) + &member("a", 64)), 128));
    assert_eq!(base.len(), 1);
    let grown = layouts(&xml(&(member("struct_size", 0) + &member("a", 64) + &member("b", 128)), 192));
    assert!(compare_layouts(&base, &grown).is_empty());
    let moved = layouts(&xml(&(member("struct_size", 0) + &member("b", 64) + &member("a", 128)), 192));
    assert!(!compare_layouts(&base, &moved).is_empty());
    let shrunk = layouts(&xml(&member("struct_size", 0), 64));
    assert!(!compare_layouts(&base, &shrunk).is_empty());
    assert!(matches!(classify(1, "error"), Verdict::Incompatible(_)));
}

/// The guard still fails on a real break of the baseline it was blessed
/// with (the 1.2 one, where `MemplugHostInfo` is 256 bits): the C example
/// built against a header whose `MemplugHostInfo` puts `services` before
/// `host_name` (a reorder), and against the frozen 1.1 header (the 1.2
/// field gone, the struct shrunk back to 192 bits), is incompatible both
/// times, naming the struct.
#[test]
fn a_reordered_or_shrunk_host_info_fails_the_guard() {
    if blessing() {
        return; // guard() would rewrite the baseline with the broken library
    }
    let header = std::fs::read_to_string(include_dir().join("memplug.h")).unwrap();
    let (start, end) = (
        header.find("typedef struct MemplugHostInfo {").unwrap(),
        header.find("} MemplugHostInfo;").unwrap(),
    );
    let name_field = "  const char *host_name;\n";
    let services_field = "  const struct MemplugHostServices *services;\n";
    let body = &header[start..end];
    assert!(
        body.contains(name_field) && body.contains(services_field),
        "MemplugHostInfo as cbindgen writes it"
    );
    let swapped = body.replacen(name_field, "", 1).replacen(
        services_field,
        &format!("{services_field}{name_field}"),
        1,
    );
    let broken_dir = test_tmp_dir("abi-guard-broken-header");
    std::fs::write(broken_dir.join("memplug.h"), format!("{}{swapped}{}", &header[..start], &header[end..]))
        .unwrap();

    let frozen_1_1 = repo_root().join("abi-tests/frozen/1.1");
    for (include, what, expect) in [
        (broken_dir.as_path(), "reordered", "moved"),
        (frozen_1_1.as_path(), "1.1 (shrunk)", "changed size from 256 to 192 bits"),
    ] {
        let lib = c_example_plugin_against(include, &format!("abi-guard-break-{}", expect.len()));
        match guard("libmemplug_example_plugin", &lib) {
            Ok(v) => panic!("a {what} MemplugHostInfo passed the guard: {v}"),
            Err(why) => assert!(why.contains("MemplugHostInfo") && why.contains(expect), "{what}: {why}"),
        }
    }
}
