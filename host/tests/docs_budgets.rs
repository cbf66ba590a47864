//! `docs/ARCHITECTURE.md` §6 names, for each performance budget, the tools
//! that measure it: every callgrind path it names is one of the `hotpath`
//! example's paths, every bench a bench file, and no row says it has none.

use std::path::Path;

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The "measured by" cell of each row of §6's budget table.
fn measured_by() -> Vec<String> {
    let page = read("docs/ARCHITECTURE.md");
    let from = page.find("## 6. Performance budgets").expect("§6");
    let to = from + page[from..].find("## 7.").expect("§7");
    page[from..to]
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| path") && !l.starts_with("| ---"))
        .map(|l| l.trim_matches('|').rsplit('|').next().unwrap().trim().to_string())
        .collect()
}

fn quoted(s: &str) -> Vec<&str> {
    s.split('`').skip(1).step_by(2).flat_map(|w| w.split('/')).collect()
}

#[test]
fn every_budget_names_tools_that_exist() {
    let rows = measured_by();
    assert!(rows.len() >= 10, "§6's table: {rows:?}");
    let hotpath = read("host/examples/hotpath.rs");
    for row in &rows {
        assert!(!row.contains("no bench") && !row.contains("yet"), "a budget measured by nothing: {row}");
        for part in row.split(';') {
            let part = part.trim();
            let (tool, names) = part.split_once(' ').unwrap_or((part, ""));
            match tool {
                "callgrind" => {
                    for name in quoted(names) {
                        assert!(
                            hotpath.contains(&format!("(\"{name}\", Path::")),
                            "no callgrind path {name}: {row}"
                        );
                    }
                }
                "bench" => {
                    let name = quoted(names)[0];
                    let file =
                        ["host/benches", "capi/benches"].map(|d| repo().join(d).join(format!("{name}.rs")));
                    assert!(file.iter().any(|f| f.is_file()), "no bench {name}: {row}");
                }
                other => panic!("§6 names an unknown tool {other:?}: {row}"),
            }
        }
    }
}
