//! Running `memplug` with its standard output or error gone: a pipe whose
//! read end is closed before the child starts (every write fails with
//! EPIPE, deterministically, unlike a `| head` that may read everything
//! first), or a descriptor closed outright (`>&-`, `2>&-`, through `sh`).
//! `Stdio::null()` is neither: writes to it succeed.

use std::process::{Command, Stdio};

/// The write end of a pipe whose read end is already closed.
pub fn reader_gone() -> Stdio {
    let (read, write) = rustix::pipe::pipe().expect("pipe");
    drop(read);
    Stdio::from(write)
}

/// How a run with something gone ended: its exit code (None: killed by a
/// signal) and what it wrote to the stream that was still there.
pub struct Ran {
    pub code: Option<i32>,
    pub other: String,
}

fn memplug(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_memplug"));
    c.args(args).stdin(Stdio::null());
    c
}

/// `memplug args` with stdout's reader gone; stderr captured.
pub fn stdout_gone(args: &[&str]) -> Ran {
    let out = memplug(args).stdout(reader_gone()).stderr(Stdio::piped()).output().expect("run memplug");
    Ran { code: out.status.code(), other: String::from_utf8_lossy(&out.stderr).into_owned() }
}

/// `memplug args` with stderr's reader gone; stdout captured.
pub fn stderr_gone(args: &[&str]) -> Ran {
    let out = memplug(args).stdout(Stdio::piped()).stderr(reader_gone()).output().expect("run memplug");
    Ran { code: out.status.code(), other: String::from_utf8_lossy(&out.stdout).into_owned() }
}

/// `memplug args` with both readers gone.
pub fn both_gone(args: &[&str]) -> Option<i32> {
    memplug(args).stdout(reader_gone()).stderr(reader_gone()).status().expect("run memplug").code()
}

/// `memplug args` through `sh -c 'exec memplug args REDIRECTIONS'`, e.g.
/// `>&- 2>&-`: the descriptors closed outright (what is not closed goes
/// to /dev/null).
pub fn closed(args: &[&str], redirections: &str) -> Option<i32> {
    Command::new("sh")
        .arg("-c")
        .arg(format!("exec \"$0\" \"$@\" {redirections}"))
        .arg(env!("CARGO_BIN_EXE_memplug"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run sh")
        .code()
}

/// `memplug args | head -c1` as a shell runs it; memplug's exit code.
pub fn head_c1(args: &[&str]) -> Option<i32> {
    let out = Command::new("sh")
        .arg("-c")
        .arg("exec 3>&1; { \"$0\" \"$@\" 3>&-; echo \"status $?\" >&3; } | head -c1 >/dev/null")
        .arg(env!("CARGO_BIN_EXE_memplug"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run sh");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().find_map(|l| l.strip_prefix("status ")).and_then(|s| s.trim().parse().ok())
}
