//! `negotiation.*`: the entry symbol, both ways.

use super::{ensure, expect, fail, Checked, Ctx, Results};
use crate::os::{in_child, ChildEnd};
use crate::raw::{status_name, Guarded, FILL};
use crate::services::KitServices;
use crate::sink::{call, Recorder};
use memplug_sdk::abi::*;
use std::time::Duration;

/// Filler of the bytes of a host info past its declared size.
const GARBAGE: u8 = 0x5a;

/// A host info inside a 64-byte buffer.
#[repr(C, align(8))]
pub(crate) struct HostBuf([u8; 64]);

impl HostBuf {
    pub(crate) fn as_ptr(&self) -> *const MemplugHostInfo {
        self.0.as_ptr().cast()
    }
}

/// Host info declaring `struct_size`: the 1.0 fields are always valid
/// values (so a plugin that reads past a short struct_size finds nothing
/// alarming, only wrong), and bytes past the fields it declares (past 24
/// at least) are garbage.
fn host(struct_size: u32, major: u32, min_minor: u32, max_minor: u32) -> HostBuf {
    host_info(struct_size, major, min_minor, max_minor, core::ptr::null())
}

/// [`host`] with a services table (written only when `struct_size`
/// reaches the 1.2 field).
pub(crate) fn host_info(
    struct_size: u32,
    major: u32,
    min_minor: u32,
    max_minor: u32,
    services: *const MemplugHostServices,
) -> HostBuf {
    let info = MemplugHostInfo {
        struct_size,
        abi_major: major,
        min_minor,
        max_minor,
        host_name: c"memplug-conformance".as_ptr(),
        services,
    };
    let mut b = HostBuf([GARBAGE; 64]);
    // The 1.0 fields always (a struct_size shorter than 1.0 is refused by
    // what it says, not by garbage in its fields); the 1.2 `services` only
    // when the declared size reaches it: a plugin that reads that field of
    // a 1.0/1.1 host reads garbage.
    let n = (struct_size as usize)
        .clamp(MEMPLUG_HOST_INFO_SIZE_1_0 as usize, core::mem::size_of::<MemplugHostInfo>());
    // SAFETY: at most 32 bytes of plain data into a 64-byte buffer.
    unsafe {
        core::ptr::copy_nonoverlapping((&info as *const MemplugHostInfo).cast::<u8>(), b.0.as_mut_ptr(), n)
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
    negotiate_with(ctx, h, out_size, None)
}

/// [`negotiate`], telling `services` (the table `h` carries) when the
/// entry runs.
fn negotiate_with(ctx: &Ctx, h: &HostBuf, out_size: u32, services: Option<&KitServices>) -> Answer {
    let mut out = Guarded::new(out_size);
    let entry = ctx.entry;
    services.inspect(|s| s.in_entry(true));
    let (status, _) = call(&ctx.log, "memplug_plugin_v1", |sink| {
        // SAFETY: the entry contract: pointers valid for the call.
        unsafe { entry(h.0.as_ptr().cast(), out.ptr(), sink) }
    });
    services.inspect(|s| s.in_entry(false));
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

/// What is wrong with an answer the entry returned OK with, judged before
/// anything it points at is read: the host's `struct_size` overwritten,
/// the answer left unwritten (the kit's fill bytes), a NULL, low or
/// misaligned descriptor pointer, or an agreed minor outside the host's
/// range `1.host_min..=1.host_max`. `declared` is the `struct_size` the
/// host set.
pub(crate) fn malformed_answer(
    n: &MemplugNegotiation,
    declared: u32,
    host_min: u32,
    host_max: u32,
) -> Option<String> {
    let fill_ptr = usize::from_ne_bytes([FILL; core::mem::size_of::<usize>()]);
    let fill_u32 = u32::from_ne_bytes([FILL; 4]);
    let p = n.plugin as usize;
    let align = core::mem::align_of::<MemplugPlugin>();
    Some(if n.struct_size != declared {
        format!(
            "the entry overwrote the answer's struct_size: the host set {declared}, it reads {} (struct_size is the \
             host's to set)",
            n.struct_size
        )
    } else if p == fill_ptr && n.agreed_minor == fill_u32 {
        format!(
            "the entry returned OK without writing its answer: plugin and agreed_minor still hold the kit's fill \
             bytes ({p:#x}, {fill_u32:#x})"
        )
    } else if p == fill_ptr {
        format!("the entry returned OK without writing the descriptor pointer: plugin still holds the fill bytes {p:#x}")
    } else if p == 0 {
        "OK without a plugin descriptor (plugin is NULL)".into()
    } else if p < 4096 {
        format!("the plugin descriptor pointer {p:#x} lies in the first page: not a descriptor")
    } else if p % align != 0 {
        format!("the plugin descriptor pointer {p:#x} is not aligned to {align} bytes (MemplugPlugin's alignment)")
    } else if n.agreed_minor < host_min || n.agreed_minor > host_max {
        format!(
            "agreed minor {} ({:#x}) lies outside the host's range 1.{host_min}..=1.{host_max}",
            n.agreed_minor, n.agreed_minor
        )
    } else {
        return None;
    })
}

/// Runs every `negotiation.*` check; returns the descriptor and agreed
/// minor of the first, ordinary negotiation when it succeeded and its
/// answer is well-formed (nothing of a malformed answer is dereferenced).
pub(crate) fn run_all(res: &mut Results, ctx: &Ctx) -> Option<(*const MemplugPlugin, u32)> {
    let mut found: Option<(*const MemplugPlugin, u32)> = None;
    let mut range: Option<(u32, u32)> = None;
    res.run("negotiation.accepts_host", None, || {
        // A 1.2 host: the 1.2-sized host info with the kit's services.
        let services = ctx.services;
        let a = negotiate_with(
            ctx,
            &host_info(MEMPLUG_HOST_INFO_SIZE_1_2, 1, 0, MEMPLUG_ABI_MINOR, services.table()),
            MEMPLUG_NEGOTIATION_SIZE_1_0,
            Some(services),
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
        if let Some(why) = malformed_answer(&n, MEMPLUG_NEGOTIATION_SIZE_1_0, 0, MEMPLUG_ABI_MINOR) {
            fail!("{why}");
        }
        ensure!(
            crate::os::readable(n.plugin as u64, 16),
            "the plugin descriptor pointer {:p} is not mapped readable in this process: the descriptor cannot \
             be read",
            n.plugin
        );
        let declared = declared_range(n.plugin);
        found = Some((n.plugin, n.agreed_minor));
        range = declared;
        if let Some((pmin, pmax)) = declared {
            let (lo, hi) = (pmin, pmax.min(MEMPLUG_ABI_MINOR));
            ensure!(
                n.agreed_minor >= lo && n.agreed_minor <= hi,
                "agreed minor {} lies outside the common range 1.{lo}..=1.{hi}",
                n.agreed_minor
            );
        }
        Ok(format!(
            "agreed on 1.{} (host info of {MEMPLUG_HOST_INFO_SIZE_1_2} bytes with the kit's services table)",
            n.agreed_minor
        ))
    });
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
            "host info with struct_size 64, garbage after the fields the kit knows",
        )?;
        if let Some(why) =
            malformed_answer(&a.negotiation(), MEMPLUG_NEGOTIATION_SIZE_1_0, 0, MEMPLUG_ABI_MINOR)
        {
            fail!("host info with struct_size 64: {why}");
        }
        Ok("struct_size 64 accepted".into())
    });
    res.run("negotiation.host_size_respected", None, || host_size_respected(ctx));
    res.run("negotiation.short_out", None, || {
        let a = negotiate(ctx, &host(MEMPLUG_HOST_INFO_SIZE_1_0, 1, 0, MEMPLUG_ABI_MINOR), 8);
        ensure!(a.out.tail_intact(), "wrote past the answer's struct_size 8");
        expect(a.status, &[MEMPLUG_STATUS_INVALID_ARGUMENT], "answer with struct_size 8")?;
        Ok("refused, nothing written past it".into())
    });
    res.run("negotiation.null_arguments", None, || null_arguments(ctx));
    found
}

/// A host info of `struct_size` bytes whose last byte is the last one
/// before an inaccessible page: reading one byte past `struct_size` faults.
struct Fenced {
    base: *mut u8,
    len: usize,
    info: *const MemplugHostInfo,
}

impl Fenced {
    fn new(struct_size: u32, min_minor: u32, max_minor: u32) -> Option<Fenced> {
        let page = crate::os::page_size() as usize;
        let len = 2 * page;
        // SAFETY: a new private anonymous mapping; nothing else is touched.
        let base = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let base = base.cast::<u8>();
        let mut fenced = Fenced { base, len, info: core::ptr::null() };
        // SAFETY: the second page of the mapping just made.
        if unsafe { libc::mprotect(base.add(page).cast(), page, libc::PROT_NONE) } != 0 {
            return None;
        }
        let h = host(struct_size, MEMPLUG_ABI_MAJOR, min_minor, max_minor);
        let n = struct_size as usize;
        // SAFETY: `n` (at most 64) bytes end exactly at the fence, inside
        // the first, writable page; the start stays 8-aligned.
        let at = unsafe { base.add(page - n) };
        unsafe { core::ptr::copy_nonoverlapping(h.0.as_ptr(), at, n) };
        fenced.info = at.cast();
        Some(fenced)
    }
}

impl Drop for Fenced {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// `negotiation.host_size_respected`: a host info of the 1.0/1.1 size,
/// offering 1.1 or the newest minor, ends at an inaccessible page; the
/// entry must negotiate without reading past it (it must not look for the
/// 1.2 `services` field a shorter host did not send).
fn host_size_respected(ctx: &Ctx) -> Checked {
    let entry = ctx.entry;
    let size = MEMPLUG_HOST_INFO_SIZE_1_1;
    let mut agreed = Vec::new();
    for max in [1, MEMPLUG_ABI_MINOR] {
        let Some(fenced) = Fenced::new(size, 0, max) else {
            fail!("the kit could not map a guarded host info: {}", std::io::Error::last_os_error());
        };
        let info = fenced.info;
        let end = in_child(Duration::from_secs(5), move || {
            let mut out = Guarded::new(MEMPLUG_NEGOTIATION_SIZE_1_0);
            let rec = Recorder::new();
            let sink = rec.sink();
            // SAFETY: the entry contract; the host info is `size` bytes,
            // as it declares.
            let st = unsafe { entry(info, out.ptr(), &sink) };
            let n: MemplugNegotiation = out.read();
            // The exit status carries both: 5 bits of status, 3 of minor.
            (st.min(31) | (n.agreed_minor.min(7) << 5)) as i32
        });
        let what = format!(
            "a host info of struct_size {size} (an ABI 1.0/1.1 host, offering 1.0..=1.{max}) ending at an \
             inaccessible page"
        );
        let (st, minor) = match end {
            ChildEnd::Exited(code) => ((code & 31) as u32, (code >> 5) as u32),
            ChildEnd::Signaled(s) if s == libc::SIGSEGV || s == libc::SIGBUS => fail!(
                "{what}: the entry read past struct_size (its process was killed by {}): a plugin reads only \
             the struct_size bytes a host declares, and looks for the 1.2 services field only when \
             struct_size is at least {MEMPLUG_HOST_INFO_SIZE_1_2}",
                crate::os::signal_name(s)
            ),
            other => fail!("{what}: the process calling the entry {}", other.describe()),
        };
        expect(st, &[MEMPLUG_STATUS_OK], &what)?;
        agreed.push(format!("1.{minor}"));
    }
    Ok(format!(
        "{size}-byte host infos against an inaccessible page negotiated (agreed on {}) without a read past \
             struct_size",
        agreed.join(" and ")
    ))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(plugin: usize, agreed_minor: u32) -> MemplugNegotiation {
        MemplugNegotiation {
            struct_size: MEMPLUG_NEGOTIATION_SIZE_1_0,
            agreed_minor,
            plugin: plugin as *const MemplugPlugin,
        }
    }

    #[test]
    fn a_malformed_answer_is_named_before_it_is_read() {
        let ok = answer(0x7f00_0000_1000, 1);
        assert_eq!(malformed_answer(&ok, MEMPLUG_NEGOTIATION_SIZE_1_0, 0, 1), None);
        let unwritten = Guarded::new(MEMPLUG_NEGOTIATION_SIZE_1_0).read::<MemplugNegotiation>();
        let why = malformed_answer(&unwritten, MEMPLUG_NEGOTIATION_SIZE_1_0, 0, 1).unwrap();
        assert!(why.contains("without writing its answer"), "{why}");
        let mut half = unwritten;
        half.agreed_minor = 0;
        assert!(malformed_answer(&half, MEMPLUG_NEGOTIATION_SIZE_1_0, 0, 1).unwrap().contains("fill bytes"));
        let cases = [
            (answer(0, 0), "NULL"),
            (answer(0x10, 0), "first page"),
            (answer(0x7f00_0000_1001, 0), "not aligned"),
            (answer(0x7f00_0000_1000, 7), "outside the host's range"),
            (MemplugNegotiation { struct_size: 4096, ..ok }, "overwrote the answer's struct_size"),
        ];
        for (n, want) in cases {
            let why = malformed_answer(&n, MEMPLUG_NEGOTIATION_SIZE_1_0, 0, 1).unwrap();
            assert!(why.contains(want), "{why} should say {want}");
        }
    }
}
