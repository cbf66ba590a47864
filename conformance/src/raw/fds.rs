//! Descriptors handed out by `export_fd`: what one names, its file's
//! size, the kit's own kept apart from the plugin's, and a temporary
//! mapping of one.

use memplug_sdk::abi::*;

/// What an open descriptor names: its file's `(st_dev, st_ino)`, or `None`
/// when `fd` is not open. Two descriptors of one file name the same; a
/// number closed and reused for another file names something else.
pub(crate) fn fd_identity(fd: i32) -> Option<(u64, u64)> {
    if fd < 0 {
        return None;
    }
    // SAFETY: fstat only writes the zeroed struct it is given.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev as u64, st.st_ino as u64))
}

/// The size of the regular file `fd` names, or `None` for anything else
/// (another kind of descriptor, or none).
pub(crate) fn fd_file_size(fd: i32) -> Option<u64> {
    // SAFETY: as in `fd_identity`.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    if fd < 0 || unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    (st.st_mode & libc::S_IFMT == libc::S_IFREG).then_some(st.st_size as u64)
}

/// Descriptors the kit owns, each with the identity it had when the kit
/// took it: dropping closes each one that still names that file, and never
/// a number a misbehaving plugin closed behind the kit's back and the
/// process reused.
/// The handle kinds whose `fd` is a descriptor.
pub(super) const FD_KINDS: u32 = MEMPLUG_HANDLE_OPAQUE_FD | MEMPLUG_HANDLE_DMABUF_FD | MEMPLUG_HANDLE_MEMFD;

/// Stops the check (a failure naming it, through the child's panic guard)
/// when an export answered with one of the descriptors the kit's check
/// process had open before the call — its standard streams, its message
/// pipe to the kit, the plugin file it loads: a plugin handing out a
/// descriptor it does not own. The kit must never adopt and close one of
/// those (closing the message pipe would end the check without a
/// verdict, and look like the plugin exiting).
pub(super) fn refuse_kit_fd(slot: &str, fd: i32) {
    let what = match fd {
        0 => "the kit's standard input",
        1 | 2 => "the kit's standard output or error",
        crate::os::MESSAGE_FD => "the kit's own message pipe to its parent",
        crate::os::KEPT_FD => "the kit's own descriptor of the plugin library",
        _ => return,
    };
    panic!(
        "{slot} returned descriptor {fd}, which is {what}: open before the call, not made for it. The plugin \
         handed out a descriptor it does not own (an export must be a new descriptor, e.g. a dup of its own); \
         the kit leaves it open"
    );
}

#[derive(Default)]
pub(crate) struct OwnedFds(Vec<(i32, (u64, u64))>);

impl OwnedFds {
    /// Takes ownership of `fd`, which names the file `id`.
    pub(crate) fn adopt(&mut self, fd: i32, id: (u64, u64)) {
        self.0.push((fd, id));
    }

    /// Closes `fd` now (if it still names the file it was adopted with).
    pub(crate) fn close(&mut self, fd: i32) {
        if let Some(i) = self.0.iter().position(|(f, _)| *f == fd) {
            let (fd, id) = self.0.swap_remove(i);
            close_if_same(fd, id);
        }
    }
}

impl Drop for OwnedFds {
    fn drop(&mut self) {
        for (fd, id) in self.0.drain(..) {
            close_if_same(fd, id);
        }
    }
}

fn close_if_same(fd: i32, id: (u64, u64)) {
    if fd_identity(fd) == Some(id) {
        // SAFETY: the kit's own descriptor, still naming the file it took.
        unsafe { libc::close(fd) };
    }
}

/// `[0, len)` of the file `fd` mapped shared into this process (read-only
/// or read-write); unmapped on drop.
pub(crate) struct FdView {
    pub addr: *mut u8,
    len: usize,
}

impl FdView {
    /// Maps `fd`, which the caller checked is a regular file of at least
    /// `len` bytes; `None` when mmap refuses.
    pub(crate) fn map(fd: i32, len: u64, write: bool) -> Option<FdView> {
        let prot = if write { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        // SAFETY: a new mapping chosen by the kernel; nothing else is touched.
        let p = unsafe { libc::mmap(core::ptr::null_mut(), len as usize, prot, libc::MAP_SHARED, fd, 0) };
        (p != libc::MAP_FAILED).then(|| FdView { addr: p.cast(), len: len as usize })
    }
}

impl Drop for FdView {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.addr.cast(), self.len) };
    }
}
