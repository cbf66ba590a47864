//! `copy.*`: the stream-ordered copy of ABI 1.3 (`MemplugSync::copy`) and
//! the spaces it copies between (`MemplugProperties::copy_kinds`). Every
//! check but `copy.kinds` is skipped, saying why, where the mechanism does
//! not publish the slot.
//!
//! The kit sees the bytes of a CPU mechanism's memory directly. For any
//! other device it goes through host memory with the copy itself (the
//! mechanism must publish `MEMPLUG_COPY_HOST`): the pattern is written into
//! a host buffer, copied into the device and back out, and compared there.

use super::sync::{completion_timeout, wait};
use super::{ensure, expect, skip, Checked, Ctx, Gate, Job, MechState, Results, Scope, Verdict};
use crate::raw::{status_name, Mech};
use crate::sink::{call, Log};
use core::ffi::c_void;
use memplug_sdk::abi::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Bytes of each allocation the checks copy within.
const SIZE: u64 = 64 << 10;
/// What the ordered copies move (an odd offset and length: no alignment
/// is promised to be needed).
const OFFSET: u64 = 24;
const LEN: u64 = 20_011;
/// How long a held stream is watched for work that ran early.
const HELD: Duration = Duration::from_millis(100);

pub(crate) fn run_all(res: &mut Results, ctx: &Ctx, m: &Mech, st: &MechState) {
    let name = Some(m.name.as_str());
    res.run("copy.kinds", name, || kinds(ctx, m));
    res.run("copy.bytes_exact", name, || {
        published(m)?;
        bytes_exact(ctx, m, st)
    });
    res.run("copy.ordering_host_fns", name, || {
        published(m)?;
        ordering(ctx, m, st, true)
    });
    res.run("copy.ordering_fences", name, || {
        published(m)?;
        ordering(ctx, m, st, false)
    });
    res.run("copy.bounds", name, || {
        published(m)?;
        bounds(ctx, m)
    });
    res.run("copy.overlap", name, || {
        published(m)?;
        overlap(ctx, m)
    });
    res.run("copy.len_zero", name, || {
        published(m)?;
        len_zero(ctx, m, st)
    });
}

/// The copy slot as the kit read it (cleared below an agreed 1.3).
fn slot(m: &Mech) -> Option<CopyFn> {
    m.sync.and_then(|y| y.copy)
}

type CopyFn =
    unsafe extern "C" fn(*mut c_void, u64, u64, u64, u64, *const MemplugMessageSink) -> MemplugStatus;

fn published(m: &Mech) -> Result<(), Verdict> {
    if m.agreed_minor < 3 {
        skip!("the agreed minor is 1.{}: the copy slot is ABI 1.3", m.agreed_minor);
    }
    if slot(m).is_none() {
        skip!("the mechanism publishes no copy slot (optional; a host answers UNSUPPORTED)");
    }
    Ok(())
}

/// `copy(stream, dst, src, len)`.
fn copy(ctx: &Ctx, m: &Mech, stream: u64, dst: u64, src: u64, len: u64) -> MemplugStatus {
    raw_copy(&ctx.log, m, stream, dst, src, len)
}

/// The copy slot called as it is (`UNSUPPORTED` when not published), for
/// the loss sweep too.
pub(super) fn raw_copy(log: &Log, m: &Mech, stream: u64, dst: u64, src: u64, len: u64) -> MemplugStatus {
    let Some(f) = slot(m) else {
        return MEMPLUG_STATUS_UNSUPPORTED;
    };
    // SAFETY: a published slot; the ranges are the kit's own memory (the
    // refusals' ranges run past it but must be refused before any byte).
    call(log, "sync.copy", |sink| unsafe { f(m.ctx, stream, dst, src, len, sink) }).0
}

fn copy_ok(ctx: &Ctx, m: &Mech, stream: u64, dst: u64, src: u64, len: u64, what: &str) -> Checked {
    expect(copy(ctx, m, stream, dst, src, len), &[MEMPLUG_STATUS_OK], what)?;
    Ok(String::new())
}

/// The copy spaces in properties of the 1.3 size.
fn copy_kinds(ctx: &Ctx, m: &Mech) -> Result<u32, Verdict> {
    let (s, out) = m.properties(&ctx.log, MEMPLUG_PROPERTIES_SIZE_1_3);
    expect(s, &[MEMPLUG_STATUS_OK], "properties at the 1.3 size")?;
    ensure!(out.tail_intact(), "properties wrote past struct_size {MEMPLUG_PROPERTIES_SIZE_1_3}");
    let p: MemplugProperties = out.read();
    Ok(p.copy_kinds)
}

/// `copy.kinds`.
fn kinds(ctx: &Ctx, m: &Mech) -> Checked {
    if m.agreed_minor < 3 {
        skip!("the agreed minor is 1.{}: copy_kinds is ABI 1.3", m.agreed_minor);
    }
    let k = copy_kinds(ctx, m)?;
    let unknown = k & !MEMPLUG_COPY_ALL_1_3;
    ensure!(
        unknown == 0 || m.newer_than_kit(),
        "copy_kinds {k:#x} has bits no minor up to 1.{MEMPLUG_ABI_MINOR} defines ({unknown:#x})"
    );
    match (slot(m).is_some(), k) {
        (true, 0) => Err(Verdict::Fail("the copy slot is published but copy_kinds is 0".into())),
        (false, 0) => Ok("no copy slot, and copy_kinds 0".into()),
        (false, k) => Err(Verdict::Fail(format!("copy_kinds is {k:#x} but no copy slot is published"))),
        (true, k) if k & MEMPLUG_COPY_HOST == 0 => host_refused(ctx, m, k),
        (true, k) => Ok(format!("copy slot published, copy_kinds {}", kind_names(k))),
    }
}

/// Without `MEMPLUG_COPY_HOST`, a copy from the kit's host memory into an
/// allocation is `UNSUPPORTED` (the space is not published).
fn host_refused(ctx: &Ctx, m: &Mech, k: u32) -> Checked {
    let host = host_buf(64, 0x77);
    let mut s = Scope::new(ctx, m);
    let a = s.alloc_ok(SIZE, 64)?;
    let h = s.stream_ok()?;
    let what = "a copy from host memory (copy_kinds has no HOST)";
    refused(ctx, m, h, (a.addr, addr_of(&host), 64), MEMPLUG_STATUS_UNSUPPORTED, what)?;
    Ok(format!("copy slot published, copy_kinds {}; host memory refused", kind_names(k)))
}

fn kind_names(k: u32) -> String {
    let names: Vec<&str> =
        [(MEMPLUG_COPY_DEVICE, "DEVICE"), (MEMPLUG_COPY_HOST, "HOST"), (MEMPLUG_COPY_PEER, "PEER")]
            .into_iter()
            .filter(|(b, _)| k & b != 0)
            .map(|(_, n)| n)
            .collect();
    names.join("|")
}

/// How the kit reaches a mechanism's bytes: directly (CPU memory) or
/// through host buffers and the copy (`MEMPLUG_COPY_HOST`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum View {
    Direct,
    ThroughHost,
}

fn view(ctx: &Ctx, m: &Mech) -> Result<View, Verdict> {
    let k = copy_kinds(ctx, m)?;
    if m.is_cpu() {
        return Ok(View::Direct);
    }
    if k & MEMPLUG_COPY_HOST == 0 {
        skip!("the kit cannot see this device's memory: it is not a CPU's and copy_kinds has no HOST");
    }
    Ok(View::ThroughHost)
}

/// The byte at `i` of the kit's pattern (`seed` tells patterns apart).
fn pattern(seed: u8, i: u64) -> u8 {
    ((i * 131 + 7) % 251) as u8 ^ seed
}

/// A host buffer of `len` bytes, filled with `fill`.
fn host_buf(len: u64, fill: u8) -> Arc<Mutex<Vec<u8>>> {
    Arc::new(Mutex::new(vec![fill; len as usize]))
}

fn addr_of(b: &Arc<Mutex<Vec<u8>>>) -> u64 {
    b.lock().unwrap_or_else(|e| e.into_inner()).as_ptr() as u64
}

/// Waits for a fence of the kit's, failing the check on anything but OK.
fn complete(ctx: &Ctx, m: &Mech, st: &MechState, fence: u64, what: &str) -> Result<(), Verdict> {
    let timeout = completion_timeout(ctx, st);
    expect(wait(ctx, m, fence, timeout)?, &[MEMPLUG_STATUS_OK], &format!("fence_wait({timeout:?}) {what}"))
}

/// Where the first `len` bytes at `addr` differ from `want` (the first
/// differing offset), if anywhere.
///
/// # Safety
/// `addr` is readable for `want.len()` bytes.
unsafe fn differs(addr: u64, want: &[u8]) -> Option<usize> {
    let got = std::slice::from_raw_parts(addr as *const u8, want.len());
    got.iter().zip(want).position(|(a, b)| a != b)
}

/// `copy.bytes_exact`: a copy between two of the mechanism's allocations,
/// at an odd offset and length, moves exactly those bytes (none around
/// them).
fn bytes_exact(ctx: &Ctx, m: &Mech, st: &MechState) -> Checked {
    let v = view(ctx, m)?;
    if copy_kinds(ctx, m)? & MEMPLUG_COPY_DEVICE == 0 {
        skip!("copy_kinds has no DEVICE: the kit copies only between the mechanism's own allocations here");
    }
    let (staged_in, staged_out) = (host_buf(SIZE, 0), host_buf(SIZE, 0));
    let mut s = Scope::new(ctx, m);
    let a = s.alloc_ok(SIZE, 64)?;
    let b = s.alloc_ok(SIZE, 64)?;
    let h = s.stream_ok()?;
    let src: Vec<u8> = (0..SIZE).map(|i| pattern(0x5a, i)).collect();
    let background = vec![0xc3u8; SIZE as usize];
    // A holds the pattern, B the background.
    match v {
        View::Direct => unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), a.addr as *mut u8, SIZE as usize);
            std::ptr::copy_nonoverlapping(background.as_ptr(), b.addr as *mut u8, SIZE as usize);
        },
        View::ThroughHost => {
            staged_in.lock().unwrap_or_else(|e| e.into_inner()).copy_from_slice(&src);
            copy_ok(ctx, m, h, a.addr, addr_of(&staged_in), SIZE, "copy host -> A")?;
            staged_out.lock().unwrap_or_else(|e| e.into_inner()).copy_from_slice(&background);
            copy_ok(ctx, m, h, b.addr, addr_of(&staged_out), SIZE, "copy host -> B")?;
        }
    }
    copy_ok(ctx, m, h, b.addr + OFFSET + 8, a.addr + OFFSET, LEN, "copy A -> B")?;
    let seen = match v {
        View::Direct => b.addr,
        View::ThroughHost => {
            copy_ok(ctx, m, h, addr_of(&staged_out), b.addr, SIZE, "copy B -> host")?;
            addr_of(&staged_out)
        }
    };
    let f = s.fence_ok(h)?;
    complete(ctx, m, st, f, "after the copies")?;
    let mut want = background.clone();
    let (at, from) = ((OFFSET + 8) as usize, OFFSET as usize);
    want[at..at + LEN as usize].copy_from_slice(&src[from..from + LEN as usize]);
    // SAFETY: B (CPU memory) or the kit's buffer, SIZE bytes, no copy
    // pending on them (the fence completed).
    if let Some(i) = unsafe { differs(seen, &want) } {
        let inside = (at..at + LEN as usize).contains(&i);
        fail_at(i, inside, seen, &want)?;
    }
    Ok(format!("{LEN} bytes copied exactly between two allocations (seen {})", seen_how(v)))
}

fn seen_how(v: View) -> &'static str {
    match v {
        View::Direct => "directly",
        View::ThroughHost => "through host memory",
    }
}

fn fail_at(i: usize, inside: bool, seen: u64, want: &[u8]) -> Result<(), Verdict> {
    // SAFETY: as for `differs`, which found `i` in range.
    let got = unsafe { *((seen + i as u64) as *const u8) };
    let place = if inside { "inside the copied range" } else { "outside the copied range" };
    Err(Verdict::Fail(format!(
        "byte {i} of the destination ({place}) is {got:#04x}, expected {:#04x}",
        want[i]
    )))
}

/// What the kit's host functions do.
enum HostJob {
    /// Writes these bytes at the address.
    Write(u64, Vec<u8>),
    /// Reads `len` bytes at the address into the shared vector.
    Read(u64, u64, Arc<Mutex<Vec<u8>>>),
}

unsafe extern "C" fn run_host_job(userdata: *mut c_void) {
    // Runs on a plugin thread: nothing may unwind into it.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the Box leaked by `enqueue_host_job`, run once.
        let job = unsafe { Box::from_raw(userdata.cast::<HostJob>()) };
        match *job {
            // SAFETY: the kit's own memory, kept alive until the stream is
            // destroyed, which waits for this job.
            HostJob::Write(addr, bytes) => unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len())
            },
            HostJob::Read(addr, len, into) => {
                let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
                into.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(bytes);
            }
        }
    }));
}

fn enqueue_host_job(ctx: &Ctx, m: &Mech, stream: u64, job: HostJob) -> Result<(), Verdict> {
    let userdata = Box::into_raw(Box::new(job)).cast::<c_void>();
    let s = m.enqueue(&ctx.log, stream, Some(run_host_job), userdata);
    if s != MEMPLUG_STATUS_OK {
        // SAFETY: refused, so never run: the box is still ours.
        drop(unsafe { Box::from_raw(userdata.cast::<HostJob>()) });
    }
    expect(s, &[MEMPLUG_STATUS_OK], "enqueue_host_fn")
}

/// `copy.ordering_host_fns` (`reader`) and `copy.ordering_fences`: on a
/// stream held by a gate, a host function writes the source, the copy
/// moves it, and (with `reader`) a host function after the copy reads the
/// destination, then a fence is recorded. While the gate holds the stream
/// nothing may have been copied and the fence is not complete; once it is
/// open the host function after the copy saw the copied bytes, and the
/// destination has them as soon as the fence completed.
fn ordering(ctx: &Ctx, m: &Mech, st: &MechState, reader: bool) -> Checked {
    let v = view(ctx, m)?;
    let (src_buf, out_buf) = (host_buf(SIZE, 0x11), host_buf(SIZE, 0x22));
    let read = Arc::new(Mutex::new(Vec::new()));
    let mut s = Scope::new(ctx, m);
    let h = s.stream_ok()?;
    // Through host memory the source is a host buffer and the copy goes
    // into a device allocation and back out into another host buffer.
    let (src, dev, dst) = match v {
        View::Direct => {
            let (a, b) = (s.alloc_ok(SIZE, 64)?, s.alloc_ok(SIZE, 64)?);
            // SAFETY: the kit's fresh CPU allocations.
            unsafe {
                std::ptr::write_bytes(a.addr as *mut u8, 0x11, SIZE as usize);
                std::ptr::write_bytes(b.addr as *mut u8, 0x22, SIZE as usize);
            }
            (a.addr, None, b.addr)
        }
        View::ThroughHost => (addr_of(&src_buf), Some(s.alloc_ok(SIZE, 64)?.addr), addr_of(&out_buf)),
    };
    let gate = Arc::new(Gate::default());
    s.enqueue_ok(h, Job::Gate(gate.clone()))?;
    let bytes: Vec<u8> = (0..LEN).map(|i| pattern(0xa5, i)).collect();
    enqueue_host_job(ctx, m, h, HostJob::Write(src + OFFSET, bytes.clone()))?;
    match dev {
        None => copy_ok(ctx, m, h, dst + OFFSET, src + OFFSET, LEN, "copy behind the host function")?,
        Some(d) => {
            copy_ok(
                ctx,
                m,
                h,
                d + OFFSET,
                src + OFFSET,
                LEN,
                "copy host -> device behind the host function",
            )?;
            copy_ok(ctx, m, h, dst + OFFSET, d + OFFSET, LEN, "copy device -> host")?
        }
    };
    if reader {
        enqueue_host_job(ctx, m, h, HostJob::Read(dst + OFFSET, LEN, read.clone()))?;
    }
    let f = s.fence_ok(h)?;
    std::thread::sleep(HELD);
    // SAFETY (each read of `dst`): the kit's memory, SIZE bytes.
    let early = unsafe { differs(dst + OFFSET, &vec![0x22; LEN as usize]) };
    ensure!(
        early.is_none(),
        "the destination changed while the stream was held before the copy (byte {} of the range): the copy \
         did not wait for the work before it",
        early.unwrap_or(0)
    );
    let q = m.fence_query(&ctx.log, f);
    ensure!(q != MEMPLUG_STATUS_OK, "the fence after the copy completed while the stream was held before it");
    gate.open();
    if reader {
        // Judged by the host function alone (the fence is copy.ordering_fences').
        return read_after(ctx, st, &read, &bytes, v);
    }
    complete(ctx, m, st, f, "on the fence after the copy")?;
    // SAFETY: the kit's memory, SIZE bytes.
    let landed = unsafe { std::slice::from_raw_parts((dst + OFFSET) as *const u8, LEN as usize) };
    if let Some(why) = short_copy(landed, &bytes, 0x22) {
        fail!("{why}");
    }
    if let Some(i) = unsafe { differs(dst + OFFSET, &bytes) } {
        let got = unsafe { *((dst + OFFSET + i as u64) as *const u8) };
        return Err(Verdict::Fail(format!(
            "once the fence after the copy completed, byte {i} of the destination is {got:#04x}, expected \
             {:#04x} (written by the host function before the copy){}",
            bytes[i],
            if got == 0x11 { ": the copy ran before the host function" } else { "" }
        )));
    }
    Ok(format!(
        "held stream: the fence after the copy was pending, and complete with the bytes in place ({})",
        seen_how(v)
    ))
}

/// Waits for the host function after the copy to have read the
/// destination, and judges what it saw.
fn read_after(ctx: &Ctx, st: &MechState, read: &Mutex<Vec<u8>>, bytes: &[u8], v: View) -> Checked {
    let deadline = std::time::Instant::now() + completion_timeout(ctx, st);
    let seen = loop {
        let seen = read.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if !seen.is_empty() || std::time::Instant::now() >= deadline {
            break seen;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    ensure!(
        seen.len() == bytes.len(),
        "the host function after the copy did not run once the stream was released"
    );
    if let Some(why) = short_copy(&seen, bytes, 0x22) {
        fail!("the host function after the copy ran after it, but {why}");
    }
    if let Some(i) = seen.iter().zip(bytes).position(|(a, b)| a != b) {
        fail!(
            "the host function enqueued after the copy read {:#04x} at byte {i} of the destination, expected \
             {:#04x}: it ran before the copy completed{}",
            seen[i],
            bytes[i],
            if seen[i] == 0x11 { " (or the copy ran before the host function that wrote the source)" } else { "" }
        );
    }
    Ok(format!(
        "held stream: nothing copied early; the host function after the copy saw it ({})",
        seen_how(v)
    ))
}

use super::fail;

/// Whether `seen` (the destination of a copy of `want`, which held
/// `before` in every byte) is a copy that stopped short: the first bytes
/// arrived and the rest still hold `before`. Such a copy ran in order and
/// moved too little, so the ordering checks name it and send the reader to
/// `copy.bytes_exact` instead of blaming the order.
pub(super) fn short_copy(seen: &[u8], want: &[u8], before: u8) -> Option<String> {
    let i = seen.iter().zip(want).position(|(a, b)| a != b)?;
    if i == 0 || seen.len() != want.len() || seen[i..].iter().any(|&b| b != before) {
        return None;
    }
    Some(format!(
        "the copy stopped short: only the first {i} of its {} bytes arrived, the last {} still hold what the \
         destination held before: a short copy (copy.bytes_exact judges the bytes), not an ordering fault \
         (the work before and after the copy ran in order)",
        want.len(),
        want.len() - i
    ))
}

/// The refusals of the bounds, overlap and zero-length checks, each
/// answered before anything is enqueued: the stream is held meanwhile, and
/// a refused copy must change no byte once it drains.
struct Held<'a> {
    s: Scope<'a>,
    h: u64,
    gate: Arc<Gate>,
}

fn held<'a>(ctx: &'a Ctx, m: &'a Mech) -> Result<Held<'a>, Verdict> {
    let mut s = Scope::new(ctx, m);
    let h = s.stream_ok()?;
    let gate = Arc::new(Gate::default());
    s.enqueue_ok(h, Job::Gate(gate.clone()))?;
    Ok(Held { s, h, gate })
}

fn refused(
    ctx: &Ctx,
    m: &Mech,
    h: u64,
    (dst, src, len): (u64, u64, u64),
    want: MemplugStatus,
    what: &str,
) -> Result<(), Verdict> {
    let got = copy(ctx, m, h, dst, src, len);
    ensure!(
        got != MEMPLUG_STATUS_OK,
        "{what} (dst {dst:#x}, src {src:#x}, len {len:#x}) was accepted; expected {}",
        status_name(want)
    );
    expect(got, &[want], what)
}

/// `copy.bounds`: a range running past the end of an allocation, from
/// either side, or into an uncommitted part of a reservation, is
/// OUT_OF_RANGE.
fn bounds(ctx: &Ctx, m: &Mech) -> Checked {
    let mut hd = held(ctx, m)?;
    let a = hd.s.alloc_ok(SIZE, 64)?;
    let b = hd.s.alloc_ok(SIZE, 64)?;
    let h = hd.h;
    let end = a.addr + a.size;
    let cases = [
        ((end - 8, b.addr, 16), "dst past the end of an allocation"),
        ((b.addr, end - 8, 16), "src past the end of an allocation"),
        ((end - 8, b.addr + b.size - 8, 16), "both past the ends of their allocations"),
    ];
    for (range, what) in cases {
        refused(ctx, m, h, range, MEMPLUG_STATUS_OUT_OF_RANGE, what)?;
    }
    let mut detail = format!("{} ranges past an allocation refused", cases.len());
    if m.vb.is_some() {
        let g = m.props.granularity.max(1);
        let r = hd.s.reserve_ok(2 * g)?;
        expect(m.commit(&ctx.log, &r, 0, g), &[MEMPLUG_STATUS_OK], "commit [0, g)")?;
        let into = (r.addr + g - 8, b.addr, 16);
        refused(ctx, m, h, into, MEMPLUG_STATUS_OUT_OF_RANGE, "dst into an uncommitted granule")?;
        let from = (b.addr, r.addr + g, 16);
        refused(ctx, m, h, from, MEMPLUG_STATUS_OUT_OF_RANGE, "src in an uncommitted granule")?;
        copy_ok(ctx, m, h, r.addr + g - 16, b.addr, 16, "copy into the committed granule")?;
        detail.push_str("; uncommitted parts of a reservation refused, its committed part copied");
    }
    hd.gate.open();
    Ok(detail)
}

/// `copy.overlap`: ranges sharing a byte are INVALID_ARGUMENT, whichever
/// comes first, even by one byte.
fn overlap(ctx: &Ctx, m: &Mech) -> Checked {
    let mut hd = held(ctx, m)?;
    let a = hd.s.alloc_ok(SIZE, 64)?;
    let h = hd.h;
    for (range, what) in [
        ((a.addr + 8, a.addr, 64), "dst 8 bytes after src"),
        ((a.addr, a.addr + 8, 64), "src 8 bytes after dst"),
        ((a.addr + 63, a.addr, 64), "ranges sharing one byte"),
        ((a.addr, a.addr, 64), "dst equal to src"),
    ] {
        refused(ctx, m, h, range, MEMPLUG_STATUS_INVALID_ARGUMENT, what)?;
    }
    copy_ok(ctx, m, h, a.addr + 64, a.addr, 64, "adjacent ranges of one allocation")?;
    hd.gate.open();
    Ok("overlapping ranges refused; adjacent ones copied".into())
}

/// `copy.len_zero`: `len` 0 is OK and does nothing, even with equal or
/// out-of-range addresses; an unknown stream is refused
/// (UNKNOWN_ALLOCATION) for a real copy.
fn len_zero(ctx: &Ctx, m: &Mech, st: &MechState) -> Checked {
    let direct = m.is_cpu();
    let mut s = Scope::new(ctx, m);
    let a = s.alloc_ok(SIZE, 64)?;
    let b = s.alloc_ok(SIZE, 64)?;
    let h = s.stream_ok()?;
    if direct {
        // SAFETY: the kit's fresh CPU allocations.
        unsafe {
            std::ptr::write_bytes(a.addr as *mut u8, 0x44, SIZE as usize);
            std::ptr::write_bytes(b.addr as *mut u8, 0x55, SIZE as usize);
        }
    }
    for (dst, src, what) in [
        (b.addr, a.addr, "two allocations"),
        (a.addr, a.addr, "dst equal to src"),
        (a.addr + a.size, b.addr, "dst at the end of an allocation"),
    ] {
        expect(copy(ctx, m, h, dst, src, 0), &[MEMPLUG_STATUS_OK], &format!("copy of 0 bytes, {what}"))?;
    }
    let f = s.fence_ok(h)?;
    complete(ctx, m, st, f, "after copies of 0 bytes")?;
    if direct {
        // SAFETY: the kit's allocations; nothing pending.
        ensure!(
            unsafe { differs(b.addr, &vec![0x55; SIZE as usize]) }.is_none(),
            "a copy of 0 bytes changed the destination"
        );
    }
    let (ds, gone) = m.stream_create(&ctx.log);
    expect(ds, &[MEMPLUG_STATUS_OK], "stream_create")?;
    expect(m.stream_destroy(&ctx.log, gone), &[MEMPLUG_STATUS_OK], "stream_destroy")?;
    refused(
        ctx,
        m,
        gone,
        (b.addr, a.addr, 64),
        MEMPLUG_STATUS_UNKNOWN_ALLOCATION,
        "a copy on a destroyed stream",
    )?;
    Ok("copies of 0 bytes are OK and change nothing; a destroyed stream is refused".into())
}

#[cfg(test)]
mod tests {
    use super::short_copy;

    #[test]
    fn a_copy_missing_its_tail_is_short_and_one_missing_everything_or_wrong_bytes_is_not() {
        let want = [1u8, 2, 3, 4];
        let d = short_copy(&[1, 2, 3, 9], &want, 9).expect("short");
        assert!(d.contains("first 3 of its 4 bytes") && d.contains("not an ordering fault"), "{d}");
        assert_eq!(short_copy(&[9, 9, 9, 9], &want, 9), None, "nothing arrived: not short");
        assert_eq!(short_copy(&[1, 2, 7, 9], &want, 9), None, "a wrong byte: not short");
        assert_eq!(short_copy(&want, &want, 9), None, "all arrived");
    }
}
