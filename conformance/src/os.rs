//! What the kit asks of the OS: the process of each check ([`supervise`]:
//! forked, its output captured, its verdict read from a pipe, killed when
//! it hangs); and about memory a CPU-kind plugin hands out, so it never
//! touches an address the plugin lied about: `/proc/self/maps` for
//! protections, `mincore` for residency, and a forked child ([`in_child`])
//! for a probe inside a check that is expected (or feared) to crash.

use std::os::fd::RawFd;
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

/// True when `[addr, addr + len)` is mapped readable.
pub(crate) fn readable(addr: u64, len: u64) -> bool {
    matches!(protection(addr, len), Some(Prot { read: true, .. }))
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

/// What `/proc/self/smaps` says backs the mappings overlapping a range:
/// the sizes of the kernel pages of each, and the bytes mapped with huge
/// pages by transparent huge pages (anonymous, shmem or file PMD maps).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Backing {
    /// `KernelPageSize` of each overlapping mapping, in bytes (distinct).
    pub kernel_page_sizes: Vec<u64>,
    /// `AnonHugePages` + `ShmemPmdMapped` + `FilePmdMapped`, in bytes.
    pub thp_bytes: u64,
    /// How many mappings overlap the range.
    pub mappings: usize,
}

/// [`Backing`] of `[addr, addr + len)`, or `None` when smaps cannot be read.
pub(crate) fn backing(addr: u64, len: u64) -> Option<Backing> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let end = addr.saturating_add(len);
    let mut b = Backing::default();
    let mut inside = false;
    for line in smaps.lines() {
        let mut it = line.split_whitespace();
        let Some(first) = it.next() else { continue };
        if let Some((lo, hi)) = first.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) {
                inside = lo < end && addr < hi;
                b.mappings += usize::from(inside);
                continue;
            }
        }
        if !inside {
            continue;
        }
        let kib = || it.clone().next().and_then(|v| v.parse::<u64>().ok()).map(|k| k * 1024);
        match first {
            "KernelPageSize:" => {
                if let Some(v) = kib() {
                    if !b.kernel_page_sizes.contains(&v) {
                        b.kernel_page_sizes.push(v);
                    }
                }
            }
            "AnonHugePages:" | "ShmemPmdMapped:" | "FilePmdMapped:" => b.thp_bytes += kib().unwrap_or(0),
            _ => {}
        }
    }
    Some(b)
}

/// The page sizes this kernel can back memory with: the base page, the
/// transparent huge page size, and each hugetlbfs size.
pub(crate) fn kernel_page_sizes() -> Vec<u64> {
    let mut v = vec![page_size()];
    if let Some(n) = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
    {
        v.push(n);
    }
    if let Ok(dir) = std::fs::read_dir("/sys/kernel/mm/hugepages") {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(k) = name.strip_prefix("hugepages-").and_then(|s| s.strip_suffix("kB")) {
                if let Ok(k) = k.parse::<u64>() {
                    v.push(k * 1024);
                }
            }
        }
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// The transparent huge page setting (`always [madvise] never`), for
/// details.
pub(crate) fn thp_setting() -> String {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Whether NUMA node `n` exists, or `None` when the kernel does not say
/// (no `/sys/devices/system/node`).
pub(crate) fn numa_node_exists(n: u32) -> Option<bool> {
    let dir = std::path::Path::new("/sys/devices/system/node");
    dir.is_dir().then(|| dir.join(format!("node{n}")).is_dir())
}

/// The NUMA node of the page at `addr` (`get_mempolicy(MPOL_F_NODE |
/// MPOL_F_ADDR)`, which faults the page in if it is not), or why it
/// cannot be told.
pub(crate) fn node_of_page(addr: u64) -> Result<u32, String> {
    const MPOL_F_NODE: libc::c_ulong = 1;
    const MPOL_F_ADDR: libc::c_ulong = 2;
    let mut node: libc::c_int = -1;
    // SAFETY: only the mode is written (no node mask is passed); `addr` is
    // the caller's mapped page.
    let r = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut node as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_ulong>(),
            0 as libc::c_ulong,
            addr as usize,
            MPOL_F_NODE | MPOL_F_ADDR,
        )
    };
    if r != 0 {
        return Err(format!("get_mempolicy failed: {}", std::io::Error::last_os_error()));
    }
    u32::try_from(node).map_err(|_| format!("get_mempolicy answered node {node}"))
}

/// What `/proc/self/fd/<fd>` links to (`/memfd:name (deleted)`,
/// `anon_inode:dmabuf`, a path), or `None`.
pub(crate) fn fd_link(fd: i32) -> Option<String> {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).ok().map(|p| p.to_string_lossy().into_owned())
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
            ChildEnd::Signaled(s) => format!("was killed by {} (signal {s})", signal_name(s)),
            ChildEnd::TimedOut => "did not finish in time (killed)".into(),
            ChildEnd::ForkFailed => "could not be forked".into(),
        }
    }
}

/// The name of signal `s` (`"SIGSEGV"`), or `"an unknown signal"`.
pub(crate) fn signal_name(s: i32) -> &'static str {
    match s {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGABRT => "SIGABRT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGSYS => "SIGSYS",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGHUP => "SIGHUP",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        _ => "an unknown signal",
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
        // SAFETY: in the child; resetting handlers, asking to die with the
        // parent and exiting are async-signal-safe.
        unsafe {
            libc::signal(libc::SIGSEGV, libc::SIG_DFL);
            libc::signal(libc::SIGBUS, libc::SIG_DFL);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
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

// ---------------------------------------------------------------------------
// The process of one check
// ---------------------------------------------------------------------------

/// The descriptor a supervised child writes its messages to.
pub(crate) const MESSAGE_FD: RawFd = 3;

/// Where a child finds the descriptor [`supervise`] was asked to keep (the
/// plugin file the parent opened, which every check loads).
pub(crate) const KEPT_FD: RawFd = MESSAGE_FD + 1;

/// Bytes of a child's output (stdout and stderr together) the kit keeps:
/// the last ones.
pub(crate) const OUTPUT_TAIL: usize = 2048;

/// What a supervised child did.
pub(crate) struct Supervised {
    /// Each line it wrote to [`MESSAGE_FD`] (without the newline), with
    /// when the kit read it.
    pub lines: Vec<(Instant, Vec<u8>)>,
    /// The last [`OUTPUT_TAIL`] bytes it wrote to stdout or stderr.
    pub output: Vec<u8>,
    /// How many bytes it wrote there in all.
    pub output_len: usize,
    pub end: ChildEnd,
    /// When the kit saw it end (or killed it).
    pub ended: Instant,
}

/// Closes `fd`, ignoring errors.
fn close(fd: RawFd) {
    // SAFETY: closing a descriptor this module opened.
    unsafe { libc::close(fd) };
}

/// A pipe, both ends close-on-exec, the read end non-blocking.
fn pipe() -> Result<(RawFd, RawFd), String> {
    let mut fds = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe failed: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: fcntl on the descriptor just made.
    unsafe {
        let fl = libc::fcntl(fds[0], libc::F_GETFL);
        libc::fcntl(fds[0], libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
    Ok((fds[0], fds[1]))
}

/// Runs `child` in a forked child process and watches it from this
/// thread, starting no thread.
///
/// In the child: a process group of its own, SIGKILL when this thread's
/// process goes away, default actions for the crash signals, no signal
/// blocked, stdin `/dev/null`, stdout and stderr into a pipe this side
/// reads (what a plugin prints cannot reach the caller's terminal or
/// report), messages to [`MESSAGE_FD`], `keep` (when given) at
/// [`KEPT_FD`], every other inherited descriptor closed; `child`'s return value is its exit status (101 if it panics),
/// and it leaves with `_exit` (no destructor or atexit handler of the
/// caller's runs there).
///
/// Here: the child is killed — its whole process group, so anything it
/// forked too — when `idle` passes without a message line, and otherwise
/// waited for. Whatever it left in its group is killed once it is gone.
pub(crate) fn supervise(
    idle: Duration,
    keep: Option<RawFd>,
    child: impl FnOnce(RawFd) -> i32,
) -> Result<Supervised, String> {
    let (msg_r, msg_w) = pipe()?;
    let (out_r, out_w) = match pipe() {
        Ok(p) => p,
        Err(e) => {
            close(msg_r);
            close(msg_w);
            return Err(e);
        }
    };
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: fork; the child runs only `child_setup` and `child`, then
    // `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        for fd in [msg_r, msg_w, out_r, out_w] {
            close(fd);
        }
        return Err(format!("fork failed: {e}"));
    }
    if pid == 0 {
        // SAFETY: in the new child, before anything else runs.
        unsafe { child_setup(parent, msg_w, out_w, keep) };
        let code =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| child(MESSAGE_FD))).unwrap_or(101);
        // SAFETY: leaves without running the parent's destructors or
        // atexit handlers.
        unsafe { libc::_exit(code) };
    }
    // SAFETY: the child is ours; setting its group here as well closes the
    // race with its own setpgid. Closing our copies of its ends.
    unsafe { libc::setpgid(pid, pid) };
    close(msg_w);
    close(out_w);
    let watched = watch(pid, idle, msg_r, out_r);
    close(msg_r);
    close(out_r);
    Ok(watched)
}

/// The child's side of [`supervise`], before `child` runs.
///
/// # Safety
/// Only in the child just forked by [`supervise`], with its pipe ends.
unsafe fn child_setup(parent: libc::pid_t, msg_w: RawFd, out_w: RawFd, keep: Option<RawFd>) {
    libc::setpgid(0, 0);
    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    if libc::getppid() != parent {
        libc::_exit(0);
    }
    for s in
        [libc::SIGSEGV, libc::SIGBUS, libc::SIGABRT, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP, libc::SIGSYS]
    {
        libc::signal(s, libc::SIG_DFL);
    }
    let mut none: libc::sigset_t = core::mem::zeroed();
    libc::sigemptyset(&mut none);
    libc::sigprocmask(libc::SIG_SETMASK, &none, core::ptr::null_mut());
    // Move the ends out of the way first: any of them may sit on 0..=3.
    let high = |fd: RawFd| libc::fcntl(fd, libc::F_DUPFD, 64);
    let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
    let (msg, out, null) = (high(msg_w), high(out_w), if null >= 0 { high(null) } else { -1 });
    let kept = keep.map(high);
    if msg < 0 || out < 0 || kept.is_some_and(|k| k < 0) {
        libc::_exit(120);
    }
    if null >= 0 {
        libc::dup2(null, 0);
    }
    libc::dup2(out, 1);
    libc::dup2(out, 2);
    libc::dup2(msg, MESSAGE_FD);
    match kept {
        Some(k) => {
            libc::dup2(k, KEPT_FD);
            close_from(KEPT_FD + 1);
        }
        None => close_from(MESSAGE_FD + 1),
    }
}

/// Closes every descriptor from `first` up.
///
/// # Safety
/// Nothing in this process may use those descriptors afterwards.
unsafe fn close_from(first: RawFd) {
    if libc::syscall(libc::SYS_close_range, first as libc::c_uint, libc::c_uint::MAX, 0 as libc::c_uint) == 0
    {
        return;
    }
    let max = match libc::sysconf(libc::_SC_OPEN_MAX) {
        n if n > 0 => n.min(1 << 16) as RawFd,
        _ => 1024,
    };
    for fd in first..max {
        libc::close(fd);
    }
}

/// Whether `pid` has ended (without reaping it).
fn has_ended(pid: libc::pid_t) -> bool {
    // SAFETY: waitid on our own child, writing only `info`.
    let mut info: libc::siginfo_t = unsafe { core::mem::zeroed() };
    let r = unsafe {
        libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT)
    };
    // SAFETY: si_pid is set when waitid reported a child.
    r != 0 || unsafe { info.si_pid() } == pid
}

/// Kills `pid`'s process group (and `pid` itself, should it not lead one).
fn kill_group(pid: libc::pid_t) {
    // SAFETY: `pid` is our unreaped child, so no other process or group
    // can have its number.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
        libc::kill(pid, libc::SIGKILL);
    }
}

/// Reads what `fd` has now into `buf`; false once it reached its end.
fn drain(fd: RawFd, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 8192];
    loop {
        // SAFETY: reads into a local buffer of its length.
        let n = unsafe { libc::read(fd, chunk.as_mut_ptr().cast(), chunk.len()) };
        if n > 0 {
            buf.extend_from_slice(&chunk[..n as usize]);
            continue;
        }
        if n == 0 {
            return false;
        }
        let e = std::io::Error::last_os_error();
        return matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted);
    }
}

fn watch(pid: libc::pid_t, idle: Duration, msg_r: RawFd, out_r: RawFd) -> Supervised {
    let mut lines = Vec::new();
    let mut partial = Vec::new();
    let mut output = Vec::new();
    let mut output_len = 0;
    let (mut msg_open, mut out_open) = (true, true);
    let mut deadline = Instant::now() + idle;
    let mut timed_out = false;
    while msg_open || out_open {
        let now = Instant::now();
        if now >= deadline {
            timed_out = true;
            break;
        }
        let wait = (deadline - now).min(Duration::from_millis(100));
        let mut fds = [
            libc::pollfd { fd: if msg_open { msg_r } else { -1 }, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: if out_open { out_r } else { -1 }, events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: polls two descriptors of ours (a negative one is ignored).
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, wait.as_millis().max(1) as libc::c_int) };
        #[cfg(test)]
        tests::pause_after_a_quiet_poll(r);
        // Quiet: the child may be gone while something it forked still
        // holds the pipes. It may also have written its last lines and
        // ended after the poll returned: what is in the pipes then is read
        // before they are given up (a verdict lost there read as a crash
        // with exit status 0).
        let ended = r == 0 && has_ended(pid);
        if r == 0 && !ended {
            continue;
        }
        if ended || fds[0].revents != 0 {
            msg_open = drain(msg_r, &mut partial);
            let now = Instant::now();
            while let Some(i) = partial.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = partial.drain(..=i).collect();
                lines.push((now, line[..line.len() - 1].to_vec()));
                deadline = now + idle;
            }
        }
        if ended || fds[1].revents != 0 {
            let before = output.len();
            out_open = drain(out_r, &mut output);
            output_len += output.len() - before;
            if output.len() > 2 * OUTPUT_TAIL {
                output.drain(..output.len() - OUTPUT_TAIL);
            }
        }
        if ended {
            break;
        }
    }
    if !timed_out {
        // Its pipes are closed: it is exiting. Give it until the deadline.
        while !has_ended(pid) {
            if Instant::now() >= deadline {
                timed_out = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let ended = Instant::now();
    // Whatever is left of its group goes, the child with it if it hung.
    kill_group(pid);
    let mut status = 0;
    // SAFETY: reaps our own child (dead, or killed just above).
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let end = if timed_out {
        ChildEnd::TimedOut
    } else if libc::WIFSIGNALED(status) {
        ChildEnd::Signaled(libc::WTERMSIG(status))
    } else {
        ChildEnd::Exited(libc::WEXITSTATUS(status))
    };
    if output.len() > OUTPUT_TAIL {
        output.drain(..output.len() - OUTPUT_TAIL);
    }
    Supervised { lines, output, output_len, end, ended }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    /// Milliseconds `watch` sleeps after a poll that found nothing, before
    /// it asks whether the child ended: widens the window in which a child
    /// writes its last line and ends (0: no pause).
    static QUIET_POLL_PAUSE_MS: AtomicU64 = AtomicU64::new(0);

    pub(super) fn pause_after_a_quiet_poll(r: libc::c_int) {
        let ms = QUIET_POLL_PAUSE_MS.load(Relaxed);
        if r == 0 && ms > 0 {
            std::thread::sleep(Duration::from_millis(ms));
        }
    }

    #[test]
    fn lines_written_just_before_the_end_are_read_even_after_a_quiet_poll() {
        // The child holds the pipes open through a grandchild (so they never
        // close), stays quiet past the first poll (100 ms), then writes its
        // verdict and ends while `watch` pauses after that quiet poll. The
        // next look finds it ended: the line must still be read.
        QUIET_POLL_PAUSE_MS.store(150, Relaxed);
        let s = supervise(Duration::from_secs(5), None, |fd| {
            // SAFETY: fork in a test child; the grandchild only sleeps.
            if unsafe { libc::fork() } == 0 {
                std::thread::sleep(Duration::from_secs(30));
                // SAFETY: leaves the grandchild.
                unsafe { libc::_exit(0) };
            }
            std::thread::sleep(Duration::from_millis(170));
            send(fd, "verdict\n");
            0
        });
        QUIET_POLL_PAUSE_MS.store(0, Relaxed);
        let s = s.unwrap();
        assert_eq!(s.end, ChildEnd::Exited(0));
        assert!(s.lines.iter().any(|l| l.1 == b"verdict"), "the last line was lost: {:?}", s.lines);
    }

    fn send(fd: RawFd, s: &str) {
        // SAFETY: writes a local buffer to the message descriptor.
        unsafe { libc::write(fd, s.as_ptr().cast(), s.len()) };
    }

    #[test]
    fn a_child_reports_and_exits() {
        let s = supervise(Duration::from_secs(5), None, |fd| {
            send(fd, "one\ntwo\n");
            // Raw writes: the test harness captures println! in-process.
            send(1, "printed\n");
            send(2, "complained\n");
            7
        })
        .unwrap();
        assert_eq!(s.end, ChildEnd::Exited(7));
        let lines: Vec<&[u8]> = s.lines.iter().map(|l| l.1.as_slice()).collect();
        assert_eq!(lines, [b"one".as_slice(), b"two"]);
        let out = String::from_utf8_lossy(&s.output);
        assert!(out.contains("printed") && out.contains("complained"), "{out}");
    }

    #[test]
    fn a_crash_is_a_signal_and_the_output_is_bounded() {
        let s = supervise(Duration::from_secs(5), None, |_| {
            for _ in 0..1000 {
                send(1, "0123456789012345678901234567890123456789\n");
            }
            // SAFETY: deliberately ends the child as a crash would.
            unsafe { libc::raise(libc::SIGSEGV) };
            0
        })
        .unwrap();
        assert_eq!(s.end, ChildEnd::Signaled(libc::SIGSEGV));
        assert_eq!(signal_name(libc::SIGSEGV), "SIGSEGV");
        assert!(
            s.output.len() <= OUTPUT_TAIL && s.output_len > 40_000,
            "{} {}",
            s.output.len(),
            s.output_len
        );
    }

    #[test]
    fn a_silent_child_is_killed_with_what_it_forked() {
        let t = Instant::now();
        let s = supervise(Duration::from_millis(300), None, |fd| {
            // A grandchild holding the pipes open must not keep the kit
            // waiting either.
            // SAFETY: fork in a test child that only sleeps afterwards.
            unsafe { libc::fork() };
            send(fd, "started\n");
            std::thread::sleep(Duration::from_secs(60));
            0
        })
        .unwrap();
        assert_eq!(s.end, ChildEnd::TimedOut);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(s.lines.iter().any(|l| l.1 == b"started"));
    }
}
