//! cargo-fuzz driver of `memplug_fuzz_targets::host_calls` (see there for
//! what it covers and checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| memplug_fuzz_targets::host_calls::run(data));
