//! Loading policy: what the host checks about a plugin *file* before it
//! runs any of its code, and how it makes sure the file checked is the file
//! loaded.
//!
//! * **A path, never a search.** A plugin is named by a path: absolute, or
//!   relative to the current directory with at least one `/`
//!   (`./libx.so`). A bare file name (`libx.so`) is refused with a message
//!   saying which path to give: to `dlopen` a bare name means "search
//!   `LD_LIBRARY_PATH`, the loader cache and the system directories", to
//!   everything else it means "the file in the current directory", and
//!   whichever the host picked, someone expecting the other would get a
//!   file they did not check. [`open_checked`] applies this rule for the
//!   host (`Plugin::load`), the C API, `memplug inspect` and the
//!   conformance kit alike.
//! * **One descriptor.** The file is opened once (`O_RDONLY | O_CLOEXEC`,
//!   without waiting on a FIFO); every check below runs on that
//!   descriptor, and the dynamic loader is handed the same descriptor as
//!   `/proc/self/fd/N` ([`CheckedFile::dlopen`]). Nothing is opened by name
//!   twice, so the file cannot be swapped between check and load.
//! * It must be a regular file (`fstat`).
//! * A file, or any directory on its path, that others than its owner can
//!   write is refused unless the embedder allows it
//!   (`LoadOptions::allow_writable_by_others`): whoever can replace the
//!   file can run code in the host. The file's mode comes from `fstat` of
//!   the descriptor; the directories checked are those of the path as
//!   given (a symbolic link in a directory others can write can be
//!   re-pointed) and those of the file's real path (the descriptor's
//!   `/proc/self/fd/N` link, checked to still name the opened file). A
//!   sticky directory (like `/tmp`) is acceptable: others can add files
//!   there but not replace ours.
//! * An embedder can pin a plugin to an expected SHA-256
//!   (`LoadOptions::expected_sha256`): the descriptor is hashed, so the
//!   bytes hashed are the bytes of the file loaded.
//! * Environment-variable overrides of plugin paths are ignored in setuid or
//!   setgid processes (`AT_SECURE`), where the environment belongs to a
//!   less privileged caller.

use crate::error::LoadError;
use crate::load_options::LoadOptions;
use sha2::{Digest, Sha256};
use std::ffi::{c_int, c_void, CStr};
use std::fs::{File, Metadata};
use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// True in a setuid/setgid (or otherwise "secure-execution") process.
pub fn secure_execution() -> bool {
    // SAFETY: getauxval has no preconditions.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// The value of environment variable `name`, unless this process runs with
/// elevated privileges (then `None`, whatever the environment says).
pub fn env_override(name: &str) -> Option<PathBuf> {
    env_override_when(name, secure_execution())
}

/// [`env_override`] with the privilege state given (for tests).
pub fn env_override_when(name: &str, secure: bool) -> Option<PathBuf> {
    if secure {
        return None;
    }
    std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// True when `path` is a bare file name (no `/`): what `dlopen` would
/// search for and the loading policy refuses.
pub fn is_bare_name(path: &Path) -> bool {
    let bytes = path.as_os_str().as_bytes();
    !bytes.is_empty() && !bytes.contains(&b'/')
}

/// A plugin file opened once and checked through its descriptor by
/// [`open_checked`]. Load it with [`CheckedFile::dlopen`]; read it (an ELF
/// reader, a report) through [`CheckedFile::file`] or
/// [`CheckedFile::fd_path`], never by its name again.
#[derive(Debug)]
pub struct CheckedFile {
    file: File,
    named: PathBuf,
    real: PathBuf,
    sha256: Option<String>,
}

impl CheckedFile {
    /// The open descriptor (read-only). Reads through it see the checked
    /// file whatever happens to its name.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// `/proc/self/fd/N` of the descriptor: a path for tools that want
    /// one; valid while `self` lives.
    pub fn fd_path(&self) -> PathBuf {
        fd_path(self.file.as_raw_fd())
    }

    /// The path as the caller gave it.
    pub fn named_path(&self) -> &Path {
        &self.named
    }

    /// The file's real path when it was checked (the descriptor's
    /// `/proc/self/fd/N` link: absolute, no symbolic links).
    pub fn real_path(&self) -> &Path {
        &self.real
    }

    /// The file's SHA-256 (hex), when it was pinned and matched.
    pub fn sha256(&self) -> Option<&str> {
        self.sha256.as_deref()
    }

    /// Loads the checked descriptor with `dlopen` (`RTLD_NOW`: unresolved
    /// symbols are refused here rather than crashing the host on first
    /// call; `RTLD_LOCAL`: its symbols stay out of the global namespace).
    ///
    /// The loader is handed a `/proc/self/fd/N` name of the descriptor.
    /// glibc keeps every name it was given as an alias of the object it
    /// loaded and answers a later `dlopen` of that name with that object,
    /// whatever file the name means by then; so the name used is one no
    /// loaded object is known by ([`OpenLibrary`] keeps it reserved until
    /// the library is closed). The library returned is therefore this
    /// file, newly mapped, or an object the loader already mapped from this
    /// same inode.
    ///
    /// # Safety
    /// Loading runs the library's initialisers: the caller trusts the file
    /// that far (that is what loading a plugin means).
    pub unsafe fn dlopen(&self) -> Result<OpenLibrary, LoadError> {
        let not_a_library = |reason: String| LoadError::NotALibrary { path: self.named.clone(), reason };
        let meta = self.file.metadata().map_err(|e| not_a_library(e.to_string()))?;
        let (name, path, loaded_as) = LoaderName::reserve(&self.file, (meta.dev(), meta.ino()))
            .map_err(|e| not_a_library(format!("cannot pick a name to load it through: {e}")))?;
        let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL;
        // SAFETY: the caller's; `path` names our open descriptor.
        // A second descriptor of the file, held while the library is
        // mapped: the inode cannot be freed and reused meanwhile (see
        // `OpenLibrary`).
        let pin =
            self.file.try_clone().map_err(|e| not_a_library(format!("cannot keep the file open: {e}")))?;
        match unsafe { libloading::os::unix::Library::open(Some(&path), flags) } {
            Ok(l) => Ok(OpenLibrary {
                library: Some(libloading::Library::from(l)),
                name: Some(name),
                loaded_as,
                pin: Some(pin),
            }),
            Err(e) => {
                // The loader's message names the descriptor; name the file.
                let reason = e.to_string().replace(&*path.to_string_lossy(), &self.named.to_string_lossy());
                Err(not_a_library(reason))
            }
        }
    }
}

/// A library loaded by [`CheckedFile::dlopen`], with the loader name it was
/// opened under kept reserved: dropping it closes the library, then frees
/// the name (unless the same file is still open through another
/// `OpenLibrary`, whose object keeps every alias it was given).
///
/// It also holds the file open. glibc answers a `dlopen` with an object it
/// already mapped from the same (device, inode), and a library can stay
/// mapped after its last `dlclose` (a thread-local destructor it
/// registered, a thread of its still running): if the file were then
/// deleted and its inode reused by another file, loading that other file
/// would hand back the old library. So the descriptor is closed only once
/// the library is really gone; while it stays mapped, its inode stays
/// pinned (one descriptor kept, for good).
pub struct OpenLibrary {
    // Dropped in this order (see `Drop`): the library first, then, if the
    // loader let it go, the pin; then its name.
    library: Option<libloading::Library>,
    /// Given up (kept reserved for good) when the library stays mapped.
    name: Option<LoaderName>,
    /// The name the loader was given (how it lists the object), as the
    /// numbers it is made of: no heap, since a library kept mapped for good
    /// is never dropped (and must leave nothing a leak checker would see as
    /// lost).
    loaded_as: NameParts,
    pin: Option<File>,
}

impl OpenLibrary {
    /// The library.
    pub fn library(&self) -> &libloading::Library {
        self.library.as_ref().expect("present until drop")
    }
}

impl Drop for OpenLibrary {
    fn drop(&mut self) {
        drop(self.library.take());
        let object = self.name.as_ref().map(|n| n.object);
        if loaded_object_names().contains(&self.loaded_as.name()) || object.is_some_and(still_mapped) {
            // Still mapped after the close: keep the inode pinned, and
            // every name the loader was given for it reserved, since it
            // answers each of them with this object (the name it lists,
            // the one asked for, may be an older alias).
            std::mem::forget(self.pin.take());
            std::mem::forget(self.name.take());
        }
    }
}

/// Loader names in use, by the object (device, inode) they were given for:
/// the names, and how many [`LoaderName`]s hold that object open.
type NamesInUse = std::collections::BTreeMap<(u64, u64), (Vec<Vec<u8>>, usize)>;
static NAMES_IN_USE: std::sync::Mutex<NamesInUse> = std::sync::Mutex::new(std::collections::BTreeMap::new());

fn names_in_use() -> std::sync::MutexGuard<'static, NamesInUse> {
    NAMES_IN_USE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A loader name, `/proc/self/fd/` then `steps` times `./` then `fd`.
#[derive(Clone, Copy)]
struct NameParts {
    fd: RawFd,
    steps: usize,
}

impl NameParts {
    fn name(self) -> Vec<u8> {
        format!("/proc/self/fd/{}{}", "./".repeat(self.steps), self.fd).into_bytes()
    }
}

/// One hold on the loader names of an object (see [`CheckedFile::dlopen`]).
/// The names themselves live in the process-wide table, so a hold that is
/// never dropped (a library kept mapped for good) leaks nothing unreachable.
struct LoaderName {
    object: (u64, u64),
}

impl LoaderName {
    /// A name of `file` (object `object`) that names no loaded object and
    /// no object this process loaded and has not closed:
    /// `/proc/self/fd/N`, or, when that is taken, the same path with `./`
    /// steps added (`/proc/self/fd/./N`, …), which the kernel resolves to
    /// the same descriptor.
    fn reserve(file: &File, object: (u64, u64)) -> std::io::Result<(LoaderName, PathBuf, NameParts)> {
        let loaded = loaded_object_names();
        let mut in_use = names_in_use();
        let fd = file.as_raw_fd();
        for steps in 0..1000 {
            let parts = NameParts { fd, steps };
            let name = parts.name();
            let taken = loaded.contains(&name) || in_use.values().any(|(names, _)| names.contains(&name));
            if !taken {
                let path = PathBuf::from(std::ffi::OsStr::from_bytes(&name));
                let entry = in_use.entry(object).or_default();
                entry.0.push(name);
                entry.1 += 1;
                return Ok((LoaderName { object }, path, parts));
            }
        }
        Err(std::io::Error::other(format!("every name for descriptor {fd} is in use by a loaded library")))
    }
}

impl Drop for LoaderName {
    fn drop(&mut self) {
        let mut in_use = names_in_use();
        if let Some(entry) = in_use.get_mut(&self.object) {
            entry.1 -= 1;
            // The object's last handle is closed: the loader dropped it and
            // every alias it had.
            if entry.1 == 0 {
                in_use.remove(&self.object);
            }
        }
    }
}

/// Opens `path` once and applies the loading policy to that descriptor:
/// refuses a bare file name (see the module documentation), a missing
/// file ([`LoadError::NotFound`]), anything but a regular file
/// ([`LoadError::NotALibrary`]), a file or directory writable by others
/// than its owner unless `opts.allow_writable_by_others`, and, with
/// `opts.expected_sha256`, a file with other contents
/// ([`LoadError::Policy`]). `Plugin::load_with` is this, then
/// [`CheckedFile::dlopen`], then negotiation; a tool that opens plugins
/// itself (the conformance kit) calls the same two to load exactly what the
/// host would.
pub fn open_checked(path: &Path, opts: &LoadOptions) -> Result<CheckedFile, LoadError> {
    let policy = |detail: String| LoadError::Policy { origin: path.display().to_string(), detail };
    let not_a_library = |reason: String| LoadError::NotALibrary { path: path.to_path_buf(), reason };
    if is_bare_name(path) {
        return Err(policy(format!(
            "a bare file name is not searched for (not in LD_LIBRARY_PATH, the loader cache or the \
             current directory); give the plugin's path: ./{} for the file in the current directory, \
             or an absolute path",
            path.display()
        )));
    }
    // O_NONBLOCK: a FIFO must not block the open (it is refused below as
    // not a regular file); it changes nothing for a regular file. std adds
    // O_CLOEXEC.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => LoadError::NotFound(path.to_path_buf()),
            _ => not_a_library(format!("cannot open: {e}")),
        })?;
    let md = file.metadata().map_err(|e| not_a_library(format!("cannot fstat the opened file: {e}")))?;
    if !md.file_type().is_file() {
        return Err(not_a_library(format!("not a regular file (a {})", kind_of(&md))));
    }
    let real = std::fs::read_link(fd_path(file.as_raw_fd())).map_err(|e| {
        policy(format!(
            "cannot resolve the opened file's path through /proc/self/fd (is /proc mounted?): {e}"
        ))
    })?;
    if !opts.allow_writable_by_others {
        let refuse = |p: &Path, mode: u32| {
            policy(format!(
                "{} (mode {mode:o}) is writable by others than its owner; refusing to load \
                 (LoadOptions::allow_writable_by_others overrides)",
                p.display()
            ))
        };
        if md.mode() & 0o022 != 0 {
            return Err(refuse(&real, md.mode() & 0o7777));
        }
        // The real path must still name the opened file, or the directories
        // checked below are not the ones holding it.
        match std::fs::metadata(&real) {
            Ok(now) if now.dev() == md.dev() && now.ino() == md.ino() => {}
            _ => {
                return Err(policy(format!(
                    "{} no longer names the opened file (moved or replaced while being checked); \
                     refusing to load",
                    real.display()
                )))
            }
        }
        let given = if path.is_absolute() {
            path.to_path_buf()
        } else {
            std::env::current_dir()
                .map(|cwd| cwd.join(path))
                .map_err(|e| policy(format!("cannot read the current directory: {e}")))?
        };
        let dirs = given.ancestors().skip(1).chain(real.ancestors().skip(1));
        match first_writable_dir(dirs) {
            Ok(None) => {}
            Ok(Some((p, mode))) => return Err(refuse(&p, mode)),
            Err(e) => return Err(policy(format!("cannot check permissions: {e}"))),
        }
    }
    let sha256 = match &opts.expected_sha256 {
        None => None,
        Some(want) => {
            let got = sha256_from_start(&file).map_err(|e| policy(format!("cannot hash: {e}")))?;
            if !got.eq_ignore_ascii_case(want.trim()) {
                return Err(policy(format!("SHA-256 mismatch: expected {want}, the file has {got}")));
            }
            Some(got)
        }
    };
    Ok(CheckedFile { file, named: path.to_path_buf(), real, sha256 })
}

fn fd_path(fd: RawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{fd}"))
}

fn kind_of(md: &Metadata) -> &'static str {
    let t = md.file_type();
    if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else {
        "special file"
    }
}

/// The first of `dirs` (each followed through symbolic links) that a user
/// other than its owner can write, with its mode; sticky directories are
/// acceptable.
fn first_writable_dir<'a>(dirs: impl Iterator<Item = &'a Path>) -> std::io::Result<Option<(PathBuf, u32)>> {
    let mut seen = std::collections::HashSet::new();
    for d in dirs {
        if d.as_os_str().is_empty() || !seen.insert(d) {
            continue;
        }
        let md = std::fs::metadata(d)?;
        if let Some(mode) = writable_mode(&md) {
            return Ok(Some((d.to_path_buf(), mode)));
        }
    }
    Ok(None)
}

/// The mode of a file or directory others than its owner can write
/// (`None` when they cannot, or for a sticky directory).
fn writable_mode(md: &Metadata) -> Option<u32> {
    let mode = md.mode();
    let sticky_dir = md.is_dir() && mode & 0o1000 != 0;
    (mode & 0o022 != 0 && !sticky_dir).then_some(mode & 0o7777)
}

/// The names of every object the dynamic loader has loaded.
/// Whether a file of `(device, inode)` is still mapped into this process
/// (`/proc/self/maps`; a library the loader kept after its last close).
/// Unreadable maps count as mapped: the cautious answer keeps a name.
fn still_mapped((dev, ino): (u64, u64)) -> bool {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return true;
    };
    let want = format!("{:02x}:{:02x}", libc::major(dev), libc::minor(dev));
    maps.lines().any(|l| {
        let mut f = l.split_whitespace().skip(3);
        let (d, i) = (f.next(), f.next());
        d == Some(want.as_str()) && i.and_then(|i| i.parse::<u64>().ok()) == Some(ino)
    })
}

fn loaded_object_names() -> std::collections::HashSet<Vec<u8>> {
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: `data` is the set passed below; `info` is the loader's,
        // valid during the call, its name NULL or NUL-terminated.
        unsafe {
            let names = &mut *(data as *mut std::collections::HashSet<Vec<u8>>);
            let name = (*info).dlpi_name;
            if !name.is_null() {
                names.insert(CStr::from_ptr(name).to_bytes().to_vec());
            }
        }
        0
    }
    let mut names = std::collections::HashSet::new();
    // SAFETY: the callback only reads `info` and writes the set, which
    // outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut names as *mut _ as *mut c_void) };
    names
}

/// Hex SHA-256 of `file` from its first byte, read with `pread` (the
/// descriptor's offset is neither used nor moved).
fn sha256_from_start(file: &File) -> std::io::Result<String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut at = 0u64;
    loop {
        let n = match file.read_at(&mut buf, at) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        at += n as u64;
    }
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The first path component (the file itself or a directory above it, by
/// its canonical path) that a user other than its owner can write, with its
/// mode. Sticky directories (like `/tmp`) are acceptable: others can add
/// files there but not replace ours. This looks the path up by name, for
/// diagnostics; the loader applies the policy to an open descriptor
/// ([`open_checked`]).
pub fn writable_by_others(path: &Path) -> std::io::Result<Option<(PathBuf, u32)>> {
    let path = path.canonicalize()?;
    if let Some(mode) = writable_mode(&std::fs::metadata(&path)?) {
        return Ok(Some((path, mode)));
    }
    first_writable_dir(path.ancestors().skip(1))
}

/// Hex SHA-256 of everything readable from `file`.
pub fn sha256_hex(file: &mut File) -> std::io::Result<String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn env_overrides_are_ignored_in_secure_execution() {
        std::env::set_var("MEMPLUG_POLICY_TEST_PATH", "/somewhere/libx.so");
        assert_eq!(env_override_when("MEMPLUG_POLICY_TEST_PATH", false), Some("/somewhere/libx.so".into()));
        assert_eq!(env_override_when("MEMPLUG_POLICY_TEST_PATH", true), None);
        // This test process is not setuid.
        assert!(!secure_execution());
    }

    #[test]
    fn group_or_world_writable_files_and_directories_are_found() {
        let dir = std::env::temp_dir().join(format!("memplug-policy-{}", std::process::id()));
        let sub = dir.join("sub");
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o755)).unwrap();
        let f = sub.join("libp.so");
        std::fs::write(&f, b"x").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(writable_by_others(&f).unwrap(), None);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(writable_by_others(&f).unwrap().map(|x| x.1), Some(0o666));
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o775)).unwrap();
        assert_eq!(writable_by_others(&f).unwrap().map(|x| x.0), Some(sub.canonicalize().unwrap()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_a_name_without_a_slash_is_bare() {
        for bare in ["libx.so", "lib x.so", ".so", ".", ".."] {
            assert!(is_bare_name(Path::new(bare)), "{bare}");
        }
        for path in ["./libx.so", "/usr/lib/libx.so", "sub/libx.so", "../libx.so", ""] {
            assert!(!is_bare_name(Path::new(path)), "{path}");
        }
    }

    #[test]
    fn sha256_of_known_bytes() {
        let p = std::env::temp_dir().join(format!("memplug-sha-{}", std::process::id()));
        std::fs::write(&p, b"abc").unwrap();
        let hex = sha256_hex(&mut File::open(&p).unwrap()).unwrap();
        assert_eq!(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        // From the first byte, whatever the descriptor's offset.
        let mut f = File::open(&p).unwrap();
        f.read_exact(&mut [0u8; 2]).unwrap();
        assert_eq!(sha256_from_start(&f).unwrap(), hex);
        std::fs::remove_file(&p).unwrap();
    }
}
