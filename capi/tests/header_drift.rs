//! The host C API's headers are generated from `capi/src` by the pinned
//! cbindgen and committed: one header per topic under
//! `include/memplug/host/`, each from the capi modules its row of
//! [`TOPICS`] names (one cbindgen run per topic), and the umbrella
//! `include/memplug_host.h`, which includes them all in the order of
//! [`TOPICS`]. These tests fail when regeneration would change any of them;
//! `MEMPLUG_BLESS=1` rewrites them instead.
//!
//! A new module of `capi/src` that declares C items gets its header by a
//! new row of [`TOPICS`] (or by joining the sources of a row);
//! `every_module_with_c_items_is_in_one_topic` fails until it has one.
//! Which topic headers a topic header includes is found, not listed: those
//! that declare a name its declarations use.

use memplug_host_capi::{MEMPLUG_HOST_API_MAJOR, MEMPLUG_HOST_API_MINOR};
use memplug_test_support::header_drift::{assert_committed_text_matches, generate, read_config};
use memplug_test_support::{c_compiler, cxx_compiler, include_dir, run_tool, test_tmp_dir, STRICT_WARNINGS};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// One header of the C API.
struct Topic {
    /// Its file name under `include/memplug/host/`.
    header: &'static str,
    /// What it declares (its opening comment, and the umbrella's).
    about: &'static str,
    /// The `capi/src` files it is generated from, in this order.
    sources: &'static [&'static str],
    /// Headers from outside this API it includes (as `#include "…"`,
    /// found through the include directory).
    includes: &'static [&'static str],
}

/// Every header of the C API, in the umbrella's order: a header may use
/// only names of the headers above it.
const TOPICS: &[Topic] = &[
    Topic {
        header: "common.h",
        about: "versions, status codes, the last error, handles, allocation classes",
        sources: &["version.rs", "status.rs", "error.rs", "common.rs"],
        includes: &["memplug.h"],
    },
    Topic {
        header: "manager.h",
        about: "the manager, plugins and mechanisms",
        sources: &["manager.rs", "mechanism_info.rs", "load_options.rs"],
        includes: &[],
    },
    Topic { header: "pools.h", about: "pools and holders", sources: &["pool.rs"], includes: &[] },
    Topic {
        header: "bindings.h",
        about: "bindings and allocations",
        sources: &["binding.rs"],
        includes: &[],
    },
    Topic {
        header: "regions.h",
        about: "regions and shared prefixes, their typed export, peer access",
        sources: &["region.rs", "prefix_export.rs", "peer.rs"],
        includes: &[],
    },
    Topic {
        header: "streams.h",
        about: "streams, fences and stream-ordered copies",
        sources: &["fence.rs", "copy.rs"],
        includes: &[],
    },
    Topic { header: "cache.h", about: "caching bindings", sources: &["cache.rs"], includes: &[] },
    Topic {
        header: "lifecycle.h",
        about: "mechanism lives: retirement, loss, replacement, settlement",
        sources: &["lifecycle.rs"],
        includes: &[],
    },
    Topic {
        header: "offload.h",
        about: "offload, restore and copy-on-write",
        sources: &["offload.rs"],
        includes: &[],
    },
    Topic {
        header: "stats.h",
        about: "statistics, events and plugin messages",
        sources: &["stats.rs", "observe.rs"],
        includes: &[],
    },
    Topic {
        header: "dlpack_export.h",
        about: "DLPack export",
        sources: &["dlpack.rs"],
        includes: &["dlpack/dlpack.h"],
    },
    Topic {
        header: "node.h",
        about: "one budget across processes: joining a node authority, and one embedded",
        sources: &["node.rs"],
        includes: &[],
    },
    Topic {
        header: "ucx.h",
        about: "memory on the wire through UCX (cargo feature `ucx`, on by default)",
        sources: &["ucx.rs", "ucx_alloc.rs"],
        includes: &[],
    },
];

/// What the umbrella says of the whole API (its opening comment).
const CONVENTIONS: &str = " * Link with libmemplug_host (.so or .a). Conventions:
 *  - Fallible functions return a MemplugHostStatus; MEMPLUG_HOST_STATUS_OK is
 *    0. On failure, memplug_host_last_error_message() says why (per thread).
 *  - Out-parameters are written only on success (but for the size a text
 *    function reports with MEMPLUG_HOST_STATUS_BUFFER_TOO_SMALL).
 *  - Handles are 64-bit values in structs, passed by value. The zero handle
 *    names nothing; destroying or freeing it is a no-op. Stale, forged and
 *    other-manager handles are refused with a status, never undefined.
 *  - Structs with struct_size: set it to sizeof before passing them.
 *  - Callbacks must not unwind (no C++ exception may leave them).
 *  - Every function may be called from any thread unless documented.";

/// The macros of `common.h`, after its includes.
const COMMON_MACROS: &str = "
/* Initialiser of a null handle of any type: MemplugHostPool p = MEMPLUG_HOST_NULL_HANDLE_INIT; */
#define MEMPLUG_HOST_NULL_HANDLE_INIT {0}

/* Fails with MEMPLUG_HOST_STATUS_VERSION_MISMATCH when the library linked at
 * run time is older than this header. */
#define MEMPLUG_HOST_CHECK_API() memplug_host_check_api(MEMPLUG_HOST_API_MAJOR, MEMPLUG_HOST_API_MINOR)

/* Memory on the wire through UCX (memplug_host_ucx_*, ucx.h): in every
 * library built with the C API crate's default `ucx` feature, which needs no
 * UCX to build (libucp.so.0 is opened at run time). Define
 * MEMPLUG_HOST_NO_UCX before including this header for a library built
 * without it. */
#if !defined(MEMPLUG_HOST_NO_UCX)
#define MEMPLUG_HOST_UCX 1
#endif
";

const REGENERATE: &str = "MEMPLUG_BLESS=1 cargo test -p memplug-host-capi --test header_drift";

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn topic_dir() -> PathBuf {
    crate_dir().join("../include/memplug/host")
}

fn version() -> String {
    format!("{MEMPLUG_HOST_API_MAJOR}.{MEMPLUG_HOST_API_MINOR}")
}

/// The C names a Rust source declares: its `#[no_mangle]` functions and
/// its public constants, `#[repr]` types and type aliases named like the
/// C API (`memplug_host_*`, `MemplugHost*`, `MEMPLUG_HOST_*`).
#[derive(Default)]
struct Declared {
    /// Types cbindgen writes only when asked (no function of the same run
    /// may name them).
    types: Vec<String>,
    /// Every name, types included.
    all: BTreeSet<String>,
}

fn declared(source: &str) -> Declared {
    let c_named = |n: &str| {
        n.starts_with("memplug_host_") || n.starts_with("MemplugHost") || n.starts_with("MEMPLUG_HOST_")
    };
    let ident =
        |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    let mut d = Declared::default();
    let mut repr = false;
    for line in source.lines() {
        let l = line.trim_start();
        if l.starts_with("#[repr(") {
            repr = true;
            continue;
        }
        if l.starts_with("#[") || l.starts_with("///") {
            continue;
        }
        const EXTERN_FN: &str = "extern \"C\" fn ";
        let name = l
            .strip_prefix("pub const ")
            .map(|rest| (ident(rest), false))
            .or_else(|| {
                let rest = l.strip_prefix("pub struct ").or_else(|| l.strip_prefix("pub enum "));
                rest.map(|rest| (ident(rest), repr))
            })
            .or_else(|| l.strip_prefix("pub type ").map(|rest| (ident(rest), true)))
            .or_else(|| {
                let at = l.find(EXTERN_FN).filter(|_| l.starts_with("pub "));
                at.map(|i| (ident(&l[i + EXTERN_FN.len()..]), false))
            });
        repr = false;
        if let Some((name, is_type)) = name.filter(|(n, _)| c_named(n)) {
            if is_type {
                d.types.push(name.clone());
            }
            d.all.insert(name);
        }
    }
    d
}

fn read_source(file: &str) -> String {
    let path = crate_dir().join("src").join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("capi/src/{file}: {e}"))
}

/// The words of a header's declarations (comments left out).
fn code_words(header: &str) -> BTreeSet<String> {
    let mut words = BTreeSet::new();
    for line in header.lines().filter(|l| !is_comment(l)) {
        for w in line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if !w.is_empty() {
                words.insert(w.to_string());
            }
        }
    }
    words
}

fn is_comment(l: &str) -> bool {
    let t = l.trim_start();
    t.starts_with("//") || t.starts_with('*') || t.starts_with("/*")
}

/// One topic's header, including `includes` (other topic headers, by
/// file name: they stand beside it).
fn topic_header(topic: &Topic, topic_includes: &[&str]) -> String {
    let mut config = read_config(&crate_dir().join("cbindgen.toml"));
    let stem = topic.header.trim_end_matches(".h").to_uppercase();
    config.include_guard = Some(format!("MEMPLUG_HOST_{stem}_H"));
    let sources: Vec<String> = topic.sources.iter().map(|s| format!("capi/src/{s}")).collect();
    let opening = format!(
        "memplug/host/{}: {}. Part of the memplug host C API {}: include memplug_host.h for all of it \
         and its conventions.",
        topic.header,
        topic.about,
        version()
    );
    let generated =
        format!("GENERATED by cbindgen from {}; do not edit. Regenerate with", sources.join(", "));
    config.header = Some(format!(
        "/*\n{}\n *\n{}\n *   {REGENERATE}\n */",
        comment_lines(&opening),
        comment_lines(&generated)
    ));
    config.includes = topic.includes.iter().chain(topic_includes).map(|s| s.to_string()).collect();
    if topic.header == "common.h" {
        config.after_includes = Some(COMMON_MACROS.to_string());
    }
    for file in topic.sources {
        config.export.include.extend(declared(&read_source(file)).types);
    }
    let paths: Vec<PathBuf> = topic.sources.iter().map(|s| crate_dir().join("src").join(s)).collect();
    let paths: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    generate(&paths, config)
}

/// `text` as the lines of a C block comment (` * ` and words, each line
/// within 80 columns).
fn comment_lines(text: &str) -> String {
    let mut lines: Vec<String> = vec![" *".to_string()];
    for word in text.split_whitespace() {
        let last = lines.last_mut().expect("one line at least");
        if last.len() > 2 && last.len() + 1 + word.len() > 79 {
            lines.push(format!(" * {word}"));
        } else {
            last.push(' ');
            last.push_str(word);
        }
    }
    lines.join("\n")
}

/// Every topic's header text, in the order of [`TOPICS`], each including
/// the topic headers that declare a name it uses.
fn topic_headers() -> Vec<String> {
    let names: Vec<BTreeSet<String>> = TOPICS
        .iter()
        .map(|t| t.sources.iter().flat_map(|s| declared(&read_source(s)).all).collect())
        .collect();
    TOPICS
        .iter()
        .enumerate()
        .map(|(i, topic)| {
            let words = code_words(&topic_header(topic, &[]));
            let mut uses = Vec::new();
            for (j, other) in TOPICS.iter().enumerate().filter(|(j, _)| *j != i) {
                if let Some(name) = names[j].intersection(&words).next() {
                    assert!(
                        j < i,
                        "{} uses {name} of {}, which comes after it in TOPICS \
                         (capi/tests/header_drift.rs): a header may use only those above it",
                        topic.header,
                        other.header
                    );
                    uses.push(other.header);
                }
            }
            topic_header(topic, &uses)
        })
        .collect()
}

/// `include/memplug_host.h`: the conventions and every topic header.
fn umbrella() -> String {
    let mut s = format!(
        "/*\n * memplug_host.h: the memplug host C API, version {}.\n *\n * Includes one header per topic, memplug/host/<topic>.h, each GENERATED by\n * cbindgen from capi/src; this file is written by capi/tests/header_drift.rs.\n * Do not edit; regenerate with\n *   {REGENERATE}\n *\n{CONVENTIONS}\n */\n\n#ifndef MEMPLUG_HOST_H\n#define MEMPLUG_HOST_H\n\n",
        version()
    );
    for t in TOPICS {
        s.push_str(&format!("/* {} */\n#include \"memplug/host/{}\"\n", t.about, t.header));
    }
    s.push_str("\n#endif /* MEMPLUG_HOST_H */\n");
    s
}

#[test]
fn committed_headers_match_generated() {
    let dir = topic_dir();
    for (topic, text) in TOPICS.iter().zip(topic_headers()) {
        assert_committed_text_matches(&text, &dir.join(topic.header), "MEMPLUG_BLESS", "memplug-host-capi");
    }
    assert_committed_text_matches(
        &umbrella(),
        &crate_dir().join("../include/memplug_host.h"),
        "MEMPLUG_BLESS",
        "memplug-host-capi",
    );
    // No header of an old topic is left behind.
    let known: BTreeSet<&str> = TOPICS.iter().map(|t| t.header).collect();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            known.contains(name.as_str()),
            "include/memplug/host/{name} is no topic of TOPICS (capi/tests/header_drift.rs): remove it"
        );
    }
}

/// Each module of `capi/src` that declares a C name is the source of
/// exactly one topic header; each source a topic names exists.
#[test]
fn every_module_with_c_items_is_in_one_topic() {
    let mut problems = Vec::new();
    for entry in std::fs::read_dir(crate_dir().join("src")).unwrap() {
        let file = entry.unwrap().file_name().to_string_lossy().into_owned();
        if !file.ends_with(".rs") {
            continue;
        }
        let topics: Vec<&str> =
            TOPICS.iter().filter(|t| t.sources.contains(&file.as_str())).map(|t| t.header).collect();
        let c_names = declared(&read_source(&file)).all;
        match (topics.len(), c_names.first()) {
            (0, Some(name)) => problems.push(format!(
                "capi/src/{file} declares {name} but is the source of no header: add it to a row of TOPICS \
                 in capi/tests/header_drift.rs (or a row of its own), then `{REGENERATE}`"
            )),
            (n, _) if n > 1 => {
                problems.push(format!("capi/src/{file} is a source of {topics:?}: one header only"))
            }
            _ => {}
        }
    }
    for t in TOPICS {
        for s in t.sources {
            if !crate_dir().join("src").join(s).is_file() {
                problems.push(format!("{} names capi/src/{s}, which does not exist", t.header));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Each topic header, and the umbrella, compiles alone and included
/// twice, as C99 and as C++, under the strict warnings: it includes
/// whatever it uses.
#[test]
fn each_header_compiles_alone() {
    let dir = test_tmp_dir("host_headers_alone");
    let headers = TOPICS.iter().map(|t| format!("memplug/host/{}", t.header));
    for header in headers.chain(["memplug_host.h".to_string()]) {
        for (cpp, ext, std) in [(false, "c", "-std=c99"), (true, "cpp", "-std=c++17")] {
            let stem = header.trim_end_matches(".h").replace('/', "_");
            let src = dir.join(format!("{stem}.{ext}"));
            std::fs::write(
                &src,
                format!("#include \"{header}\"\n#include \"{header}\"\nint main(void) {{ return 0; }}\n"),
            )
            .unwrap();
            let mut cmd = if cpp { cxx_compiler(None) } else { c_compiler(None) };
            cmd.arg(std).args(STRICT_WARNINGS).arg("-I").arg(include_dir()).arg("-fsyntax-only").arg(&src);
            run_tool(cmd);
        }
    }
}

/// A reader of a generated header has only the headers: the module docs
/// and Rust items the comments came from are not in them. Every C name a
/// comment cites must be declared in the same API's headers (the host's:
/// the umbrella and its topic headers), and no comment may send the reader
/// to a part of a header that does not exist ("the top of this section":
/// the headers have no sections).
#[test]
fn every_name_a_header_comment_cites_is_in_the_header() {
    let mut host = std::fs::read_to_string(crate_dir().join("../include/memplug_host.h")).unwrap();
    for t in TOPICS {
        host.push_str(&std::fs::read_to_string(topic_dir().join(t.header)).unwrap());
    }
    let plugin = std::fs::read_to_string(crate_dir().join("../include/memplug.h")).unwrap();
    for (header, text, prefixes) in [
        ("the host C API's headers", host, &["memplug_host_", "MemplugHost", "MEMPLUG_HOST_"][..]),
        ("include/memplug.h", plugin, &["memplug_", "Memplug", "MEMPLUG_"][..]),
    ] {
        let code: String = text.lines().filter(|l| !is_comment(l)).collect::<Vec<_>>().join("\n");
        let mut missing = Vec::new();
        for line in text.lines().filter(|l| is_comment(l)) {
            let lower = line.to_lowercase();
            for vague in ["this section", "see above", "see below", "top of this"] {
                assert!(
                    !lower.contains(vague),
                    "{header}: a comment points at a part the header lacks: {line}"
                );
            }
            for cited in line.split('`').skip(1).step_by(2) {
                let name: String =
                    cited.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if prefixes.iter().any(|p| name.starts_with(p) && name.len() > p.len())
                    && !is_declared(&code, &name)
                {
                    missing.push(format!("{name} (in: {})", line.trim()));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "{header}: comments cite names the headers do not declare:\n{}",
            missing.join("\n")
        );
    }
}

/// Whether `name` is declared: it appears in the header's code as a whole
/// word, or, cited as a family (`MEMPLUG_HOST_LOG_*`, ending in `_`), some
/// declared word starts with it.
fn is_declared(code: &str, name: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    code.match_indices(name).any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let after = code[i + name.len()..].chars().next();
        !before.is_some_and(word) && (name.ends_with('_') || !after.is_some_and(word))
    })
}
