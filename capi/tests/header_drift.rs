//! `include/memplug_host.h` is generated from `capi/src` by the pinned
//! cbindgen (`capi/cbindgen.toml`) and committed; this test fails when
//! regeneration would change it. `MEMPLUG_BLESS=1` rewrites the committed
//! header instead.

use std::path::PathBuf;

#[test]
fn committed_header_matches_generated() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // cbindgen follows the `mod` declarations of lib.rs to every module.
    memplug_test_support::header_drift::assert_committed_header_matches(
        &crate_dir.join("src/lib.rs"),
        &crate_dir.join("cbindgen.toml"),
        &crate_dir.join("../include/memplug_host.h"),
        "MEMPLUG_BLESS",
        "memplug-host-capi",
    );
}

/// A reader of a generated header has only the header: the module docs
/// and Rust items the comments came from are not in it. Every C name a
/// comment cites must be declared in the same header, and no comment may
/// send the reader to a part of the header that does not exist ("the top
/// of this section": the header has no sections).
#[test]
fn every_name_a_header_comment_cites_is_in_the_header() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for (header, prefixes) in [
        ("../include/memplug_host.h", &["memplug_host_", "MemplugHost", "MEMPLUG_HOST_"][..]),
        ("../include/memplug.h", &["memplug_", "Memplug", "MEMPLUG_"][..]),
    ] {
        let text = std::fs::read_to_string(crate_dir.join(header)).unwrap();
        let is_comment = |l: &&str| {
            let t = l.trim_start();
            t.starts_with("//") || t.starts_with('*') || t.starts_with("/*")
        };
        let code: String = text.lines().filter(|l| !is_comment(l)).collect::<Vec<_>>().join("\n");
        let mut missing = Vec::new();
        for line in text.lines().filter(is_comment) {
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
                    && !declared(&code, &name)
                {
                    missing.push(format!("{name} (in: {})", line.trim()));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "{header}: comments cite names the header does not declare:\n{}",
            missing.join("\n")
        );
    }
}

/// Whether `name` is declared: it appears in the header's code as a whole
/// word, or, cited as a family (`MEMPLUG_HOST_LOG_*`, ending in `_`), some
/// declared word starts with it.
fn declared(code: &str, name: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    code.match_indices(name).any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let after = code[i + name.len()..].chars().next();
        !before.is_some_and(word) && (name.ends_with('_') || !after.is_some_and(word))
    })
}
