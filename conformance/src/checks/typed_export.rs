//! ABI 1.2 typed export (`MEMPLUG_CAP_TYPED_EXPORT`):
//! `shared_mapping.typed_export` (each kind offered exports as a handle of
//! that kind, which imports back), `shared_mapping.typed_export_refusals`
//! (kinds not offered, forged objects, unusable handles) and
//! `shared_mapping.export_kinds_requested` (a request naming a kind the
//! mechanism does not offer is refused; one it offers is served).

use super::descriptor_claims::{claimed, handle_names, needs_1_2, FD_HANDLES, KNOWN_HANDLES};
use super::{ensure, expect, expect_live, fail, skip, CheckFn, Checked, Ctx, Results, Scope, Verdict};
use crate::os::{fd_link, writable};
use crate::raw::{fd_identity, request_1_2, status_name, Guarded, Mech, OwnedFds};
use memplug_sdk::abi::*;

const RW: u32 = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;

pub(crate) fn run_all(res: &mut Results, ctx: &Ctx, m: &Mech) {
    let name = Some(m.name.as_str());
    let checks: [(&'static str, CheckFn); 4] = [
        ("shared_mapping.typed_export", round_trip),
        ("shared_mapping.typed_export_refusals", refusals),
        ("shared_mapping.export_kinds_requested", kinds_requested),
        ("shared_mapping.import_lent_fd", super::imports::import_lent_fd),
    ];
    for (check, f) in checks {
        res.run(check, name, || {
            if m.sm.is_none() {
                skip!("no shared_mapping capability (flag clear, pointer NULL)");
            }
            f(ctx, m)
        });
    }
}

/// The kinds offered, or a skip without typed export.
fn offered(m: &Mech) -> Result<u32, Verdict> {
    needs_1_2(m, "typed export")?;
    if m.caps & MEMPLUG_CAP_TYPED_EXPORT == 0 {
        skip!(
            "no MEMPLUG_CAP_TYPED_EXPORT: the mechanism exports no typed handles (flag clear, export_handle and \
             import_handle NULL)"
        );
    }
    let kinds = claimed(m)?.export_types & KNOWN_HANDLES;
    ensure!(kinds != 0, "MEMPLUG_CAP_TYPED_EXPORT is set but export_types offers no kind this kit knows");
    Ok(kinds)
}

/// The single bits of `kinds`.
fn each(kinds: u32) -> impl Iterator<Item = u32> {
    (0..32).map(|k| 1u32 << k).filter(move |b| kinds & b != 0)
}

/// What a handle of `kind` exported from a `len`-byte object must look
/// like; for descriptors, the descriptor (owned by the kit from now on).
fn judge_handle(
    out: &Guarded,
    kind: u32,
    owned: &mut OwnedFds,
    what: &str,
) -> Result<(MemplugHandle, String), Verdict> {
    ensure!(
        out.tail_intact(),
        "export_handle ({what}) wrote past the struct_size {MEMPLUG_HANDLE_SIZE_1_2} it was given"
    );
    let h: MemplugHandle = out.read();
    ensure!(
        h.handle_type == kind,
        "export_handle ({what}) returned a handle of kind {:#x} ({}) where {kind:#x} ({}) was asked",
        h.handle_type,
        handle_names(h.handle_type),
        handle_names(kind)
    );
    if kind & FD_HANDLES != 0 {
        ensure!(
            h.fd > 2,
            "export_handle ({what}) returned the descriptor {}: 0, 1 and 2 are the process's standard streams (and a \
             negative number is no descriptor)",
            h.fd
        );
        let Some(id) = fd_identity(h.fd) else {
            fail!("export_handle ({what}) returned the descriptor {}, which is not open", h.fd);
        };
        owned.adopt(h.fd, id);
        let link = fd_link(h.fd).unwrap_or_default();
        match kind {
            MEMPLUG_HANDLE_MEMFD => ensure!(
                link.starts_with("/memfd:"),
                "export_handle ({what}) returned a MEMFD handle whose descriptor {} is not a memfd ({link})",
                h.fd
            ),
            MEMPLUG_HANDLE_DMABUF_FD => ensure!(
                link.starts_with("/dmabuf:") || link.contains("dmabuf"),
                "export_handle ({what}) returned a DMABUF_FD handle whose descriptor {} is not a dma-buf ({link})",
                h.fd
            ),
            _ => {}
        }
        return Ok((h, format!("descriptor {} ({link})", h.fd)));
    }
    if kind == MEMPLUG_HANDLE_VENDOR_BLOB {
        ensure!(
            (1..=MEMPLUG_HANDLE_BLOB_MAX).contains(&h.blob_len),
            "export_handle ({what}) returned a VENDOR_BLOB of {} bytes (1 to {MEMPLUG_HANDLE_BLOB_MAX})",
            h.blob_len
        );
        return Ok((h, format!("{} bytes", h.blob_len)));
    }
    if kind == MEMPLUG_HANDLE_WIN32 {
        ensure!(h.win32 != 0, "export_handle ({what}) returned the WIN32 handle 0");
        return Ok((h, format!("handle {:#x}", h.win32)));
    }
    Ok((h, String::new()))
}

/// A request for a `size`-byte physical object exportable as `kinds`.
fn exportable(m: &Mech, size: u64, kinds: u32) -> MemplugRequest {
    MemplugRequest { export_types: kinds, ..request_1_2(m, size, m.props.granularity.max(1)) }
}

/// `shared_mapping.typed_export`.
fn round_trip(ctx: &Ctx, m: &Mech) -> Checked {
    let kinds = offered(m)?;
    let g = m.props.granularity;
    let len = 2 * g;
    let mut s = Scope::new(ctx, m);
    let mut owned = OwnedFds::default();
    let mut shown = Vec::new();
    for kind in each(kinds) {
        let name = handle_names(kind);
        let made = s.create_req(&exportable(m, len, kind));
        expect(made.status, &[MEMPLUG_STATUS_OK], &format!("create of an object exportable as {name}"))?;
        let o = made.obj;
        let (st, out) = m.export_handle(&ctx.log, &o, kind, MEMPLUG_HANDLE_SIZE_1_2);
        expect(st, &[MEMPLUG_STATUS_OK], &format!("export_handle as {name}"))?;
        let (h, said) = judge_handle(&out, kind, &mut owned, &name)?;
        if kind & FD_HANDLES != 0 {
            let (st, out2) = m.export_handle(&ctx.log, &o, kind, MEMPLUG_HANDLE_SIZE_1_2);
            expect(st, &[MEMPLUG_STATUS_OK], &format!("a second export_handle as {name}"))?;
            let (h2, _) = judge_handle(&out2, kind, &mut owned, &format!("{name}, again"))?;
            ensure!(
                h2.fd != h.fd,
                "two export_handle calls as {name} returned the same descriptor {}: each is a new one the caller owns",
                h.fd
            );
            owned.close(h2.fd);
        }
        let live = m.live();
        let imported = s.import_handle(&h, &exportable(m, len, kind));
        expect(imported.status, &[MEMPLUG_STATUS_OK], &format!("import_handle of the {name} handle"))?;
        ensure!(
            imported.block.addr == 0 && imported.block.size >= len,
            "import_handle returned address {:#x}, size {} for {len} bytes",
            imported.block.addr,
            imported.block.size
        );
        expect_live(m, live + 1, "with the import")?;
        let mut same = "";
        if m.is_cpu() && m.vb.is_some() {
            let r1 = s.reserve_ok(len)?;
            let r2 = s.reserve_ok(len)?;
            expect(s.map(&o, 0, &r1, 0, len, RW), &[MEMPLUG_STATUS_OK], "map the object")?;
            expect(s.map(&imported.obj, 0, &r2, 0, len, RW), &[MEMPLUG_STATUS_OK], "map the import")?;
            ensure!(writable(r1.addr, len) && writable(r2.addr, len), "the views are not mapped read-write");
            // SAFETY: both views mapped read-write (checked above).
            let got = unsafe {
                ((r1.addr + g) as *mut u8).write_volatile(0x5a);
                ((r2.addr + g) as *const u8).read_volatile()
            };
            ensure!(
                got == 0x5a,
                "a write through the object is not read through the import of its {name} handle"
            );
            same = ", the same memory through both";
        }
        shown.push(format!("{name}: {said}, imported{same}"));
        if kind & FD_HANDLES != 0 {
            // The import keeps its own: the kit's descriptor goes.
            owned.close(h.fd);
        }
    }
    Ok(format!("each kind offered exported as itself: {}", shown.join("; ")))
}

/// `shared_mapping.typed_export_refusals`.
fn refusals(ctx: &Ctx, m: &Mech) -> Checked {
    let kinds = offered(m)?;
    let g = m.props.granularity;
    let mut s = Scope::new(ctx, m);
    let mut owned = OwnedFds::default();
    let first = each(kinds).next().expect("offered is non-zero");
    let o = s.create_req(&exportable(m, g, kinds));
    expect(
        o.status,
        &[MEMPLUG_STATUS_OK],
        &format!("create of an object exportable as {}", handle_names(kinds)),
    )?;
    let o = o.obj;
    let live = m.live();
    // Unknown bits too (unless the plugin publishes them: a later minor's
    // kinds, which the kit cannot judge).
    let unoffered: Vec<u32> = each(KNOWN_HANDLES & !kinds)
        .chain([1 << 7, 1 << 31].into_iter().filter(|b| m.props.export_types & b == 0))
        .collect();
    for &kind in &unoffered {
        let (st, out) = m.export_handle(&ctx.log, &o, kind, MEMPLUG_HANDLE_SIZE_1_2);
        if st == MEMPLUG_STATUS_OK {
            let h: MemplugHandle = out.read();
            if let Some(id) = fd_identity(h.fd).filter(|_| h.fd > 2) {
                owned.adopt(h.fd, id);
            }
        }
        expect(
            st,
            &[MEMPLUG_STATUS_UNSUPPORTED],
            &format!("export_handle as {kind:#x} ({}), not offered", handle_names(kind)),
        )?;
    }
    for (what, kind) in [("no kind (0)", 0), ("two kinds at once", first | (first << 1).max(2))] {
        let (st, _) = m.export_handle(&ctx.log, &o, kind, MEMPLUG_HANDLE_SIZE_1_2);
        expect(
            st,
            &[MEMPLUG_STATUS_UNSUPPORTED, MEMPLUG_STATUS_INVALID_ARGUMENT],
            &format!("export_handle as {what} ({kind:#x})"),
        )?;
    }
    let mut forged = o;
    forged.handle ^= 0xffff_0000_0000_0000;
    let (st, _) = m.export_handle(&ctx.log, &forged, first, MEMPLUG_HANDLE_SIZE_1_2);
    expect(st, &[MEMPLUG_STATUS_UNKNOWN_ALLOCATION], "export_handle of a forged object")?;
    expect_live(m, live, "after the refused exports")?;
    // Imports: a kind not offered, and a descriptor kind without a
    // descriptor.
    let (st, out) = m.export_handle(&ctx.log, &o, first, MEMPLUG_HANDLE_SIZE_1_2);
    expect(st, &[MEMPLUG_STATUS_OK], &format!("export_handle as {}", handle_names(first)))?;
    let h: MemplugHandle = out.read();
    if first & FD_HANDLES != 0 {
        if let Some(id) = fd_identity(h.fd).filter(|_| h.fd > 2) {
            owned.adopt(h.fd, id);
        }
    }
    let req = exportable(m, g, 0);
    let mut tried = vec![];
    if let Some(other) = each(KNOWN_HANDLES & !kinds).next() {
        let bad = MemplugHandle { handle_type: other, ..h };
        let made = s.import_handle(&bad, &req);
        expect(
            made.status,
            &[MEMPLUG_STATUS_UNSUPPORTED],
            &format!("import_handle of kind {} (not offered)", handle_names(other)),
        )?;
        tried.push(format!("an import of kind {}", handle_names(other)));
    }
    if let Some(fd_kind) = each(kinds & FD_HANDLES).next() {
        let bad = MemplugHandle {
            struct_size: MEMPLUG_HANDLE_SIZE_1_2,
            handle_type: fd_kind,
            fd: -1,
            ..Default::default()
        };
        let made = s.import_handle(&bad, &req);
        expect(
            made.status,
            &[MEMPLUG_STATUS_INVALID_ARGUMENT],
            &format!("import_handle of a {} handle with fd -1", handle_names(fd_kind)),
        )?;
        tried.push(format!("an import of a {} handle with fd -1", handle_names(fd_kind)));
    }
    expect_live(m, live, "after the refused imports")?;
    Ok(format!(
        "export_handle refused kinds not offered ({}) with UNSUPPORTED, no kind and two kinds, and a forged object \
         with UNKNOWN_ALLOCATION{}",
        unoffered.iter().map(|k| format!("{k:#x}")).collect::<Vec<_>>().join(", "),
        if tried.is_empty() { String::new() } else { format!("; refused {}", tried.join(" and ")) }
    ))
}

/// `shared_mapping.export_kinds_requested`.
fn kinds_requested(ctx: &Ctx, m: &Mech) -> Checked {
    needs_1_2(m, "a request's export kinds")?;
    let kinds = m.props.export_types & KNOWN_HANDLES;
    let g = m.props.granularity;
    let mut s = Scope::new(ctx, m);
    let live = m.live();
    for kind in each(KNOWN_HANDLES & !kinds) {
        let made = s.create_req(&exportable(m, g, kind));
        expect(
            made.status,
            &[MEMPLUG_STATUS_UNSUPPORTED],
            &format!(
                "create of an object exportable as {} (export_types offers {})",
                handle_names(kind),
                handle_names(kinds)
            ),
        )?;
        expect_live(m, live, "after the refused create")?;
    }
    for kind in each(kinds) {
        let made = s.create_req(&exportable(m, g, kind));
        if made.status != MEMPLUG_STATUS_OK {
            fail!(
                "create of an object exportable as {} (which export_types offers) got {}",
                handle_names(kind),
                status_name(made.status)
            );
        }
        expect(s.release_object(&made.obj), &[MEMPLUG_STATUS_OK], "release")?;
    }
    Ok(format!(
        "create naming a kind not offered ({}) refused with UNSUPPORTED; naming one offered ({}) served",
        handle_names(KNOWN_HANDLES & !kinds),
        handle_names(kinds)
    ))
}
