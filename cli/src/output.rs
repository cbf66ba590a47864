//! Writing to standard output and standard error without panicking.
//! `println!` and `eprintln!` panic (exit 101) when the write fails, as it
//! does once a reader closed its end of the pipe (`memplug inspect --json |
//! head -c1`: EPIPE, since Rust ignores SIGPIPE); every line the CLI prints
//! goes through here instead. A reader that went away is not an error of
//! the run: what is left is dropped and the exit status stays what it
//! would have been. A descriptor closed outright (`>&-`, `2>&-`) needs
//! nothing here: Rust's runtime reopens a closed 0, 1 or 2 on /dev/null
//! before `main`, so no file the command opens takes its place.

use crate::exit;
use std::io::{ErrorKind, Write};

/// Standard output, written until its reader goes away.
#[derive(Default)]
pub struct Stdout {
    /// The reader went away, or writing failed: write nothing more.
    closed: bool,
    /// Writing failed for another reason than a closed pipe (a full disk):
    /// the output is incomplete, which the exit status says.
    failed: bool,
}

impl Stdout {
    pub fn write(&mut self, s: &str) {
        if self.closed {
            return;
        }
        let mut out = std::io::stdout().lock();
        if let Err(e) = out.write_all(s.as_bytes()).and_then(|()| out.flush()) {
            self.closed = true;
            if e.kind() != ErrorKind::BrokenPipe {
                self.failed = true;
                complain(&format!("cannot write to standard output: {e}"));
            }
        }
    }

    /// `status`, unless the output could not be written for another reason
    /// than a reader that went away: then [`exit::FAILED`] in place of
    /// [`exit::OK`].
    pub fn status(&self, status: u8) -> u8 {
        if self.failed && status == exit::OK {
            exit::FAILED
        } else {
            status
        }
    }
}

/// `memplug: s` on standard error. A closed or broken standard error is
/// ignored: there is nowhere left to say anything.
pub fn complain(s: &str) {
    let _ = writeln!(std::io::stderr().lock(), "memplug: {s}");
}
