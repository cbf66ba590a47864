//! `shared_mapping.import_lent_fd`: what `import_fd` (ABI 1.1) and
//! `import_handle` (ABI 1.2) take as memory, and what they leave the caller.
//!
//! The header: the memory an import names is what `export_fd` or
//! `export_handle` made ("here or in another process"); "a descriptor the
//! mechanism cannot use is refused with `MEMPLUG_STATUS_INVALID_ARGUMENT`";
//! and the descriptor stays the caller's ("the plugin duplicates what it
//! keeps"). A plugin that `mmap`s whatever it is given turns an ordinary
//! file into device memory (its pages vanish when the file shrinks, and
//! another process reading "shared" memory reads a file instead); one that
//! closes the descriptor it was lent closes a number the caller may already
//! have reused. So the kit offers an ordinary file (on disk, not a memfd,
//! large enough) and a pipe (no memory at all) under every descriptor kind
//! the mechanism imports, and checks after every import, refused or not,
//! that its descriptor is still open on the same file.

use super::descriptor_claims::{handle_names, FD_HANDLES, KNOWN_HANDLES};
use super::{ensure, expect, fail, skip, Checked, Ctx, Scope, Verdict};
use crate::raw::{fd_identity, request_1_2, status_name, Made, Mech};
use memplug_sdk::abi::*;
use std::io::Write;
use std::os::fd::IntoRawFd;

/// Descriptors the kit lends: each with what it is.
struct Lent {
    what: &'static str,
    fd: i32,
    id: (u64, u64),
}

/// Fails unless `l.fd` is still open on the file it was.
fn still_lent(l: &Lent, call: &str) -> Result<(), Verdict> {
    match fd_identity(l.fd) {
        Some(id) if id == l.id => Ok(()),
        Some(_) => fail!(
            "{call} closed the descriptor {} it was lent ({}): the number now names another file. The descriptor \
             stays the caller's; keep a dup of it",
            l.fd,
            l.what
        ),
        None => fail!(
            "{call} closed the descriptor {} it was lent ({}): it is no longer open. The descriptor stays the \
             caller's; keep a dup of it",
            l.fd,
            l.what
        ),
    }
}

/// A refused import made nothing; an accepted one is released and fails.
fn refused(s: &mut Scope, made: &Made, call: &str, what: &str) -> Result<(), Verdict> {
    if made.status == MEMPLUG_STATUS_OK {
        let _ = s.release_object(&made.obj);
        fail!(
            "{call} accepted {what} as memory (OK, an object of {} bytes): only memory an export made can be \
             imported; refuse anything else with INVALID_ARGUMENT (check the descriptor: fstat, F_GET_SEALS, \
             the kind's own test)",
            made.block.size
        );
    }
    Ok(())
}

pub(super) fn import_lent_fd(ctx: &Ctx, m: &Mech) -> Checked {
    let sm = m.sm.expect("run only with shared mapping");
    let untyped = m.caps & MEMPLUG_CAP_SHARED_EXPORT != 0 && sm.import_fd.is_some();
    let typed = m.caps & MEMPLUG_CAP_TYPED_EXPORT != 0 && sm.import_handle.is_some();
    let kinds = if typed { m.props.export_types & KNOWN_HANDLES & FD_HANDLES } else { 0 };
    if !untyped && kinds == 0 {
        skip!(
            "the mechanism imports no descriptor: no import_fd (MEMPLUG_CAP_SHARED_EXPORT) and no import_handle of a \
             descriptor kind (MEMPLUG_CAP_TYPED_EXPORT)"
        );
    }
    let g = m.props.granularity.max(crate::os::page_size());
    // An ordinary file, on disk where the temporary directory is, larger
    // than asked: nothing about its size gives the plugin a reason to
    // refuse it.
    let path = std::env::temp_dir().join(format!("memplug-conformance-import-{}", std::process::id()));
    let mut file =
        std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).map_err(
            |e| Verdict::Skip(format!("the kit could not make an ordinary file {}: {e}", path.display())),
        )?;
    let _ = std::fs::remove_file(&path);
    file.write_all(&vec![0x5a; (2 * g) as usize]).map_err(|e| Verdict::Skip(format!("writing it: {e}")))?;
    let mut pipe = [0i32; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    ensure!(unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } == 0, "the kit could not make a pipe");
    let lend = |what, fd| fd_identity(fd).map(|id| Lent { what, fd, id });
    // Held as a bare number from here on: a plugin may close it, and
    // dropping a `File` whose descriptor was closed aborts the process.
    let file = file.into_raw_fd();
    let lent: Vec<Lent> =
        [lend("an ordinary file", file), lend("a pipe", pipe[0])].into_iter().flatten().collect();
    let mut s = Scope::new(ctx, m);
    let r = check_all(ctx, m, &mut s, &lent, untyped, kinds, g);
    // SAFETY: the kit's own descriptors (the plugin was checked not to
    // close them, or the check failed saying so: then close answers EBADF
    // or closes what the plugin's number now names in this dying process).
    unsafe {
        libc::close(file);
        libc::close(pipe[0]);
        libc::close(pipe[1]);
    }
    r
}

fn check_all(
    ctx: &Ctx,
    m: &Mech,
    s: &mut Scope,
    lent: &[Lent],
    untyped: bool,
    kinds: u32,
    g: u64,
) -> Checked {
    let mut tried = Vec::new();
    for l in lent {
        if untyped {
            let made = s.import(l.fd, g);
            still_lent(l, "import_fd")?;
            refused(s, &made, "import_fd", l.what)?;
            tried.push(format!("import_fd of {} ({})", l.what, status_name(made.status)));
        }
        for kind in (0..32).map(|k| 1u32 << k).filter(|b| kinds & b != 0) {
            let h = MemplugHandle {
                struct_size: MEMPLUG_HANDLE_SIZE_1_2,
                handle_type: kind,
                fd: l.fd,
                ..Default::default()
            };
            let call = format!("import_handle as {}", handle_names(kind));
            let made = s.import_handle(&h, &request_1_2(m, g, g));
            still_lent(l, &call)?;
            refused(s, &made, &call, l.what)?;
            tried.push(format!("{call} of {} ({})", l.what, status_name(made.status)));
        }
    }
    // A good import leaves the caller's descriptor open too, by each path.
    let first = (kinds != 0).then(|| 1u32 << kinds.trailing_zeros());
    let mut kept = Vec::new();
    if untyped {
        kept.push(good_import(ctx, m, s, None, g)?);
    }
    if let Some(kind) = first {
        kept.push(good_import(ctx, m, s, Some(kind), g)?);
    }
    Ok(format!("refused {}; {}", tried.join(", "), kept.join("; ")))
}

/// Exports an object (as `kind` with `export_handle`, or with
/// `export_fd`) and imports it back the same way, checking the descriptor
/// the import was lent is still the caller's afterwards.
fn good_import(ctx: &Ctx, m: &Mech, s: &mut Scope, kind: Option<u32>, g: u64) -> Result<String, Verdict> {
    let req = MemplugRequest { export_types: kind.unwrap_or(0), ..request_1_2(m, g, g) };
    let o = s.create_req(&req);
    expect(o.status, &[MEMPLUG_STATUS_OK], "create of an exportable object")?;
    let (fd, call) = match kind {
        Some(kind) => {
            let (st, out) = m.export_handle(&ctx.log, &o.obj, kind, MEMPLUG_HANDLE_SIZE_1_2);
            expect(st, &[MEMPLUG_STATUS_OK], &format!("export_handle as {}", handle_names(kind)))?;
            (out.read::<MemplugHandle>().fd, format!("import_handle as {}", handle_names(kind)))
        }
        None => {
            let (st, fd) = m.export_fd(&ctx.log, &o.obj);
            expect(st, &[MEMPLUG_STATUS_OK], "export_fd")?;
            (fd, "import_fd".to_string())
        }
    };
    let Some(l) =
        fd_identity(fd).filter(|_| fd > 2).map(|id| Lent { what: "an exported descriptor", fd, id })
    else {
        fail!("the export returned the descriptor {fd}, which is not one the caller can own");
    };
    let made = match kind {
        Some(kind) => {
            let h = MemplugHandle {
                struct_size: MEMPLUG_HANDLE_SIZE_1_2,
                handle_type: kind,
                fd,
                ..Default::default()
            };
            s.import_handle(&h, &request_1_2(m, g, g))
        }
        None => s.import(fd, g),
    };
    let r = still_lent(&l, &call);
    if r.is_ok() {
        // SAFETY: the kit's descriptor, still its own (checked above).
        unsafe { libc::close(fd) };
    }
    r?;
    expect(made.status, &[MEMPLUG_STATUS_OK], &format!("{call} of what the export made"))?;
    Ok(format!("{call} of an exported descriptor imported it and left the descriptor open"))
}
