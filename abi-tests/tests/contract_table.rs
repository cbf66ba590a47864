//! The contract, clause by clause: every sentence of `include/memplug.h`
//! that says must, never, only, at least or exactly has a row in
//! `docs/CONTRACT.md`, and every check a row names exists (a kit check by
//! its reported name, a test by its function in its file).

use memplug_test_support::repo_root;
use std::path::Path;

const KEYWORDS: &[&str] = &["must", "never", "only", "at least", "exactly"];

/// The comment text of the header, as paragraphs: a blank comment line, a
/// code line or a `- ` bullet ends one.
fn comment_paragraphs(header: &str) -> Vec<String> {
    let mut paragraphs = Vec::new();
    let mut current: Vec<String> = Vec::new();
    let mut flush = |current: &mut Vec<String>| {
        if !current.is_empty() {
            paragraphs.push(current.join(" "));
            current.clear();
        }
    };
    for line in header.lines() {
        let t = line.trim();
        let body = if let Some(rest) = t.strip_prefix("//") {
            rest.trim().to_string()
        } else if t.starts_with("/*") || t.starts_with('*') {
            t.trim_start_matches('/')
                .trim_start_matches('*')
                .trim_end_matches('/')
                .trim_end_matches('*')
                .trim()
                .to_string()
        } else {
            flush(&mut current);
            continue;
        };
        let body = match body.strip_prefix("- ") {
            Some(rest) => {
                flush(&mut current);
                rest.to_string()
            }
            None => body,
        };
        if body.is_empty() {
            flush(&mut current);
        } else {
            current.push(body);
        }
    }
    flush(&mut current);
    paragraphs
}

fn fold(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Sentences end at `.`, `!` or `?` followed by a space and a capital, a
/// backquote or a parenthesis.
fn sentences(paragraph: &str) -> Vec<String> {
    let text = fold(paragraph);
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    for i in 0..bytes.len() {
        let ends = matches!(bytes[i], b'.' | b'!' | b'?')
            && bytes.get(i + 1) == Some(&b' ')
            && bytes.get(i + 2).is_some_and(|c| c.is_ascii_uppercase() || *c == b'`' || *c == b'(');
        if ends {
            out.push(text[start..=i].trim().to_string());
            start = i + 2;
        }
    }
    let last = text[start..].trim();
    if !last.is_empty() {
        out.push(last.to_string());
    }
    out
}

fn is_clause(sentence: &str) -> bool {
    let lower = sentence.to_lowercase();
    let words: Vec<&str> =
        lower.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()).collect();
    KEYWORDS.iter().any(|k| {
        let kw: Vec<&str> = k.split(' ').collect();
        words.windows(kw.len()).any(|w| w == kw.as_slice())
    })
}

fn header_clauses() -> Vec<String> {
    let header = std::fs::read_to_string(repo_root().join("include/memplug.h")).unwrap();
    let mut clauses: Vec<String> = Vec::new();
    for p in comment_paragraphs(&header) {
        for s in sentences(&p) {
            if is_clause(&s) && !clauses.contains(&s) {
                clauses.push(s);
            }
        }
    }
    clauses
}

/// `(clause, checks)` for every row of the table.
fn table_rows() -> Vec<(String, Vec<String>)> {
    let doc = std::fs::read_to_string(repo_root().join("docs/CONTRACT.md")).unwrap();
    let (clauses, _) = doc.split_once(HOST_STATUSES).expect("docs/CONTRACT.md has its host statuses section");
    clauses
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| clause") && !l.starts_with("| ---"))
        .map(|l| {
            let inner = l.trim().trim_start_matches('|').trim_end_matches('|');
            // The checks column is the last; the clause may contain `|` only
            // inside code spans, which the header never has.
            let (clause, checks) = inner.rsplit_once('|').expect("two columns");
            let checks = checks.split(',').map(|c| c.trim().to_string()).filter(|c| !c.is_empty()).collect();
            (fold(clause), checks)
        })
        .collect()
}

fn sources_under(dir: &Path, out: &mut String) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources_under(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push_str(&std::fs::read_to_string(&p).unwrap());
        }
    }
}

fn check_exists(check: &str, kit_sources: &str) -> Result<(), String> {
    if let Some(name) = check.strip_prefix("kit:") {
        if kit_sources.contains(&format!("\"{name}\"")) {
            return Ok(());
        }
        return Err(format!("no kit check named '{name}' in conformance/src"));
    }
    if let Some(rest) = check.strip_prefix("test:") {
        let (path, function) =
            rest.split_once("::").ok_or(format!("'{check}' is not test:PATH::FUNCTION"))?;
        let text = std::fs::read_to_string(repo_root().join(path)).map_err(|e| format!("{path}: {e}"))?;
        if text.contains(&format!("fn {function}(")) {
            return Ok(());
        }
        return Err(format!("{path} has no fn {function}"));
    }
    Err(format!("'{check}' is neither kit:NAME nor test:PATH::FUNCTION"))
}

#[test]
fn every_clause_of_the_header_has_a_row_and_every_row_a_clause() {
    let clauses = header_clauses();
    assert!(clauses.len() > 30, "found only {} clauses: is the header parsed?", clauses.len());
    let rows = table_rows();
    let missing: Vec<&String> = clauses.iter().filter(|c| !rows.iter().any(|(r, _)| r == *c)).collect();
    assert!(
        missing.is_empty(),
        "clauses of include/memplug.h with no row in docs/CONTRACT.md (add a row naming the check that \
         proves each):\n{}",
        missing.iter().map(|c| format!("| {c} | |")).collect::<Vec<_>>().join("\n")
    );
    let stale: Vec<&String> = rows.iter().map(|(r, _)| r).filter(|r| !clauses.contains(r)).collect();
    assert!(stale.is_empty(), "rows of docs/CONTRACT.md quoting no sentence of the header:\n{stale:#?}");
}

#[test]
fn every_row_names_checks_that_exist() {
    let mut kit = String::new();
    sources_under(&repo_root().join("conformance/src"), &mut kit);
    let mut problems = Vec::new();
    for (clause, checks) in table_rows() {
        if checks.is_empty() {
            problems.push(format!("no check for: {clause}"));
        }
        for c in &checks {
            if let Err(e) = check_exists(c, &kit) {
                problems.push(format!("{e} (row: {clause})"));
            }
        }
    }
    assert!(problems.is_empty(), "docs/CONTRACT.md:\n{}", problems.join("\n"));
}

#[test]
fn the_clause_finder_sees_sentences_and_bullets() {
    let header =
        "// A slot must not unwind. Other text.\n/* Rules:\n *  - Threads: never twice.\n */\nint x;\n";
    let found: Vec<String> =
        comment_paragraphs(header).iter().flat_map(|p| sentences(p)).filter(|s| is_clause(s)).collect();
    assert_eq!(found, ["A slot must not unwind.", "Threads: never twice."]);
}

/// The heading of the second table of docs/CONTRACT.md: host statuses by
/// kind of refusal (the clause table ends there).
const HOST_STATUSES: &str = "\n## Host statuses\n";

/// `(refusal, [rust, c, python, proven by])` for every row of the host
/// status table.
fn status_rows() -> Vec<(String, Vec<String>)> {
    let doc = std::fs::read_to_string(repo_root().join("docs/CONTRACT.md")).unwrap();
    let (_, table) = doc.split_once(HOST_STATUSES).expect("docs/CONTRACT.md has its host statuses section");
    table
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| refusal") && !l.starts_with("| ---"))
        .map(|l| {
            let cells: Vec<String> =
                l.trim().trim_matches('|').split(" | ").map(|c| c.trim().to_string()).collect();
            assert_eq!(cells.len(), 5, "a host status row has five columns: {l}");
            (cells[0].clone(), cells[1..].to_vec())
        })
        .collect()
}

#[test]
fn every_host_status_has_a_row_naming_classes_and_tests_that_exist() {
    let rows = status_rows();
    // The host C API's headers: the umbrella and one per topic.
    let mut header = std::fs::read_to_string(repo_root().join("include/memplug_host.h")).unwrap();
    let mut topics: Vec<_> = std::fs::read_dir(repo_root().join("include/memplug/host"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    topics.sort();
    for topic in topics {
        header.push_str(&std::fs::read_to_string(topic).unwrap());
    }
    // Every status the C API defines (but success) is the answer of some row.
    let statuses: Vec<&str> = header
        .lines()
        .filter_map(|l| l.trim().strip_prefix("MEMPLUG_HOST_STATUS_"))
        .filter_map(|l| l.split_once(" = ").map(|(name, _)| name))
        .filter(|name| *name != "OK")
        .collect();
    assert!(statuses.len() > 20, "found only {statuses:?}");
    let c_column: String = rows.iter().map(|(_, c)| c[1].as_str()).collect::<Vec<_>>().join(" ");
    let missing: Vec<&&str> = statuses.iter().filter(|s| !c_column.contains(&format!("`{s}`"))).collect();
    assert!(missing.is_empty(), "C statuses no row of docs/CONTRACT.md gives: {missing:?}");
    // Every Python class named is one the module defines.
    let py: String = std::fs::read_to_string(repo_root().join("python/src/errors.rs"))
        .unwrap()
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let mut kit = String::new();
    sources_under(&repo_root().join("conformance/src"), &mut kit);
    let mut problems = Vec::new();
    for (refusal, cols) in &rows {
        for class in cols[2].split('`').skip(1).step_by(2) {
            if !py.contains(&format!("create_exception!(memplug,{class},")) {
                problems.push(format!("no Python class {class} (row: {refusal})"));
            }
        }
        let checks: Vec<&str> = cols[3].split(", ").map(str::trim).filter(|c| !c.is_empty()).collect();
        if checks.is_empty() {
            problems.push(format!("no test for: {refusal}"));
        }
        for c in checks {
            if let Err(e) = check_exists(c, &kit) {
                problems.push(format!("{e} (row: {refusal})"));
            }
        }
    }
    assert!(problems.is_empty(), "docs/CONTRACT.md, host statuses:\n{}", problems.join("\n"));
}
