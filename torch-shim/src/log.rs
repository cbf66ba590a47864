//! The shim's messages, on stderr (torch gives an allocator no other
//! channel), filtered by `MEMPLUG_TORCH_LOG`.

use crate::config::LogLevel;
use memplug_host::observe::Level;
use std::fmt::Arguments;
use std::sync::atomic::{AtomicU8, Ordering};

/// Warnings until the configuration is read (a refused configuration is
/// itself a warning).
static LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Warn as u8);

/// Repeated warnings of one kind (unknown frees) past this many are only
/// counted: a runtime that frees foreign pointers in a loop must not
/// flood stderr. The statistics keep the full count.
pub(crate) const REPEAT_LIMIT: u64 = 16;

pub(crate) fn set_level(l: LogLevel) {
    LEVEL.store(l as u8, Ordering::Relaxed);
}

fn enabled(l: LogLevel) -> bool {
    LEVEL.load(Ordering::Relaxed) >= l as u8
}

pub(crate) fn warn(args: Arguments<'_>) {
    if enabled(LogLevel::Warn) {
        eprintln!("memplug-torch: warning: {args}");
    }
}

/// The `n`-th warning of a repeated kind (1-based).
pub(crate) fn warn_limited(n: u64, args: Arguments<'_>) {
    if n <= REPEAT_LIMIT {
        warn(args);
    }
    if n == REPEAT_LIMIT {
        warn(format_args!("(further ones are only counted: memplug_torch_stats_json)"));
    }
}

pub(crate) fn info(args: Arguments<'_>) {
    if enabled(LogLevel::Info) {
        eprintln!("memplug-torch: {args}");
    }
}

/// A message of the plugin (its explanation of a failed call is a
/// warning; chatter during calls that succeeded is info).
pub(crate) fn plugin(level: Level, source: &str, message: &str) {
    match level {
        Level::Info => info(format_args!("{source}: {message}")),
        _ => warn(format_args!("{source}: {message}")),
    }
}
