//! What the kit asks the OS about memory a CPU-kind plugin hands out, so it
//! never touches an address the plugin lied about: `/proc/self/maps` for
//! protections, `mincore` for residency, and a forked child for anything
//! that is expected (or feared) to crash.

use std::time::{Duration, Instant};

/// The OS page size.
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as u64
    } else {
        4096
    }
}

/// Protection of one mapped range, from `/proc/self/maps`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Prot {
    pub read: bool,
    pub write: bool,
}

/// The protections covering `[addr, addr + len)`, or `None` when some byte
/// of it is not mapped at all. When several mappings cover the range, a
/// permission is reported only if every one of them grants it.
pub(crate) fn protection(addr: u64, len: u64) -> Option<Prot> {
    let end = addr.checked_add(len)?;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let mut ranges: Vec<(u64, u64, Prot)> = maps
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (lo, hi) = it.next()?.split_once('-')?;
            let perms = it.next()?.as_bytes();
            Some((
                u64::from_str_radix(lo, 16).ok()?,
                u64::from_str_radix(hi, 16).ok()?,
                Prot { read: perms.first() == Some(&b'r'), write: perms.get(1) == Some(&b'w') },
            ))
        })
        .filter(|&(lo, hi, _)| lo < end && addr < hi)
        .collect();
    ranges.sort_by_key(|r| r.0);
    let mut at = addr;
    let mut prot = Prot { read: true, write: true };
    for (lo, hi, p) in ranges {
        if lo > at {
            return None;
        }
        prot.read &= p.read;
        prot.write &= p.write;
        at = at.max(hi);
        if at >= end {
            return Some(prot);
        }
    }
    None
}

/// True when `[addr, addr + len)` is mapped readable and writable.
pub(crate) fn writable(addr: u64, len: u64) -> bool {
    matches!(protection(addr, len), Some(Prot { read: true, write: true }))
}

/// Resident pages of the page-aligned range `[addr, addr + len)`, or the
/// error `mincore` gave.
pub(crate) fn resident_pages(addr: u64, len: u64) -> Result<usize, String> {
    let page = page_size();
    if addr % page != 0 {
        return Err(format!("address {addr:#x} is not page-aligned"));
    }
    let pages = len.div_ceil(page) as usize;
    let mut vec = vec![0u8; pages];
    // SAFETY: mincore only reads the page tables of the range and writes
    // `pages` bytes into `vec`.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, len as usize, vec.as_mut_ptr()) };
    if r != 0 {
        return Err(format!("mincore failed: {}", std::io::Error::last_os_error()));
    }
    Ok(vec.iter().filter(|b| **b & 1 != 0).count())
}

/// How a forked child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChildEnd {
    Exited(i32),
    Signaled(i32),
    TimedOut,
    ForkFailed,
}

impl ChildEnd {
    pub(crate) fn describe(self) -> String {
        match self {
            ChildEnd::Exited(c) => format!("exited with status {c}"),
            ChildEnd::Signaled(s) => format!("was killed by signal {s} ({})", signal_name(s)),
            ChildEnd::TimedOut => "did not finish in time (killed)".into(),
            ChildEnd::ForkFailed => "could not be forked".into(),
        }
    }
}

pub(crate) fn signal_name(s: i32) -> &'static str {
    match s {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGABRT => "SIGABRT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        _ => "other",
    }
}

/// Runs `f` in a forked child (one thread: the caller's) and reports how
/// the child ended: `f`'s return value as the exit status, or the signal
/// that killed it. The child never returns into the kit: it leaves with
/// `_exit`. The child restores the default SIGSEGV/SIGBUS actions first,
/// so a fault kills it rather than running a handler of the parent's.
///
/// `f` runs in a copy of a multi-threaded process: it may only call into
/// the plugin and do simple work (no locks another thread might have held).
pub(crate) fn in_child(timeout: Duration, f: impl FnOnce() -> i32) -> ChildEnd {
    // SAFETY: fork; the child only runs `f` and `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return ChildEnd::ForkFailed;
    }
    if pid == 0 {
        // SAFETY: in the child; resetting handlers and exiting are
        // async-signal-safe.
        unsafe {
            libc::signal(libc::SIGSEGV, libc::SIG_DFL);
            libc::signal(libc::SIGBUS, libc::SIG_DFL);
        }
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101);
        // SAFETY: leaves the child without running the parent's atexit
        // handlers or destructors.
        unsafe { libc::_exit(code) };
    }
    let start = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            if libc::WIFEXITED(status) {
                return ChildEnd::Exited(libc::WEXITSTATUS(status));
            }
            if libc::WIFSIGNALED(status) {
                return ChildEnd::Signaled(libc::WTERMSIG(status));
            }
        } else if r < 0 {
            return ChildEnd::ForkFailed;
        }
        if start.elapsed() > timeout {
            // SAFETY: our own child; reaped right after.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return ChildEnd::TimedOut;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}
