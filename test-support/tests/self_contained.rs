//! The repository stands on its own. A clone has everything its text refers
//! to, so no file may point at the folder of notes kept beside a checkout,
//! cite the design page that `docs/ARCHITECTURE.md` replaced, or name an
//! absolute path of one machine (home directories, a build machine's work
//! folder). And every citation of `ARCHITECTURE.md` must name a section,
//! and an invariant, that the page has.
//!
//! The files checked are git's (tracked, and untracked but not ignored, so
//! a new file is caught before it is committed); without git, the tree
//! minus what the root `.gitignore` anchors. Binary files are skipped. The
//! patterns are spelled in pieces below so that this file passes its own
//! check.

use memplug_test_support::repo_root;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A rule over single lines: what it looks for, where it is allowed, and
/// what to do instead.
struct Rule {
    name: &'static str,
    hit: fn(&str) -> bool,
    /// Path prefixes (relative to the root) where the rule does not apply.
    allowed: &'static [&'static str],
    fix: &'static str,
}

const RULES: &[Rule] = &[
    Rule {
        name: "points outside the repository",
        hit: |l| l.contains(concat!("..", "/shared")),
        allowed: &[],
        fix: "refer to a file of the repository instead",
    },
    Rule {
        name: "cites the design page that docs/ARCHITECTURE.md replaced",
        hit: cites_old_design,
        // Frozen byte for byte (their SHA-256 is pinned); the changelog
        // says what their citation means.
        allowed: &["abi-tests/frozen/", "docs/ABI-CHANGELOG.md"],
        fix: "cite ARCHITECTURE.md and the same section number",
    },
    Rule {
        name: "names an absolute path of one machine",
        hit: names_machine_path,
        allowed: &[],
        fix: "use a path relative to the repository",
    },
];

/// The old page's name as a word: upper case, not part of a longer
/// identifier.
fn cites_old_design(line: &str) -> bool {
    const WORD: &str = concat!("DESI", "GN");
    line.match_indices(WORD).any(|(i, _)| {
        let before = line[..i].chars().next_back();
        let after = line[i + WORD.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// An absolute path into a home or work folder: the folder's name right
/// after a `/` that starts a path (not `fuzz/work/`, a relative path
/// that happens to contain one).
fn names_machine_path(line: &str) -> bool {
    const ROOTS: &[&str] = &[concat!("/wo", "rk/"), concat!("/ho", "me/"), concat!("/ro", "ot/")];
    ROOTS.iter().any(|root| {
        line.match_indices(root).any(|(i, _)| {
            let before = line[..i].chars().next_back();
            !before.is_some_and(|c| is_ident(c) || matches!(c, '.' | '-' | '/' | '~' | '$' | '}'))
        })
    })
}

/// Files to check, relative to the root, with their text; binary files and
/// files that are listed but deleted from the work tree are left out.
fn text_files(root: &Path) -> Vec<(String, String)> {
    let names = git_files(root).unwrap_or_else(|| walked_files(root));
    let mut out = Vec::new();
    for name in names {
        let Ok(bytes) = std::fs::read(root.join(&name)) else { continue };
        if bytes.contains(&0) {
            continue;
        }
        if let Ok(text) = String::from_utf8(bytes) {
            out.push((name, text));
        }
    }
    assert!(out.len() > 100, "only {} text files found under {}", out.len(), root.display());
    out
}

fn git_files(root: &Path) -> Option<BTreeSet<String>> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "-z", "--cached", "--others", "--exclude-standard"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let list = String::from_utf8(out.stdout).expect("git ls-files prints UTF-8 paths here");
    Some(list.split('\0').filter(|s| !s.is_empty()).map(str::to_owned).collect())
}

/// Without git: every file under the root but `.git` and what a
/// `.gitignore` of its folder or above anchors (`/target`, …) or ignores
/// by suffix (`*.so`) — enough of git's rules for the files this
/// repository ignores.
fn walked_files(root: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut todo: Vec<(PathBuf, Vec<String>)> = vec![(root.to_path_buf(), Vec::new())];
    while let Some((dir, mut suffixes)) = todo.pop() {
        let ignore = std::fs::read_to_string(dir.join(".gitignore")).unwrap_or_default();
        let anchored: Vec<&str> = ignore.lines().filter_map(|l| l.trim().strip_prefix('/')).collect();
        suffixes.extend(ignore.lines().filter_map(|l| l.trim().strip_prefix('*')).map(str::to_owned));
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())).flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name == ".git"
                || anchored.contains(&name.as_str())
                || suffixes.iter().any(|s| name.ends_with(s))
            {
                continue;
            }
            match e.file_type() {
                Ok(t) if t.is_dir() => todo.push((e.path(), suffixes.clone())),
                Ok(t) if t.is_file() => {
                    out.insert(e.path().strip_prefix(root).unwrap().to_string_lossy().into_owned());
                }
                _ => {}
            }
        }
    }
    out
}

#[test]
fn nothing_points_outside_the_repository() {
    let root = repo_root();
    let mut found = Vec::new();
    for (name, text) in text_files(&root) {
        for rule in RULES.iter().filter(|r| !r.allowed.iter().any(|a| name.starts_with(a))) {
            for (n, line) in text.lines().enumerate().filter(|(_, l)| (rule.hit)(l)) {
                found.push(format!("{name}:{}: {} ({}):\n    {}", n + 1, rule.name, rule.fix, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "{} line(s) refer to things outside the repository:\n{}",
        found.len(),
        found.join("\n")
    );
}

/// What `docs/ARCHITECTURE.md` has: its section numbers (`## N. …`) and the
/// invariants of §2 (`N. **…`).
fn architecture(root: &Path) -> (BTreeSet<u32>, BTreeSet<u32>) {
    let page = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md");
    let (mut sections, mut invariants) = (BTreeSet::new(), BTreeSet::new());
    let mut current = 0;
    for line in page.lines() {
        if let Some(n) = line.strip_prefix("## ").and_then(|h| leading_number(h, ". ")) {
            current = n;
            sections.insert(n);
        } else if current == 2 {
            if let Some(n) = leading_number(line, ". **") {
                invariants.insert(n);
            }
        }
    }
    (sections, invariants)
}

/// The number `s` starts with, and the rest of `s`.
fn number(s: &str) -> Option<(u32, &str)> {
    let digits = s.len() - s.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    Some((s[..digits].parse().ok()?, &s[digits..]))
}

/// The number `s` starts with, when `then` follows it.
fn leading_number(s: &str, then: &str) -> Option<u32> {
    number(s).filter(|(_, rest)| rest.starts_with(then)).map(|(n, _)| n)
}

/// Every `ARCHITECTURE.md §N` / `ARCHITECTURE.md section N` (and a
/// following `, invariant M`) in `line`, as (N, Some(M)).
fn citations(line: &str) -> Vec<(u32, Option<u32>)> {
    let mut out = Vec::new();
    for (i, m) in line.match_indices("ARCHITECTURE.md") {
        let rest = &line[i + m.len()..];
        let Some(rest) = rest.strip_prefix(" §").or_else(|| rest.strip_prefix(" section ")) else {
            continue;
        };
        let Some((section, rest)) = number(rest) else { continue };
        let invariant = rest.strip_prefix(", invariant ").and_then(number).map(|(n, _)| n);
        out.push((section, invariant));
    }
    out
}

#[test]
fn every_citation_of_the_architecture_names_what_it_has() {
    let root = repo_root();
    let (sections, invariants) = architecture(&root);
    assert!(sections.contains(&2) && sections.contains(&6), "sections found: {sections:?}");
    assert_eq!(invariants.len(), *invariants.last().unwrap() as usize, "invariants 1..=N: {invariants:?}");
    let mut cited = 0;
    let mut bad = Vec::new();
    for (name, text) in text_files(&root) {
        for (n, line) in text.lines().enumerate() {
            for (s, inv) in citations(line) {
                cited += 1;
                let missing = if !sections.contains(&s) {
                    Some(format!("§{s} (sections: {sections:?})"))
                } else if inv.is_some_and(|i| s != 2 || !invariants.contains(&i)) {
                    Some(format!(
                        "§{s}, invariant {} (invariants are §2's 1..={})",
                        inv.unwrap(),
                        invariants.len()
                    ))
                } else {
                    None
                };
                if let Some(m) = missing {
                    bad.push(format!(
                        "{name}:{}: docs/ARCHITECTURE.md has no {m}:\n    {}",
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(cited >= 30, "only {cited} citations of ARCHITECTURE.md found: is the pattern still right?");
    assert!(bad.is_empty(), "{} citation(s) name nothing:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn the_line_rules_see_what_they_are_for() {
    let design = concat!("DESI", "GN");
    assert!(cites_old_design(&format!("see {design}.md §3")));
    assert!(cites_old_design(&format!("({design} §6)")));
    assert!(cites_old_design(&format!("it is {design}'s rule")));
    assert!(!cites_old_design(&format!("{design}ATED or UN{design}")));
    let work = concat!("/wo", "rk/");
    assert!(names_machine_path(&format!("cd {work}main")));
    assert!(names_machine_path(&format!("`{work}x`")));
    assert!(names_machine_path(concat!("path=/ho", "me/me/x")));
    assert!(!names_machine_path(&format!("fuzz{work}corpus")));
    assert!(!names_machine_path(&format!("$HOME{work}x and ~{work}x")));
    assert_eq!(citations("(ARCHITECTURE.md §2, invariant 8)."), vec![(2, Some(8))]);
    assert_eq!(citations("ARCHITECTURE.md section 3, Versioning"), vec![(3, None)]);
    assert_eq!(citations("ARCHITECTURE.md §1, §4"), vec![(1, None)]);
}
