//! Shared by the kit's own tests: reading a report.

#![allow(dead_code)]

use memplug_conformance::{Outcome, Report};
use std::collections::BTreeSet;

/// Every result of the report, one per line, for assertion messages.
pub fn table(r: &Report) -> String {
    r.checks
        .iter()
        .map(|c| {
            format!(
                "{:<40} {:<12} {:<7} {}",
                c.name,
                c.mechanism.as_deref().unwrap_or("-"),
                c.outcome,
                c.detail
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The names of the checks that failed.
pub fn failed(r: &Report) -> BTreeSet<String> {
    r.failures().map(|c| c.name.to_string()).collect()
}

/// The one result of `check`: plugin-wide, or on the plugin's first
/// mechanism (the CPU plugin's `"cpu"`; its other mechanisms are judged by
/// the same checks, and `claims.rs` looks at them by name).
pub fn one(r: &Report, check: &str) -> (Outcome, String) {
    let first = r.mechanisms.first().map(|m| m.name.as_str());
    let v: Vec<_> =
        r.results(check).filter(|c| c.mechanism.is_none() || c.mechanism.as_deref() == first).collect();
    assert_eq!(v.len(), 1, "{check} reported {} times:\n{}", v.len(), table(r));
    (v[0].outcome, v[0].detail.clone())
}

/// The result of `check` on mechanism `mech`, if the report has it.
pub fn of(r: &Report, check: &str, mech: &str) -> Option<(Outcome, String)> {
    let v: Vec<_> = r.results(check).filter(|c| c.mechanism.as_deref() == Some(mech)).collect();
    assert!(v.len() <= 1, "{check} reported {} times for {mech}:\n{}", v.len(), table(r));
    v.first().map(|c| (c.outcome, c.detail.clone()))
}
