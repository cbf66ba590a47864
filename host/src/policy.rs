//! Loading policy: what the host checks about a plugin *file* before it
//! runs any of its code.
//!
//! * A file, or any directory on its path, that others than its owner can
//!   write is refused unless the embedder allows it: whoever can replace
//!   the file can run code in the host.
//! * An embedder can pin a plugin to an expected SHA-256. The file is opened
//!   once, hashed from that descriptor, and loaded through
//!   `/proc/self/fd/N`, so the bytes hashed are the bytes loaded (no window
//!   to swap the file between check and load).
//! * Environment-variable overrides of plugin paths are ignored in setuid or
//!   setgid processes (`AT_SECURE`), where the environment belongs to a
//!   less privileged caller.

use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
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

/// The first path component (the file itself or a directory above it)
/// that a user other than its owner can write, with its mode. Sticky
/// directories (like `/tmp`) are acceptable: others can add files there but
/// not replace ours.
pub fn writable_by_others(path: &Path) -> std::io::Result<Option<(PathBuf, u32)>> {
    let path = path.canonicalize()?;
    let mut cur = Some(path.as_path());
    while let Some(p) = cur {
        let md = std::fs::metadata(p)?;
        let mode = md.mode();
        let sticky_dir = md.is_dir() && mode & 0o1000 != 0;
        if mode & 0o022 != 0 && !sticky_dir {
            return Ok(Some((p.to_path_buf(), mode & 0o7777)));
        }
        cur = p.parent();
    }
    Ok(None)
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
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
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
    fn sha256_of_known_bytes() {
        let p = std::env::temp_dir().join(format!("memplug-sha-{}", std::process::id()));
        std::fs::write(&p, b"abc").unwrap();
        let hex = sha256_hex(&mut File::open(&p).unwrap()).unwrap();
        assert_eq!(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        std::fs::remove_file(&p).unwrap();
    }
}
