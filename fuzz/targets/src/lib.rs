//! Bodies of memplug's fuzz targets, shared by two drivers:
//!
//! * `fuzz/fuzz_targets/*.rs` — cargo-fuzz (libFuzzer, nightly,
//!   AddressSanitizer): `scripts/fuzz.sh TARGET [SECONDS]`;
//! * `tests/bounded.rs` — a bounded run on the stable toolchain, part of the
//!   workspace tests: every seed of `fuzz/corpus/<target>/` plus a fixed
//!   number of pseudo-random inputs from a fixed seed.
//!
//! Each target is a `run(&[u8])` that panics when the host misbehaves, and a
//! `describe(&[u8])` that prints what an input decodes to.
//!
//! * [`plugin_descriptor`] — the loader against plugin structs whose every
//!   byte the fuzzer chooses (in fuzz-owned, guard-paged memory).
//! * [`host_calls`] — sequences of host API calls on a process memory
//!   manager with the reference CPU plugin, checking the governor's ledger
//!   after every call and that everything comes back at the end.

pub mod arena;
pub mod host_calls;
pub mod input;
pub mod plugin_descriptor;
