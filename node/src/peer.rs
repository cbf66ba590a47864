//! Who is on the other end of a Unix socket, and whether that process is
//! still alive: `SO_PEERCRED` (set by the kernel at connect, so a process
//! cannot claim another's pid) and a pidfd (which names that process and no
//! later one that reuses its pid).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

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
pub struct Liveness(Option<OwnedFd>);

impl Liveness {
    /// `pid`'s pidfd; without one (a kernel before 5.3), a process is
    /// taken as alive while `kill(pid, 0)` finds it.
    pub fn of(pid: i32) -> Liveness {
        // SAFETY: pidfd_open takes a pid and flags; it returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        // SAFETY: a fd the kernel just returned, owned by nobody else.
        Liveness((fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) }))
    }

    /// Whether the process has exited (a pidfd is readable once it has).
    pub fn exited(&self, pid: i32) -> bool {
        match &self.0 {
            Some(fd) => {
                let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd, no wait.
                let n = unsafe { libc::poll(&mut p, 1, 0) };
                n == 1 && p.revents & libc::POLLIN != 0
            }
            None => {
                // SAFETY: signal 0 only checks that the process exists.
                let rc = unsafe { libc::kill(pid, 0) };
                rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
            }
        }
    }
}
