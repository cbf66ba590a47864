//! The exit statuses of every `memplug` command, in one place
//! (`docs/cli.md` documents them).

/// The command did what it was asked and every check passed.
pub const OK: u8 = 0;
/// A check failed (the demo's, or the conformance kit's: failed, crashed
/// or timed out), or the output could not be written (a full disk; a
/// reader that went away is not a failure).
pub const FAILED: u8 = 1;
/// Bad usage: an unknown command or option, a bad value, an output file
/// that cannot be created. clap's own usage errors exit with 2 as well.
pub const USAGE: u8 = 2;
/// The command could not do its job at all: the plugin could not be
/// loaded, negotiated or read (`inspect`, `conformance`), or an error
/// stopped the demo before its end.
pub const COULD_NOT_RUN: u8 = 3;

/// What `memplug --help` says about exit statuses.
pub const HELP: &str = "\
Exit status (every command):
  0  ok: done, every check passed
  1  a check failed
  2  usage error
  3  could not run: the plugin could not be loaded or read, or an error stopped the demo
A reader that goes away (a closed pipe) or a closed stdout/stderr does not change the exit status: the \
output left is dropped quietly. --json output: docs/cli.md.";
