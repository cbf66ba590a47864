//! Who is on the other end of a Unix socket, and whether that process is
//! still alive: `SO_PEERCRED` (set by the kernel at connect, so a process
//! cannot claim another's pid) and a pidfd (which names that process and no
//! later one that reuses its pid).
//!
//! Without a pidfd (a kernel before 5.3, or `pidfd_open` answering ENOSYS
//! as under valgrind 3.19; `MEMPLUG_NODE_NO_PIDFD=1` forces this, for
//! tests) the process is read from `/proc/PID/stat`: it has exited once
//! the entry is gone, is a zombie (`Z`, `X`: dead, not yet reaped), or
//! names a process that started at another time (its pid was reused).
//! `kill(pid, 0)` alone is not enough: it succeeds on a zombie and on a
//! reused pid, so a killed member whose parent had not reaped it yet, or
//! whose pid went to another process, was watched for ever and its leases
//! never came back.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Set to `1` to watch members through `/proc` instead of a pidfd (the
/// fallback for kernels and tools without `pidfd_open`), so tests can run
/// that path on any machine. Read when a member connects.
pub const NO_PIDFD_ENV: &str = "MEMPLUG_NODE_NO_PIDFD";

/// The peer's process, user and group ids.
pub fn credentials(s: &UnixStream) -> std::io::Result<(i32, u32, u32)> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of their sizes.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((cred.pid, cred.uid, cred.gid))
}

/// A handle on one process that says when it has exited.
pub enum Liveness {
    /// The process's pidfd.
    Pidfd(OwnedFd),
    /// No pidfd: `/proc/PID/stat`, and the process's start time when it
    /// was first seen (`None`: `/proc` could not be read then).
    Proc { start: Option<u64> },
}

/// What `/proc/PID/stat` says of a process.
#[derive(Debug, PartialEq, Eq)]
enum Stat {
    /// No such entry: the process is gone (and reaped).
    Gone,
    /// Its state letter and start time (clock ticks after boot).
    Seen { state: u8, start: u64 },
    /// `/proc` could not be read or parsed.
    Unknown,
}

fn stat(pid: i32) -> Stat {
    match std::fs::read(format!("/proc/{pid}/stat")) {
        Ok(text) => parse_stat(&text).map_or(Stat::Unknown, |(state, start)| Stat::Seen { state, start }),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) || e.raw_os_error() == Some(libc::ESRCH) => {
            Stat::Gone
        }
        Err(_) => Stat::Unknown,
    }
}

/// The state (field 3) and start time (field 22) of a `/proc/PID/stat`
/// line. The command (field 2) is in parentheses and may hold spaces and
/// parentheses itself: fields are counted after its last `)`.
fn parse_stat(text: &[u8]) -> Option<(u8, u64)> {
    let close = text.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&text[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    // Fields 4..=21 come before the start time (field 22).
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

impl Liveness {
    /// `pid`'s pidfd; without one, its `/proc` entry as it is now.
    pub fn of(pid: i32) -> Liveness {
        if std::env::var_os(NO_PIDFD_ENV).is_some_and(|v| v == "1") {
            return Liveness::proc(pid);
        }
        // SAFETY: pidfd_open takes a pid and flags; it returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Liveness::proc(pid);
        }
        // SAFETY: a fd the kernel just returned, owned by nobody else.
        Liveness::Pidfd(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }

    /// The fallback: `pid` watched through `/proc`.
    pub fn proc(pid: i32) -> Liveness {
        let start = match stat(pid) {
            Stat::Seen { start, .. } => Some(start),
            Stat::Gone | Stat::Unknown => None,
        };
        Liveness::Proc { start }
    }

    /// Whether this is the fallback.
    pub fn is_fallback(&self) -> bool {
        matches!(self, Liveness::Proc { .. })
    }

    /// Whether the process has exited. Never blocks.
    pub fn exited(&self, pid: i32) -> bool {
        match self {
            Liveness::Pidfd(fd) => {
                // A pidfd is readable once its process has exited.
                let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd, no wait.
                let n = unsafe { libc::poll(&mut p, 1, 0) };
                n == 1 && p.revents & libc::POLLIN != 0
            }
            Liveness::Proc { start } => match stat(pid) {
                Stat::Gone => true,
                Stat::Seen { state, start: now } => {
                    state == b'Z' || state == b'X' || start.is_some_and(|s| s != now)
                }
                // No /proc to read: only the signal says anything (it
                // cannot tell a zombie from a live process).
                Stat::Unknown => {
                    // SAFETY: signal 0 only checks that the process exists.
                    let rc = unsafe { libc::kill(pid, 0) };
                    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::{Duration, Instant};

    #[test]
    fn a_stat_line_is_read_past_a_command_with_parentheses_and_spaces() {
        let line = b"42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10\n";
        assert_eq!(parse_stat(line), Some((b'S', 987654)));
        assert_eq!(parse_stat(b"42 (x) Z 1"), None, "a truncated line is unknown, not a guess");
        assert_eq!(parse_stat(b"no parenthesis"), None);
    }

    /// The fallback sees a killed child exit while it is a zombie (its
    /// parent, this test, has not reaped it), within a bounded time; this
    /// process, alive, never reads as exited.
    #[test]
    fn the_fallback_sees_an_unreaped_killed_child_exit() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        let l = Liveness::proc(pid);
        assert!(l.is_fallback());
        assert!(!l.exited(pid), "a live child");
        child.kill().unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        while !l.exited(pid) {
            assert!(Instant::now() < end, "a killed, unreaped child never read as exited");
            std::thread::sleep(Duration::from_millis(5));
        }
        child.wait().unwrap();
        assert!(l.exited(pid), "reaped: gone");
        let me = std::process::id() as i32;
        assert!(!Liveness::proc(me).exited(me));
    }

    /// A pid whose process started at another time than the one first
    /// seen is a reused pid: the member it named has exited.
    #[test]
    fn a_reused_pid_reads_as_exited() {
        let me = std::process::id() as i32;
        let Liveness::Proc { start: Some(start) } = Liveness::proc(me) else { panic!("no /proc") };
        assert!(Liveness::Proc { start: Some(start + 1) }.exited(me));
        assert!(!Liveness::Proc { start: Some(start) }.exited(me));
    }
}
