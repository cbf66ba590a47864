//! `negotiation.*`: the entry symbol, both ways.

use super::{ensure, expect, fail, Checked, Ctx, Results};
use crate::os::{in_child, ChildEnd};
use crate::raw::{status_name, Guarded};
use crate::sink::{call, Recorder};
use memplug_sdk::abi::*;
use std::time::Duration;

/// Filler of the bytes of a host info past its declared size.
const GARBAGE: u8 = 0x5a;

/// A host info inside a 64-byte buffer.
#[repr(C, align(8))]
struct HostBuf([u8; 64]);

/// Host info declaring `struct_size`: the 1.0 fields are always valid
/// values (so a plugin that reads past a short struct_size finds nothing
/// alarming, only wrong), and bytes past 24 are garbage.
fn host(struct_size: u32, major: u32, min_minor: u32, max_minor: u32) -> HostBuf {
    let info = MemplugHostInfo {
        struct_size,
        abi_major: major,
        min_minor,
        max_minor,
        host_name: c"memplug-conformance".as_ptr(),
    };
    let mut b = HostBuf([GARBAGE; 64]);
    // SAFETY: 24 bytes of plain data into a 64-byte buffer.
    unsafe {
        core::ptr::copy_nonoverlapping(
            (&info as *const MemplugHostInfo).cast::<u8>(),
            b.0.as_mut_ptr(),
            core::mem::size_of::<MemplugHostInfo>(),
        )
    };
    b
}

struct Answer {
    status: MemplugStatus,
    out: Guarded,
}

impl Answer {
    fn negotiation(&self) -> MemplugNegotiation {
        self.out.read()
    }
}

fn negotiate(ctx: &Ctx, h: &HostBuf, out_size: u32) -> Answer {
    let mut out = Guarded::new(out_size);
    let entry = ctx.entry;
    let (status, _) = call(&ctx.log, "memplug_plugin_v1", |sink| {
        // SAFETY: the entry contract: pointers valid for the call.
        unsafe { entry(h.0.as_ptr().cast(), out.ptr(), sink) }
    });
    if !out.tail_intact() {
        ctx.log.overrun("memplug_plugin_v1", format!("wrote past struct_size {out_size} of its answer"));
    }
    Answer { status, out }
}

/// Negotiates as a host speaking `1.min_minor..=1.max_minor` (1.0-sized
/// host info and answer): the status and the answer as written.
pub(crate) fn negotiate_range(
    ctx: &Ctx,
    min_minor: u32,
    max_minor: u32,
) -> (MemplugStatus, MemplugNegotiation) {
    let a = negotiate(
        ctx,
        &host(MEMPLUG_HOST_INFO_SIZE_1_0, MEMPLUG_ABI_MAJOR, min_minor, max_minor),
        MEMPLUG_NEGOTIATION_SIZE_1_0,
    );
    (a.status, a.negotiation())
}

/// The plugin's declared minor range, when its descriptor is long enough
/// to hold it.
fn declared_range(p: *const MemplugPlugin) -> Option<(u32, u32)> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the descriptor is plugin-owned and at least its struct_size
    // long; only fields within it are read.
    unsafe {
        let size = p.cast::<u32>().read_unaligned();
        if size < 16 {
            return None;
        }
        let min = p.cast::<u32>().add(2).read_unaligned();
        let max = p.cast::<u32>().add(3).read_unaligned();
        Some((min, max))
    }
}

/// Runs every `negotiation.*` check; returns the descriptor and agreed
/// minor of the first, ordinary negotiation when it succeeded.
pub(crate) fn run_all(res: &mut Results, ctx: &Ctx) -> Option<(*const MemplugPlugin, u32)> {
    let mut found: Option<(*const MemplugPlugin, u32)> = None;
    res.run("negotiation.accepts_host", None, || {
        let a = negotiate(
            ctx,
            &host(MEMPLUG_HOST_INFO_SIZE_1_0, 1, 0, MEMPLUG_ABI_MINOR),
            MEMPLUG_NEGOTIATION_SIZE_1_0,
        );
        if a.status == MEMPLUG_STATUS_DEVICE_UNAVAILABLE {
            fail!(
                "the plugin refuses to negotiate: its device is unavailable here (DEVICE_UNAVAILABLE); run \
                 the kit on a machine with the device"
            );
        }
        expect(a.status, &[MEMPLUG_STATUS_OK], &format!("host 1.0..=1.{MEMPLUG_ABI_MINOR}"))?;
        ensure!(
            a.out.tail_intact(),
            "the plugin wrote past the answer's struct_size ({MEMPLUG_NEGOTIATION_SIZE_1_0})"
        );
        let n = a.negotiation();
        ensure!(!n.plugin.is_null(), "OK without a plugin descriptor");
        found = Some((n.plugin, n.agreed_minor));
        if let Some((pmin, pmax)) = declared_range(n.plugin) {
            let (lo, hi) = (pmin, pmax.min(MEMPLUG_ABI_MINOR));
            ensure!(
                n.agreed_minor >= lo && n.agreed_minor <= hi,
                "agreed minor {} lies outside the common range 1.{lo}..=1.{hi}",
                n.agreed_minor
            );
        }
        Ok(format!("agreed on 1.{}", n.agreed_minor))
    });
    let range = found.and_then(|(p, _)| declared_range(p));
    let (pmin, pmax) = range.unwrap_or((0, 0));

    res.run("negotiation.host_range_above", None, || {
        let lo = pmax.saturating_add(1);
        let hi = pmax.saturating_add(3);
        let a = negotiate(ctx, &host(MEMPLUG_HOST_INFO_SIZE_1_0, 1, lo, hi), MEMPLUG_NEGOTIATION_SIZE_1_0);
        expect(a.status, &[MEMPLUG_STATUS_VERSION_MISMATCH], &format!("host 1.{lo}..=1.{hi}"))?;
        Ok(format!("host 1.{lo}..=1.{hi} refused"))
    });
    res.run("negotiation.host_range_below", None, || {
        let a = negotiate(ctx, &host(MEMPLUG_HOST_INFO_SIZE_1_0, 1, 0, pmin), MEMPLUG_NEGOTIATION_SIZE_1_0);
        expect(a.status, &[MEMPLUG_STATUS_OK], &format!("host 1.0..=1.{pmin}"))?;
        let agreed = a.negotiation().agreed_minor;
        ensure!(
            agreed == pmin,
            "host 1.0..=1.{pmin}: agreed on 1.{agreed}, but the only common minor is 1.{pmin}"
        );
        if pmin > 0 {
            let a = negotiate(
                ctx,
                &host(MEMPLUG_HOST_INFO_SIZE_1_0, 1, 0, pmin - 1),
                MEMPLUG_NEGOTIATION_SIZE_1_0,
            );
            expect(a.status, &[MEMPLUG_STATUS_VERSION_MISMATCH], &format!("host 1.0..=1.{}", pmin - 1))?;
            return Ok(format!("agreed on 1.{pmin}; a host ending below it refused"));
        }
        Ok(format!("host 1.0..=1.{pmin}: agreed on 1.{pmin}"))
    });
    res.run("negotiation.host_range_wider", None, || {
        let hi = pmax.saturating_add(5);
        let a = negotiate(ctx, &host(MEMPLUG_HOST_INFO_SIZE_1_0, 1, 0, hi), MEMPLUG_NEGOTIATION_SIZE_1_0);
        expect(a.status, &[MEMPLUG_STATUS_OK], &format!("host 1.0..=1.{hi}"))?;
        let agreed = a.negotiation().agreed_minor;
        ensure!(
            agreed >= pmin && agreed <= pmax,
            "host 1.0..=1.{hi}: agreed on 1.{agreed}, outside the plugin's own 1.{pmin}..=1.{pmax}"
        );
        Ok(format!("host 1.0..=1.{hi}: agreed on 1.{agreed}"))
    });
    res.run("negotiation.refuses_wrong_major", None, || {
        for major in [0, 2] {
            let a = negotiate(
                ctx,
                &host(MEMPLUG_HOST_INFO_SIZE_1_0, major, 0, MEMPLUG_ABI_MINOR),
                MEMPLUG_NEGOTIATION_SIZE_1_0,
            );
            expect(a.status, &[MEMPLUG_STATUS_VERSION_MISMATCH], &format!("host saying major {major}"))?;
        }
        Ok("majors 0 and 2 refused".into())
    });
    res.run("negotiation.short_host_struct", None, || {
        for size in [0, 12] {
            let a = negotiate(ctx, &host(size, 1, 0, MEMPLUG_ABI_MINOR), MEMPLUG_NEGOTIATION_SIZE_1_0);
            expect(
                a.status,
                &[MEMPLUG_STATUS_INVALID_ARGUMENT],
                &format!("host info with struct_size {size}"),
            )?;
        }
        Ok("struct_size 0 and 12 refused".into())
    });
    res.run("negotiation.long_host_struct", None, || {
        let a = negotiate(ctx, &host(64, 1, 0, MEMPLUG_ABI_MINOR), MEMPLUG_NEGOTIATION_SIZE_1_0);
        expect(
            a.status,
            &[MEMPLUG_STATUS_OK],
            "host info with struct_size 64, garbage after the 1.0 prefix",
        )?;
        ensure!(!a.negotiation().plugin.is_null(), "OK without a plugin descriptor");
        Ok("struct_size 64 accepted".into())
    });
    res.run("negotiation.short_out", None, || {
        let a = negotiate(ctx, &host(MEMPLUG_HOST_INFO_SIZE_1_0, 1, 0, MEMPLUG_ABI_MINOR), 8);
        ensure!(a.out.tail_intact(), "wrote past the answer's struct_size 8");
        expect(a.status, &[MEMPLUG_STATUS_INVALID_ARGUMENT], "answer with struct_size 8")?;
        Ok("refused, nothing written past it".into())
    });
    res.run("negotiation.null_arguments", None, || null_arguments(ctx));
    found
}

fn null_arguments(ctx: &Ctx) -> Checked {
    let entry = ctx.entry;
    let end = in_child(Duration::from_secs(5), move || {
        let h = host(MEMPLUG_HOST_INFO_SIZE_1_0, 1, 0, MEMPLUG_ABI_MINOR);
        let mut out = Guarded::new(MEMPLUG_NEGOTIATION_SIZE_1_0);
        let rec = Recorder::new();
        let sink = rec.sink();
        // SAFETY: deliberately NULL arguments; the ABI says they are refused.
        let a = unsafe { entry(core::ptr::null(), out.ptr(), &sink) };
        let b = unsafe { entry(h.0.as_ptr().cast(), core::ptr::null_mut(), &sink) };
        (a.min(15) * 16 + b.min(15)) as i32
    });
    let (a, b) = match end {
        ChildEnd::Exited(code) => ((code / 16) as u32, (code % 16) as u32),
        other => fail!("the child calling the entry with NULL arguments {}", other.describe()),
    };
    let want = MEMPLUG_STATUS_INVALID_ARGUMENT;
    ensure!(
        a == want && b == want,
        "NULL host info gave {}, NULL answer gave {} (expected INVALID_ARGUMENT for both)",
        status_name(a),
        status_name(b)
    );
    Ok("NULL host info and NULL answer refused".into())
}
