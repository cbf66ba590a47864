//! The README's "Embedding the host from Rust" snippet is this example's
//! source between its `// README: begin` and `// README: end` markers,
//! line for line (less the function body's indentation), so the README
//! shows code that compiles and runs (`tests/run.rs`).

#[test]
fn the_readme_snippet_is_the_example_source() {
    memplug_test_support::readme::assert_readme_snippet("examples/embedding/src/main.rs");
}
