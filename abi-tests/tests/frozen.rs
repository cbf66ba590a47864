//! Released minors are frozen (ARCHITECTURE.md section 3, Versioning).
//!
//! * `abi-tests/frozen/<major>.<minor>/memplug.h` is the header exactly as it
//!   was released; its SHA-256 is recorded here, so the file cannot be
//!   "fixed" after the fact without this test saying so.
//! * The current `include/memplug.h` only appends to each frozen one: every
//!   struct, field, typedef and constant of the frozen header is still
//!   there, every field at the same offset with the same size, every
//!   constant with the same value (`MEMPLUG_ABI_MINOR`, the newest minor,
//!   excepted), and every struct at least as large. Measured by the C
//!   compiler: one generated program, built once against the frozen header
//!   and once against the current one, prints every fact; the two outputs
//!   are compared.
//! * The frozen header still compiles alone under the strict flags (C99),
//!   so hosts and plugins built against it (the 1.0 columns of
//!   `compat_matrix.rs`) are built from what was released.

use memplug_test_support::{c_compiler, include_dir, repo_root, run_tool, test_tmp_dir, STRICT_WARNINGS};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// SHA-256 of each frozen header, recorded when the minor was released.
const FROZEN: &[(&str, &str)] = &[
    ("1.0", "267f79266479a11139b13dc147c42689d536ea08b4938775540ba65c55f8af43"),
    ("1.1", "bfd008a4a72078f219aa0b84fc55841dc94384303ddd9aebdb077d53a7d15f7b"),
    ("1.2", "9bd40b83cb8c2bb8a09cc4f182ab3a1bbc6b9bcccfa4522f2a41d801b37b26c5"),
];

/// Constants whose value is allowed to change between minors.
const MOVING: &[&str] = &["MEMPLUG_ABI_MINOR"];

fn frozen_header(version: &str) -> PathBuf {
    repo_root().join("abi-tests").join("frozen").join(version).join("memplug.h")
}

#[test]
fn frozen_headers_never_change() {
    for (version, want) in FROZEN {
        let path = frozen_header(version);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let got: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            got,
            *want,
            "{} changed: a released header is frozen. Restore it (git checkout) — changes go into \
             sdk/src/abi/ as a new minor, never into a released one",
            path.display()
        );
    }
}

/// What a cbindgen-written header declares: structs with their fields in
/// order, typedef names, and `#define`d constants (name → literal text).
#[derive(Default, Debug)]
struct Declared {
    structs: Vec<(String, Vec<String>)>,
    typedefs: Vec<String>,
    constants: BTreeMap<String, String>,
}

/// Reads the declarations of a header in the fixed format cbindgen writes
/// (one field per line; a function-pointer field starts `ret (*name)(`,
/// and its continuation lines hold no `(*`).
fn declarations(header: &Path) -> Declared {
    let text = std::fs::read_to_string(header).unwrap_or_else(|e| panic!("read {}: {e}", header.display()));
    let mut d = Declared::default();
    let mut current: Option<(String, Vec<String>)> = None;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("//") || t.starts_with("/*") || t.starts_with('*') {
            continue;
        }
        if let Some((name, fields)) = current.as_mut() {
            if t.starts_with('}') {
                d.structs.push((name.clone(), std::mem::take(fields)));
                current = None;
            } else if let Some(start) = t.find("(*") {
                let rest = &t[start + 2..];
                fields.push(rest[..rest.find(')').expect("(*name)")].to_string());
            } else if t.ends_with(';') && !t.contains(')') {
                // An array field (`uint8_t uuid[16];`) is named before its
                // bound.
                let decl = t.trim_end_matches(';');
                let decl = decl.split_once('[').map_or(decl, |(name, _)| name);
                let name = decl.rsplit(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap();
                fields.push(name.to_string());
            }
            continue;
        }
        if let Some(rest) = t.strip_prefix("typedef struct ") {
            if rest.ends_with('{') {
                current = Some((rest.trim_end_matches('{').trim().to_string(), Vec::new()));
            }
        } else if let Some(rest) = t.strip_prefix("typedef ") {
            let name = if let Some(start) = rest.find("(*") {
                let r = &rest[start + 2..];
                &r[..r.find(')').unwrap()]
            } else {
                rest.trim_end_matches(';').rsplit(' ').next().unwrap()
            };
            d.typedefs.push(name.to_string());
        } else if let Some(rest) = t.strip_prefix("#define MEMPLUG_") {
            let (name, value) = rest.split_once(' ').unwrap_or((rest, ""));
            if !value.is_empty() {
                d.constants.insert(format!("MEMPLUG_{name}"), value.to_string());
            }
        }
    }
    assert!(current.is_none(), "{}: unterminated struct", header.display());
    assert!(!d.structs.is_empty() && !d.constants.is_empty(), "{}: nothing declared?", header.display());
    d
}

/// A C program printing every layout fact and constant value of `d`.
fn fact_printer(d: &Declared) -> String {
    let mut c = String::from(
        "/* Generated by abi-tests/tests/frozen.rs. */\n#include \"memplug.h\"\n#include <stddef.h>\n\
         #include <stdio.h>\n\nint main(void)\n{\n",
    );
    for (s, fields) in &d.structs {
        writeln!(c, "    printf(\"size {s} %zu\\n\", sizeof({s}));").unwrap();
        for f in fields {
            writeln!(
                c,
                "    printf(\"field {s}.{f} %zu %zu\\n\", offsetof({s}, {f}), sizeof((({s} *)0)->{f}));"
            )
            .unwrap();
        }
    }
    for t in &d.typedefs {
        writeln!(c, "    printf(\"typedef {t} %zu\\n\", sizeof({t}));").unwrap();
    }
    for (name, value) in &d.constants {
        if value.starts_with('"') {
            writeln!(c, "    printf(\"const {name} %s\\n\", {name});").unwrap();
        } else {
            writeln!(c, "    printf(\"const {name} %lld\\n\", (long long)({name}));").unwrap();
        }
    }
    c.push_str("    return 0;\n}\n");
    c
}

/// Compiles `src` against the header in `include` and runs it.
fn facts(src: &Path, include: &Path, name: &str) -> BTreeMap<String, String> {
    let exe = test_tmp_dir(name).join(name);
    let mut cmd = c_compiler(None);
    cmd.arg("-std=c99").args(STRICT_WARNINGS).arg("-I").arg(include).arg(src).arg("-o").arg(&exe);
    run_tool(cmd);
    let out = Command::new(&exe).output().expect("run the fact printer");
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (kind_name, value) = l.rsplit_once(' ').unwrap();
            // "field S.f OFF SIZE": keep "OFF SIZE" together as the value.
            match kind_name.strip_prefix("field ").and_then(|r| r.split_once(' ')) {
                Some((field, off)) => (format!("field {field}"), format!("{off} {value}")),
                None => (kind_name.to_string(), value.to_string()),
            }
        })
        .collect()
}

#[test]
fn the_current_header_only_appends_to_every_frozen_one() {
    for (version, _) in FROZEN {
        let frozen = frozen_header(version);
        let d = declarations(&frozen);
        let dir = test_tmp_dir(&format!("frozen-{version}"));
        let src = dir.join("facts.c");
        std::fs::write(&src, fact_printer(&d)).unwrap();
        let then = facts(&src, frozen.parent().unwrap(), &format!("facts-{version}"));
        let now = facts(&src, &include_dir(), &format!("facts-current-vs-{version}"));
        let mut broken = Vec::new();
        for (key, old) in &then {
            let new = &now[key];
            let ok = if let Some(name) = key.strip_prefix("size ") {
                let grew = new.parse::<u64>().unwrap() >= old.parse::<u64>().unwrap();
                // Only structs that start with struct_size may grow.
                grew && (new == old || d.structs.iter().any(|(s, f)| s == name && f[0] == "struct_size"))
            } else if key.starts_with("const ") && MOVING.contains(&&key[6..]) {
                true
            } else {
                new == old
            };
            if !ok {
                broken.push(format!("{key}: {version} had {old}, now {new}"));
            }
        }
        assert!(
            broken.is_empty(),
            "include/memplug.h breaks ABI {version} (minors only append):\n  {}",
            broken.join("\n  ")
        );
        // Sanity: the comparison saw the whole header.
        assert!(then.len() > 150, "only {} facts read from {}", then.len(), frozen.display());
    }
}

#[test]
fn frozen_headers_compile_alone_and_twice_in_c99() {
    for (version, _) in FROZEN {
        let frozen = frozen_header(version);
        let dir = test_tmp_dir(&format!("frozen-compiles-{version}"));
        let src = dir.join("twice.c");
        std::fs::write(&src, "#include \"memplug.h\"\n#include \"memplug.h\"\nint frozen_header_unit;\n")
            .unwrap();
        let mut cmd = c_compiler(None);
        cmd.arg("-std=c99")
            .args(STRICT_WARNINGS)
            .arg("-I")
            .arg(frozen.parent().unwrap())
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(dir.join("twice.o"));
        run_tool(cmd);
    }
}
