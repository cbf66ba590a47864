//! The report as JSON (the `serde` feature): field names are the Rust
//! names; per-class figures are objects keyed by class name (the governor's
//! statistics say so themselves).

use super::report::StatsReport;

/// The report as one line of JSON.
pub fn to_json(report: &StatsReport) -> String {
    // Serialising plain data (numbers, strings, maps with string keys)
    // into a String cannot fail.
    serde_json::to_string(report).expect("a statistics report always serialises")
}

/// The report as indented JSON, for people.
pub fn to_json_pretty(report: &StatsReport) -> String {
    serde_json::to_string_pretty(report).expect("a statistics report always serialises")
}
