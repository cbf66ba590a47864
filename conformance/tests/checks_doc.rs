//! `docs/conformance-checks.md` is generated from the kit's own catalogue
//! (`memplug_conformance::checks_markdown`): this fails when the committed
//! file differs, and `MEMPLUG_BLESS=1` rewrites it (as for the generated
//! headers, `test-support/src/header_drift.rs`).

use memplug_test_support::repo_root;

#[test]
fn the_checks_page_is_generated_from_the_catalogue() {
    let path = repo_root().join("docs/conformance-checks.md");
    let generated = memplug_conformance::checks_markdown();
    if std::env::var_os("MEMPLUG_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write docs/conformance-checks.md");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/conformance-checks.md is stale: regenerate it with \
         `MEMPLUG_BLESS=1 cargo test -p memplug-conformance --test checks_doc` and commit it"
    );
    // Every check is on the page, once, with the header clause it covers
    // and what its failure usually means.
    for c in memplug_conformance::CHECKS {
        assert_eq!(committed.matches(&format!("| `{}` |", c.name)).count(), 1, "{}", c.name);
        assert!(!c.clause().is_empty() && !c.failure_means().is_empty(), "{}", c.name);
        let row = committed.lines().find(|l| l.starts_with(&format!("| `{}` |", c.name))).unwrap();
        assert_eq!(row.matches(" | ").count(), 4, "{}: five columns: {row}", c.name);
    }
}
