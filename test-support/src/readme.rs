//! README snippets that are copies of compiled sources: the README says
//! where each comes from on the line before its code block, and the
//! source marks the copied lines, so a test can hold the two together.

use crate::repo_root;
use std::path::Path;

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// The lines strictly between `begin` and `end` (each a whole line, compared
/// without trailing blanks).
fn between<'a>(text: &'a str, begin: &str, end: &str, what: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = text.lines().collect();
    let b = lines.iter().position(|l| l.trim() == begin).unwrap_or_else(|| panic!("{what}: no {begin:?}"));
    let e = b
        + 1
        + lines[b + 1..].iter().position(|l| l.trim() == end).unwrap_or_else(|| panic!("{what}: no {end:?}"));
    lines[b + 1..e].to_vec()
}

/// The lines common leading blanks removed, so a snippet cut from inside a
/// function reads at the README's left margin.
fn dedent<'a>(lines: &[&'a str]) -> Vec<&'a str> {
    let indent = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    lines.iter().map(|l| if l.trim().is_empty() { "" } else { &l[indent..] }).collect()
}

/// Panics unless the README's `rust` block after the line
/// `<!-- SOURCE, between its README markers -->` is, line for line, the
/// lines of `SOURCE` (relative to the repository root) between its
/// `// README: begin` and `// README: end` lines, less their common
/// indentation. The message names the first line that differs.
pub fn assert_readme_snippet(source: &str) {
    let root = repo_root();
    let code = read(&root.join(source));
    let readme = read(&root.join("README.md"));
    let marker = format!("<!-- {source}, between its README markers -->");
    let code = dedent(&between(&code, "// README: begin", "// README: end", source));
    assert!(code.iter().any(|l| !l.trim().is_empty()), "{source}: nothing between its README markers");
    let (_, after) = readme
        .split_once(&marker)
        .unwrap_or_else(|| panic!("README.md has no line {marker:?} before the snippet of {source}"));
    let snippet = between(after, "```rust", "```", "README.md after the marker");
    let differs = code.iter().zip(&snippet).position(|(a, b)| a.trim_end() != b.trim_end());
    let at = differs.or((code.len() != snippet.len()).then(|| code.len().min(snippet.len())));
    if let Some(i) = at {
        panic!(
            "README.md's snippet and {source} (between its README markers) differ at line {} of the snippet:\n  \
             README: {:?}\n  source: {:?}\nCopy the source's lines into the README (or the other way round).",
            i + 1,
            snippet.get(i).copied().unwrap_or("<end>"),
            code.get(i).copied().unwrap_or("<end>"),
        );
    }
}
