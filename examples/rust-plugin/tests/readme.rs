//! The README's "Write a plugin in Rust" snippet is this crate's source
//! between its `// README: begin` and `// README: end` markers, character
//! for character, so the README shows code that builds and passes the
//! conformance kit (`tests/conformance.rs`), and the two cannot drift.

use std::path::Path;

/// The line in README.md that introduces the snippet: the next ```rust
/// block is it.
const README_MARKER: &str = "<!-- examples/rust-plugin/src/lib.rs, between its README markers -->";

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// The lines strictly between `begin` and `end` (each a whole line), joined
/// with newlines.
fn between<'a>(text: &'a str, begin: &str, end: &str, what: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = text.lines().collect();
    let b =
        lines.iter().position(|l| l.trim_end() == begin).unwrap_or_else(|| panic!("{what}: no {begin:?}"));
    let e = b
        + 1
        + lines[b + 1..]
            .iter()
            .position(|l| l.trim_end() == end)
            .unwrap_or_else(|| panic!("{what}: no {end:?}"));
    lines[b + 1..e].to_vec()
}

#[test]
fn the_readme_snippet_is_the_crate_source() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let source = read(&crate_dir.join("src/lib.rs"));
    let readme = read(&crate_dir.join("../../README.md"));
    let code = between(&source, "// README: begin", "// README: end", "src/lib.rs");
    let after_marker = readme
        .split_once(README_MARKER)
        .unwrap_or_else(|| panic!("README.md has no line {README_MARKER:?} before the Rust plugin snippet"))
        .1;
    let snippet = between(after_marker, "```rust", "```", "README.md after the marker");
    assert!(code.len() > 20, "the marked source is too short to be the plugin: {code:?}");
    if snippet != code {
        let first =
            snippet.iter().zip(&code).position(|(a, b)| a != b).unwrap_or(snippet.len().min(code.len()));
        panic!(
            "README.md's Rust plugin snippet and examples/rust-plugin/src/lib.rs differ from line {} of the \
             snippet:\n  README: {:?}\n  source: {:?}\nCopy the source between its README markers into the \
             README (or the other way round).",
            first + 1,
            snippet.get(first),
            code.get(first)
        );
    }
}
