//! The report as JSON (the `serde` feature): field names are the Rust
//! names; per-class figures are objects keyed by class name.

use super::report::StatsReport;
use crate::governor::{AllocationClass, ClassStats};
use serde::ser::{SerializeMap, Serializer};

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

/// Per-class figures as `{"weights": {..}, "kv": {..}, ...}`.
pub(crate) fn classes<S: Serializer>(
    classes: &[ClassStats; AllocationClass::COUNT],
    s: S,
) -> Result<S::Ok, S::Error> {
    let mut m = s.serialize_map(Some(classes.len()))?;
    for (class, stats) in AllocationClass::ALL.iter().zip(classes) {
        m.serialize_entry(class.name(), stats)?;
    }
    m.end()
}
