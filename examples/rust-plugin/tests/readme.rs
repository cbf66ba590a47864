//! The README's "Write a plugin in Rust" snippet is this crate's source
//! between its `// README: begin` and `// README: end` markers, line for
//! line, so the README shows code that builds and passes the conformance
//! kit (`tests/conformance.rs`), and the two cannot drift.

#[test]
fn the_readme_snippet_is_the_crate_source() {
    memplug_test_support::readme::assert_readme_snippet("examples/rust-plugin/src/lib.rs");
}
