//! Sharing physical objects across processes (ABI 1.1,
//! `MEMPLUG_CAP_SHARED_EXPORT`): a physical object is a sealed memfd, so
//! exporting it is a `dup` handed to the caller, and importing a descriptor
//! checks it is memory this mechanism can map — a memfd sealed against
//! shrinking, open for reading and writing, at least as large as asked —
//! before keeping a `dup` of it.

use memplug_sdk::{PluginError, PluginResult};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{FileType, OFlags, SealFlags};

#[cold]
fn unusable(why: String) -> PluginError {
    PluginError::invalid_argument(format!("import_fd: {why}; nothing was imported"))
}

/// A new close-on-exec descriptor for the same memory.
pub fn duplicate(fd: impl AsFd, what: &str) -> PluginResult<OwnedFd> {
    rustix::io::fcntl_dupfd_cloexec(fd, 0).map_err(|e| {
        let msg = format!("{what}: fcntl(F_DUPFD_CLOEXEC) failed: {e}");
        if e == rustix::io::Errno::MFILE || e == rustix::io::Errno::NFILE {
            PluginError::out_of_memory(msg)
        } else {
            PluginError::internal(msg)
        }
    })
}

/// Checks that `fd` is memory a physical object of `size` bytes can be
/// backed by, and keeps a duplicate of it. Mappings rely on every page of
/// the object existing for as long as it lives, which only a memfd sealed
/// against shrinking guarantees (another process holds the same file).
pub fn adopt(fd: BorrowedFd<'_>, size: u64) -> PluginResult<OwnedFd> {
    let st = rustix::fs::fstat(fd).map_err(|e| unusable(format!("fstat failed: {e}")))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(unusable("the descriptor is not a memory file (memfd)".into()));
    }
    let seals = rustix::fs::fcntl_get_seals(fd)
        .map_err(|e| unusable(format!("the descriptor is not a sealable memfd (F_GET_SEALS: {e})")))?;
    if !seals.contains(SealFlags::SHRINK) {
        return Err(unusable(
            "the memfd is not sealed against shrinking (F_SEAL_SHRINK), so its pages could vanish under a \
             mapping"
                .into(),
        ));
    }
    let flags = rustix::fs::fcntl_getfl(fd).map_err(|e| unusable(format!("F_GETFL failed: {e}")))?;
    if flags & OFlags::RWMODE != OFlags::RDWR {
        return Err(unusable("the descriptor is not open for reading and writing".into()));
    }
    let len = u64::try_from(st.st_size).unwrap_or(0);
    if len < size {
        return Err(PluginError::out_of_range(format!(
            "import_fd: the memory behind the descriptor is {len} bytes, less than the {size} asked for; \
             nothing was imported"
        )));
    }
    duplicate(fd, "import_fd")
}
