//! The `--json` documents' schema versions, one per schema, and the form a
//! document takes when its command could not do its job (`docs/cli.md`).
//! A version is bumped when a field changes meaning or goes away, not when
//! one is added.

use serde::Serialize;

/// `memplug demo --json`.
pub const DEMO: u32 = 1;
/// `memplug node demo --json`.
pub const NODE_DEMO: u32 = 1;
/// `memplug inspect --json`.
pub const INSPECT: u32 = 1;
/// `memplug conformance --json`: the kit's report
/// (`docs/conformance-json.md`).
pub const CONFORMANCE: u32 = memplug_conformance::SCHEMA_VERSION;

/// The document of a command that could not do its job: `ok` false, why,
/// and its counts (all zero), so that a consumer finds the fields it
/// always reads.
#[derive(Serialize)]
pub struct CouldNotRun<'a, C: Serialize> {
    pub schema_version: u32,
    pub ok: bool,
    pub error: &'a str,
    pub counts: C,
}

impl<'a, C: Serialize> CouldNotRun<'a, C> {
    pub fn new(schema_version: u32, error: &'a str, counts: C) -> Self {
        CouldNotRun { schema_version, ok: false, error, counts }
    }
}

/// `v` as one pretty-printed JSON document, newline-terminated.
pub fn to_json(v: &impl Serialize) -> serde_json::Result<String> {
    Ok(serde_json::to_string_pretty(v)? + "\n")
}
