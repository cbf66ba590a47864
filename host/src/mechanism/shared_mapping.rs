//! The shared mapping capability: physical objects mapped into ranges of
//! reservations, and (ABI 1.1) shared across processes as descriptors.

use super::call::Held;
use super::{class_tag, Access, MechanismInner, Placement};
use crate::error::{CallError, ObjectKind, ReleaseError};
use crate::governor::AllocationClass;
use crate::tokens::{PhysicalObject, Reservation};
use memplug_sdk::abi::*;
use memplug_sdk::Status;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Physical objects mapped into reservations.
#[derive(Clone, Copy)]
pub struct SharedMappingApi<'m> {
    pub(super) m: &'m MechanismInner,
    pub(super) vt: &'m MemplugSharedMapping,
}

impl<'m> SharedMappingApi<'m> {
    /// Creates a zero-filled physical object of at least `size` bytes.
    pub fn create(&self, size: u64) -> Result<PhysicalObject, CallError> {
        self.create_tagged(size, MEMPLUG_CLASS_OTHER, &Placement::default())
    }

    /// [`create`](Self::create), telling a 1.1 plugin what the object is
    /// for.
    pub fn create_as(&self, size: u64, class: AllocationClass) -> Result<PhysicalObject, CallError> {
        self.create_tagged(size, class_tag(class), &Placement::default())
    }

    /// [`create_as`](Self::create_as), placed as `placement` says (to a
    /// plugin that agreed on 1.2).
    pub fn create_placed(
        &self,
        size: u64,
        class: AllocationClass,
        placement: &Placement,
    ) -> Result<PhysicalObject, CallError> {
        self.create_tagged(size, class_tag(class), placement)
    }

    fn create_tagged(&self, size: u64, tag: u32, p: &Placement) -> Result<PhysicalObject, CallError> {
        const SLOT: &str = "shared_mapping.create";
        let m = self.m;
        let req = m.request(size, m.props.granularity, tag, p);
        let mut out = MechanismInner::empty_block();
        m.call(SLOT, slot!(self.vt.create), (&req, &mut out))?;
        self.new_object(SLOT, &req, &out, size)
    }

    /// Counts a physical object the plugin reported making, after checking
    /// it is at least as large as asked.
    pub(super) fn new_object(
        &self,
        slot: &'static str,
        req: &MemplugRequest,
        out: &MemplugBlock,
        size: u64,
    ) -> Result<PhysicalObject, CallError> {
        self.new_object_of(slot, req, out, size, 0)
    }

    /// [`new_object`](Self::new_object) for an import whose handle says
    /// how large its memory is (`known` bytes; 0 when it does not).
    pub(super) fn new_object_of(
        &self,
        slot: &'static str,
        req: &MemplugRequest,
        out: &MemplugBlock,
        size: u64,
        known: u64,
    ) -> Result<PhysicalObject, CallError> {
        let m = self.m;
        m.check_block_size(slot, "a physical object", size, out.size, req.page_size, known)?;
        m.born(ObjectKind::PhysicalObject);
        Ok(PhysicalObject(m.object(req, out)))
    }

    /// Maps `[object_offset, +len)` of `object` at `[offset, +len)` of `r`.
    pub fn map(
        &self,
        object: &PhysicalObject,
        object_offset: u64,
        r: &Reservation,
        offset: u64,
        len: u64,
        access: Access,
    ) -> Result<(), CallError> {
        const SLOT: &str = "shared_mapping.map";
        let m = self.m;
        let o = m.ref_if_made_here(SLOT, &object.0)?;
        let res = m.ref_if_made_here(SLOT, &r.0)?;
        m.check_range(SLOT, "physical object", object.0.size, object_offset, len)?;
        m.check_range(SLOT, "reservation", r.0.size, offset, len)?;
        m.call(SLOT, slot!(self.vt.map), (&o, object_offset, &res, offset, len, access.bits()))
    }

    /// Unmaps the mapping at `[offset, +len)` of `r`.
    pub fn unmap(&self, r: &Reservation, offset: u64, len: u64) -> Result<(), CallError> {
        const SLOT: &str = "shared_mapping.unmap";
        let res = self.m.ref_if_made_here(SLOT, &r.0)?;
        self.m.check_range(SLOT, "reservation", r.0.size, offset, len)?;
        self.m.call(SLOT, slot!(self.vt.unmap), (&res, offset, len))
    }

    /// Takes another reference to `object`; release each one.
    pub fn retain(&self, object: &PhysicalObject) -> Result<PhysicalObject, CallError> {
        const SLOT: &str = "shared_mapping.retain";
        let o = self.m.ref_if_made_here(SLOT, &object.0)?;
        self.m.call(SLOT, slot!(self.vt.retain), (&o,))?;
        self.m.born(ObjectKind::PhysicalObject);
        Ok(PhysicalObject(object.0))
    }

    /// Whether [`export_fd`](Self::export_fd) and
    /// [`import_fd`](Self::import_fd) can be called: the plugin agreed on
    /// ABI 1.1 or newer and has `MEMPLUG_CAP_SHARED_EXPORT`.
    pub fn can_export(&self) -> bool {
        self.vt.export_fd.is_some() && self.vt.import_fd.is_some()
    }

    /// Why export/import are absent (`Unsupported`, never a no-op).
    #[cold]
    fn no_export(&self, slot: &'static str) -> CallError {
        let why = if self.m.minor == 0 {
            "the plugin agreed on ABI 1.0; sharing across processes needs 1.1".to_string()
        } else {
            "the mechanism does not have MEMPLUG_CAP_SHARED_EXPORT".to_string()
        };
        self.m.refuse(slot, Status::Unsupported, why)
    }

    /// A new file descriptor for the memory of `object`, to hand to another
    /// process (for example over a Unix socket with `SCM_RIGHTS`), which
    /// imports it with [`import_fd`](Self::import_fd). The descriptor is
    /// the caller's; it holds the memory, not a counted reference, so the
    /// object is released as usual. `Unsupported` when the plugin agreed on
    /// 1.0 or lacks the capability.
    pub fn export_fd(&self, object: &PhysicalObject) -> Result<OwnedFd, CallError> {
        const SLOT: &str = "shared_mapping.export_fd";
        let Some(f) = self.vt.export_fd else {
            return Err(self.no_export(SLOT));
        };
        let o = self.m.ref_if_made_here(SLOT, &object.0)?;
        let mut fd: i32 = -1;
        // What was open before the call: a number in it is not new, so it
        // is not the plugin's to hand over (nor the host's to close).
        let before = OpenFds::now();
        self.m.call(SLOT, f, (&o, &mut fd))?;
        if let Err(why) =
            exported_fd_fault(fd).and_then(|()| before.new_one(fd)).and_then(|()| memory_file_fault(fd))
        {
            return Err(self.m.refuse(SLOT, Status::Internal, refused_fd(fd, &why, &before)));
        }
        // SAFETY: on success the plugin hands over a new descriptor the
        // caller owns (ABI contract), checked above to be open, not a
        // standard stream and of a kind that can carry memory. What the
        // host cannot check is that the plugin keeps no copy of the number
        // (the contract says it must not).
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// A physical object of this mechanism backed by the memory `fd` names
    /// (exported by [`export_fd`](Self::export_fd), here or in another
    /// process), of at least `size` bytes. `fd` stays the caller's. Release
    /// the object as one made by [`create`](Self::create). `Unsupported`
    /// when the plugin agreed on 1.0 or lacks the capability.
    pub fn import_fd(&self, fd: BorrowedFd<'_>, size: u64) -> Result<PhysicalObject, CallError> {
        const SLOT: &str = "shared_mapping.import_fd";
        let Some(f) = self.vt.import_fd else {
            return Err(self.no_export(SLOT));
        };
        let m = self.m;
        // A regular file that is not shared memory is refused before the
        // plugin sees it (a closed number is left to `lend`).
        if let Err(why) =
            memory_file_fault(fd.as_raw_fd())
                .or_else(|w| if is_open(fd.as_raw_fd()) { Err(w) } else { Ok(()) })
        {
            return Err(m.refuse(
                SLOT,
                Status::InvalidArgument,
                format!("the descriptor to import, fd {}, {why}; nothing was imported", fd.as_raw_fd()),
            ));
        }
        let req = m.request(size, m.props.granularity, MEMPLUG_CLASS_OTHER, &Placement::default());
        let mut out = MechanismInner::empty_block();
        self.lend(SLOT, fd, |lent_fd| m.call(SLOT, f, (lent_fd, &req, &mut out)))?;
        self.new_object_of(SLOT, &req, &out, size, file_length(fd.as_raw_fd()))
    }

    /// Runs `call` with a duplicate of `fd` lent to the plugin, closed here
    /// after the call: a plugin that closes what it was given (it must
    /// duplicate what it keeps) then closes only the duplicate, never the
    /// caller's descriptor. A plugin that closed or replaced the duplicate
    /// is refused (and the number left alone: closing it could close
    /// another thread's descriptor that reused it).
    pub(super) fn lend(
        &self,
        slot: &'static str,
        fd: BorrowedFd<'_>,
        call: impl FnOnce(i32) -> Result<(), CallError>,
    ) -> Result<(), CallError> {
        let m = self.m;
        let lent = fd.try_clone_to_owned().map_err(|e| {
            // A closed or invalid descriptor is the caller's argument, not
            // a shortage; only running out of descriptors is one.
            let status = match e.raw_os_error() {
                Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOMEM) => Status::OutOfMemory,
                _ => Status::InvalidArgument,
            };
            m.refuse(
                slot,
                status,
                format!("cannot duplicate fd {} to lend it to the plugin: {e}", fd.as_raw_fd()),
            )
        })?;
        let lent_fd = lent.as_raw_fd();
        let before = file_identity(lent_fd);
        let r = call(lent_fd);
        if before.is_none() || file_identity(lent_fd) != before {
            std::mem::forget(lent);
            let answer = match &r {
                Ok(()) => "and reported success (the object it made is not used, not counted and not \
                           released)"
                    .to_string(),
                Err(e) => format!("and failed: {e}"),
            };
            return Err(m.refuse(
                slot,
                Status::Internal,
                format!(
                    "the plugin closed the descriptor it was lent (fd {lent_fd}, a duplicate) {answer}; \
                     the caller's fd {} is untouched",
                    fd.as_raw_fd()
                ),
            ));
        }
        drop(lent);
        r
    }

    /// Drops one reference.
    pub fn release(&self, object: PhysicalObject) -> Result<(), ReleaseError<PhysicalObject>> {
        const SLOT: &str = "shared_mapping.release";
        let m = self.m;
        m.release_object(Held::No, SLOT, object, ObjectKind::PhysicalObject, slot!(self.vt.release), |o| {
            Ok((m.ref_if_made_here(SLOT, &o.0)?,))
        })
    }
}

/// Why `fd`, returned by a plugin's `export_fd`, cannot be taken as a new
/// descriptor for memory: a standard stream or negative, not open, an
/// `O_PATH` handle, or of a kind that cannot carry memory. Memory travels
/// as a regular file (a memfd, a file in shm or hugetlbfs), a character
/// device, or an anonymous inode (a dma-buf, say); sockets, pipes and
/// FIFOs, directories, block devices and symbolic links are refused.
pub(super) fn exported_fd_fault(fd: RawFd) -> Result<(), String> {
    if fd < 0 {
        return Err("which is not a descriptor".into());
    }
    if fd <= 2 {
        return Err("one of the standard descriptors (stdin, stdout, stderr), never a new one".into());
    }
    // SAFETY: fcntl and fstat on a number read only kernel state; an
    // unopened number fails with EBADF and changes nothing.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 || flags == -1 {
        return Err("which is not open".into());
    }
    if flags & libc::O_PATH != 0 {
        return Err("an O_PATH handle, which cannot map memory".into());
    }
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `st` is writable and sized for `struct stat`.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return Err(format!("which cannot be examined ({})", std::io::Error::last_os_error()));
    }
    // SAFETY: fstat succeeded, so it filled `st`.
    let kind = unsafe { st.assume_init() }.st_mode & libc::S_IFMT;
    match kind {
        // An anonymous inode has no file type bits.
        0 | libc::S_IFREG | libc::S_IFCHR => Ok(()),
        libc::S_IFSOCK => Err("a socket, which cannot carry memory".into()),
        libc::S_IFIFO => Err("a pipe or FIFO, which cannot carry memory".into()),
        libc::S_IFDIR => Err("a directory, which cannot carry memory".into()),
        libc::S_IFBLK => Err("a block device, which is not exported memory".into()),
        libc::S_IFLNK => Err("a symbolic link, which cannot carry memory".into()),
        other => Err(format!("of unknown file type {other:#o}")),
    }
}

/// The length `fstat` gives for `fd` (a memfd's or a dma-buf's size), or 0.
pub(super) fn file_length(fd: RawFd) -> u64 {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: as in `exported_fd_fault`.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return 0;
    }
    // SAFETY: fstat succeeded.
    u64::try_from(unsafe { st.assume_init() }.st_size).unwrap_or(0)
}

/// The descriptors open in this process at one moment (`/proc/self/fd`);
/// `None` when that cannot be read (then every number counts as possibly
/// the host's).
pub(super) struct OpenFds(pub(super) Option<Vec<i32>>);

impl OpenFds {
    /// Lists them (an export is not a hot path: one directory read).
    pub(super) fn now() -> OpenFds {
        // SAFETY: opendir/readdir/closedir on a directory stream this
        // function owns; each entry's name is a NUL-terminated string
        // valid until the next readdir.
        unsafe {
            let dir = libc::opendir(c"/proc/self/fd".as_ptr());
            if dir.is_null() {
                return OpenFds(None);
            }
            // The listing's own descriptor is closed again below: the
            // plugin may well be given its number.
            let own = libc::dirfd(dir);
            let mut v = Vec::new();
            loop {
                let e = libc::readdir(dir);
                if e.is_null() {
                    break;
                }
                let name = core::ffi::CStr::from_ptr((*e).d_name.as_ptr());
                if let Some(fd) = name.to_str().ok().and_then(|n| n.parse::<i32>().ok()) {
                    if fd != own {
                        v.push(fd);
                    }
                }
            }
            libc::closedir(dir);
            v.sort_unstable();
            OpenFds(Some(v))
        }
    }

    /// Refuses `fd` when it was open already (the process's own: a plugin
    /// must hand over a new descriptor), or when that cannot be told.
    pub(super) fn new_one(&self, fd: RawFd) -> Result<(), String> {
        match &self.0 {
            Some(v) if v.binary_search(&fd).is_err() => Ok(()),
            Some(_) => {
                Err(format!("which was open before the call ({}), not a new descriptor", what_fd_is(fd)))
            }
            None => Ok(()),
        }
    }

    /// Whether `fd` is a new descriptor the plugin made, and so the host's
    /// to close when it refuses it.
    fn made_by_the_call(&self, fd: RawFd) -> bool {
        fd > 2 && is_open(fd) && self.0.as_ref().is_some_and(|v| v.binary_search(&fd).is_err())
    }
}

/// The refusal of a descriptor `fd` a plugin handed over, for `why`: a new
/// descriptor is closed (the plugin gave it away; keeping it would leak
/// it), any other number is left as it is (it may be the host's own).
pub(super) fn refused_fd(fd: RawFd, why: &str, before: &OpenFds) -> String {
    crate::faults::count(&crate::faults::REFUSED_DESCRIPTORS);
    if before.made_by_the_call(fd) {
        // SAFETY: a descriptor opened during the call, handed to the host
        // by the plugin (whose it is no longer, by the contract), and used
        // by nothing else in the host.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
        format!("plugin reported success but returned fd {fd}, {why}; the host closed it (a new descriptor, given away)")
    } else {
        format!(
            "plugin reported success but returned fd {fd}, {why}; the host does not own it and leaves it as it is"
        )
    }
}

fn is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD reads kernel state only.
    (unsafe { libc::fcntl(fd, libc::F_GETFD) }) != -1
}

/// What `fd` is open on, as `/proc/self/fd` shows it ("/memfd:name
/// (deleted)", "anon_inode:dmabuf", "pipe:[7]", a path), for messages.
pub(super) fn what_fd_is(fd: RawFd) -> String {
    match std::fs::read_link(format!("/proc/self/fd/{fd}")) {
        Ok(t) => crate::plugin::escape_untrusted(&t.to_string_lossy()),
        Err(_) => "unknown".into(),
    }
}

/// Whether `fd` is shared memory: a memfd, or a file of tmpfs or
/// hugetlbfs (`F_GET_SEALS` answers only for those).
fn is_shared_memory(fd: RawFd) -> bool {
    // SAFETY: reads kernel state only.
    (unsafe { libc::fcntl(fd, libc::F_GET_SEALS) }) >= 0 || what_fd_is(fd).starts_with("/memfd:")
}

/// Refuses a regular file that is not shared memory (a file of procfs or
/// of a disk: `/proc/self/status` is not memory a plugin made). Other kinds
/// `exported_fd_fault` accepted (character devices, anonymous inodes such
/// as a dma-buf) pass.
pub(super) fn memory_file_fault(fd: RawFd) -> Result<(), String> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: as in `exported_fd_fault`.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return Err("which cannot be examined (fstat failed)".into());
    }
    // SAFETY: fstat succeeded.
    let regular = unsafe { st.assume_init() }.st_mode & libc::S_IFMT == libc::S_IFREG;
    if regular && !is_shared_memory(fd) {
        return Err(format!("which is a regular file but not shared memory ({})", what_fd_is(fd)));
    }
    Ok(())
}

/// Refuses `fd` when it is not of the typed kind `kind` claims: a
/// `MEMPLUG_HANDLE_MEMFD` is shared memory (a memfd, tmpfs or hugetlbfs),
/// a `MEMPLUG_HANDLE_DMABUF_FD` is a dma-buf; an opaque descriptor only
/// passes [`memory_file_fault`].
pub(super) fn handle_kind_fault(fd: RawFd, kind: u32) -> Result<(), String> {
    use memplug_sdk::abi::{MEMPLUG_HANDLE_DMABUF_FD, MEMPLUG_HANDLE_MEMFD};
    if kind == MEMPLUG_HANDLE_MEMFD && !is_shared_memory(fd) {
        return Err(format!("which is not a memfd but {}", what_fd_is(fd)));
    }
    if kind == MEMPLUG_HANDLE_DMABUF_FD {
        let what = what_fd_is(fd);
        if !(what.starts_with("anon_inode:dmabuf") || what.starts_with("/dmabuf:")) {
            return Err(format!("which is not a dma-buf but {what}"));
        }
        return Ok(());
    }
    memory_file_fault(fd)
}

/// The open file `fd` names (device and inode), or `None` when it is not
/// open.
fn file_identity(fd: RawFd) -> Option<(u64, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: as in `exported_fd_fault`.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: fstat succeeded.
    let st = unsafe { st.assume_init() };
    Some((st.st_dev, st.st_ino))
}

#[cfg(test)]
mod tests {
    use super::exported_fd_fault;
    use std::os::fd::{AsRawFd, IntoRawFd};

    fn fault(fd: i32) -> String {
        exported_fd_fault(fd).expect_err("refused")
    }

    #[test]
    fn standard_negative_and_closed_numbers_are_refused() {
        for fd in [0, 1, 2] {
            assert!(fault(fd).contains("standard"), "{fd}");
        }
        assert!(fault(-1).contains("not a descriptor"));
        let closed = std::fs::File::open("/dev/null").unwrap().into_raw_fd();
        unsafe { libc::close(closed) };
        assert!(fault(closed).contains("not open"));
    }

    #[test]
    fn descriptors_that_cannot_carry_memory_are_refused() {
        let mut p = [0i32; 2];
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        assert!(fault(p[0]).contains("pipe"));
        assert!(fault(p[1]).contains("pipe"));
        unsafe { libc::close(p[0]) };
        unsafe { libc::close(p[1]) };
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(fault(a.as_raw_fd()).contains("socket"));
        let dir = std::fs::File::open("/").unwrap();
        assert!(fault(dir.as_raw_fd()).contains("directory"));
        let path = std::ffi::CString::new("/dev/null").unwrap();
        let opath = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        assert!(opath >= 0);
        assert!(fault(opath).contains("O_PATH"));
        unsafe { libc::close(opath) };
    }

    #[test]
    fn handles_must_be_of_the_kind_they_claim() {
        use super::{handle_kind_fault, memory_file_fault};
        use memplug_sdk::abi::{MEMPLUG_HANDLE_DMABUF_FD, MEMPLUG_HANDLE_MEMFD, MEMPLUG_HANDLE_OPAQUE_FD};
        let name = std::ffi::CString::new("memplug-kind").unwrap();
        let memfd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(memfd >= 0);
        assert_eq!(handle_kind_fault(memfd, MEMPLUG_HANDLE_MEMFD), Ok(()));
        assert_eq!(handle_kind_fault(memfd, MEMPLUG_HANDLE_OPAQUE_FD), Ok(()));
        let why = handle_kind_fault(memfd, MEMPLUG_HANDLE_DMABUF_FD).unwrap_err();
        assert!(why.contains("not a dma-buf but /memfd:memplug-kind"), "{why}");
        let status = std::fs::File::open("/proc/self/status").unwrap();
        let why = handle_kind_fault(status.as_raw_fd(), MEMPLUG_HANDLE_MEMFD).unwrap_err();
        assert!(why.contains("not a memfd but /proc/"), "{why}");
        let why = memory_file_fault(status.as_raw_fd()).unwrap_err();
        assert!(why.contains("not shared memory"), "{why}");
        assert!(handle_kind_fault(status.as_raw_fd(), MEMPLUG_HANDLE_OPAQUE_FD).is_err());
        // A character device is not a regular file: left to the plugin.
        let null = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(memory_file_fault(null.as_raw_fd()), Ok(()));
        unsafe { libc::close(memfd) };
    }

    #[test]
    fn memory_descriptors_are_accepted() {
        let name = std::ffi::CString::new("memplug-test").unwrap();
        let memfd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(memfd >= 0);
        assert_eq!(exported_fd_fault(memfd), Ok(()));
        unsafe { libc::close(memfd) };
        let file = tempfile_like();
        assert_eq!(exported_fd_fault(file.as_raw_fd()), Ok(()));
        let null = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(exported_fd_fault(null.as_raw_fd()), Ok(()), "a character device");
        let ev = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(ev >= 0);
        assert_eq!(exported_fd_fault(ev), Ok(()), "an anonymous inode");
        unsafe { libc::close(ev) };
    }

    fn tempfile_like() -> std::fs::File {
        let path = std::env::temp_dir().join(format!("memplug-export-{}", std::process::id()));
        let f = std::fs::File::create(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        f
    }
}
