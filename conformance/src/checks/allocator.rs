//! `allocator.*`, `structs.short_host_structs`, `structs.long_host_structs`,
//! `identity.*` and `lifecycle.live_objects`.

use super::{ensure, expect, expect_live, fail, skip, Checked, Ctx, MechState, Results, Scope};
use crate::os::writable;
use crate::raw::{request, status_name, Mech};
use crate::sink::call;
use memplug_sdk::abi::*;

/// Largest alignment `allocator.alignment` tries (1 GiB): larger ones cost
/// address space out of proportion to what they would show.
const ALIGNMENT_CAP: u64 = 1 << 30;

/// Garbage after the 1.0 prefix of over-long host structs.
const GARBAGE: u8 = 0xc3;

/// An ABI struct copied into a larger buffer, `struct_size` set to
/// `declared`, garbage after the struct.
#[repr(C, align(8))]
pub(crate) struct Sized([u8; 128]);

impl Sized {
    pub(crate) fn new<T: Copy>(v: &T, declared: u32) -> Self {
        let mut b = Sized([GARBAGE; 128]);
        let n = core::mem::size_of::<T>();
        // SAFETY: plain data, n <= 128 for every ABI struct.
        unsafe { core::ptr::copy_nonoverlapping((v as *const T).cast::<u8>(), b.0.as_mut_ptr(), n) };
        b.0[..4].copy_from_slice(&declared.to_ne_bytes());
        b
    }

    pub(crate) fn ptr<T>(&self) -> *const T {
        self.0.as_ptr().cast()
    }
}

/// Writes a pattern over `[addr, addr + len)` and reads it back, after
/// checking the range is mapped read-write. CPU devices only.
pub(crate) fn touch(addr: u64, len: u64, seed: u8) -> Result<(), super::Verdict> {
    ensure!(writable(addr, len), "[{addr:#x}, +{len}) is not mapped read-write in this process");
    let p = addr as *mut u8;
    // SAFETY: mapped read-write (checked just above) and owned by the
    // kit's live object.
    unsafe {
        for i in 0..len as usize {
            p.add(i).write_volatile(seed.wrapping_add(i as u8));
        }
        for i in 0..len as usize {
            let got = p.add(i).read_volatile();
            ensure!(got == seed.wrapping_add(i as u8), "byte {i} of [{addr:#x}, +{len}) reads back {got:#x}");
        }
    }
    Ok(())
}

pub(crate) fn run_all(res: &mut Results, ctx: &Ctx, m: &Mech, st: &mut MechState) {
    let name = Some(m.name.as_str());
    res.run("allocator.usable", name, || usable(ctx, m, st));
    res.run("allocator.alignment", name, || alignment(ctx, m));
    res.run("allocator.bad_alignment", name, || bad_alignment(ctx, m));
    res.run("allocator.zero_size", name, || {
        refused_request(ctx, m, &[(0, m.props.min_alignment, 0)], &[MEMPLUG_STATUS_INVALID_ARGUMENT])
            .map(|()| "size 0 refused".into())
    });
    res.run("allocator.huge_size", name, || {
        let a = m.props.min_alignment;
        refused_request(
            ctx,
            m,
            &[(1 << 62, a, 0), (1 << 63, a, 0), (u64::MAX, a, 0)],
            &[MEMPLUG_STATUS_OUT_OF_MEMORY, MEMPLUG_STATUS_INVALID_ARGUMENT],
        )
        .map(|()| "2^62, 2^63 and 2^64-1 bytes refused".into())
    });
    res.run("allocator.unknown_flags", name, || {
        let a = m.props.min_alignment;
        refused_request(ctx, m, &[(64, a, 1), (64, a, 1 << 31)], &[MEMPLUG_STATUS_INVALID_ARGUMENT])
            .map(|()| "flags 0x1 and 0x80000000 refused".into())
    });
    res.run("allocator.memory_info", name, || memory_info(ctx, m));
    res.run("allocator.class_tags", name, || class_tags(ctx, m));
    res.run("allocator.block_size_sane", name, || block_size_sane(ctx, m));
    res.run("structs.short_host_structs", name, || short_structs(ctx, m));
    res.run("structs.long_host_structs", name, || long_structs(ctx, m));
    res.run("identity.wrong_mechanism", name, || wrong_mechanism(ctx, m));
    res.run("identity.wrong_device", name, || wrong_device(ctx, m));
    res.run("identity.unknown_allocation", name, || unknown_allocation(ctx, m));
    res.run("identity.double_free", name, || double_free(ctx, m));
    res.run("identity.reservation", name, || reservation_identity(ctx, m));
    res.run("identity.no_overlap", name, || no_overlap(ctx, m, st));
}

fn usable(ctx: &Ctx, m: &Mech, st: &mut MechState) -> Checked {
    let mut s = Scope::new(ctx, m);
    let size = 4096 + 100;
    let a = s.alloc_ok(size, m.props.min_alignment)?;
    let detail = if m.is_cpu() {
        touch(a.addr, size, 0x11)?;
        st.touch_ok = true;
        format!("{size} bytes at {:#x}, written and read back", a.addr)
    } else {
        format!("{size} bytes at {:#x} (device memory: contents not checked)", a.addr)
    };
    expect(s.free(&a), &[MEMPLUG_STATUS_OK], "deallocate")?;
    Ok(detail)
}

fn alignment(ctx: &Ctx, m: &Mech) -> Checked {
    let mut s = Scope::new(ctx, m);
    let top = m.props.max_alignment.min(ALIGNMENT_CAP);
    let mut align = 1u64;
    let mut n = 0;
    while align <= top {
        let a = s.alloc_ok(64, align)?;
        let need = align.max(m.props.min_alignment);
        ensure!(
            a.addr % need == 0,
            "allocate(64, align {align}) returned {:#x}, not aligned to {need}",
            a.addr
        );
        if m.is_cpu() {
            touch(a.addr, 64, align as u8)?;
        }
        expect(s.free(&a), &[MEMPLUG_STATUS_OK], &format!("deallocate (align {align})"))?;
        n += 1;
        align <<= 1;
    }
    let mut d = format!("{n} alignments from 1 to {top} honoured");
    if top < m.props.max_alignment {
        d += &format!(" (max_alignment {} not tried above {ALIGNMENT_CAP})", m.props.max_alignment);
    }
    Ok(d)
}

fn bad_alignment(ctx: &Ctx, m: &Mech) -> Checked {
    let mut cases = vec![(64, 0, 0), (64, 3, 0)];
    if let Some(twice) = m.props.max_alignment.checked_mul(2) {
        cases.push((64, twice, 0));
    }
    refused_request(ctx, m, &cases, &[MEMPLUG_STATUS_INVALID_ARGUMENT])?;
    Ok(format!("alignments {} refused", cases.iter().map(|c| c.1.to_string()).collect::<Vec<_>>().join(", ")))
}

/// Each `(size, alignment, flags)` must be refused with one of `want`,
/// allocating nothing.
fn refused_request(
    ctx: &Ctx,
    m: &Mech,
    cases: &[(u64, u64, u32)],
    want: &[MemplugStatus],
) -> Result<(), super::Verdict> {
    let mut s = Scope::new(ctx, m);
    let live = m.live();
    for &(size, align, flags) in cases {
        let mut req = request(m, size, align);
        req.flags = flags;
        let made = s.allocate(&req);
        expect(made.status, want, &format!("allocate(size {size}, alignment {align}, flags {flags:#x})"))?;
        expect_live(m, live, &format!("after the refused allocate(size {size})"))?;
    }
    Ok(())
}

fn memory_info(ctx: &Ctx, m: &Mech) -> Checked {
    let Some((s, out)) = m.memory_info(&ctx.log) else {
        skip!("memory_info is NULL: the plugin says the device cannot report free/total memory");
    };
    ensure!(
        s != MEMPLUG_STATUS_UNSUPPORTED,
        "memory_info is published but answers UNSUPPORTED (an absent slot is NULL)"
    );
    expect(s, &[MEMPLUG_STATUS_OK], "memory_info")?;
    ensure!(out.tail_intact(), "memory_info wrote past struct_size {MEMPLUG_MEMORY_INFO_SIZE_1_0}");
    let i: MemplugMemoryInfo = out.read();
    ensure!(i.total_bytes > 0, "total_bytes is 0 (a successful no-op?)");
    ensure!(i.free_bytes <= i.total_bytes, "free_bytes {} > total_bytes {}", i.free_bytes, i.total_bytes);
    Ok(format!("{} of {} bytes free", i.free_bytes, i.total_bytes))
}

fn class_tags(ctx: &Ctx, m: &Mech) -> Checked {
    if m.agreed_minor < 1 {
        skip!("class tags are ABI 1.1; the agreed minor is 1.{}", m.agreed_minor);
    }
    let mut s = Scope::new(ctx, m);
    let tags = [
        MEMPLUG_CLASS_OTHER,
        MEMPLUG_CLASS_WEIGHTS,
        MEMPLUG_CLASS_KV,
        MEMPLUG_CLASS_ACTIVATIONS,
        MEMPLUG_CLASS_WORKSPACE,
        77,
    ];
    for tag in tags {
        let mut req = request(m, 256, m.props.min_alignment);
        req.struct_size = MEMPLUG_REQUEST_SIZE_1_1;
        req.class_tag = tag;
        let made = s.allocate(&req);
        expect(made.status, &[MEMPLUG_STATUS_OK], &format!("allocate with class_tag {tag}"))?;
        ensure!(
            made.block.addr != 0 && made.block.size >= 256,
            "allocate with class_tag {tag} returned address {:#x}, size {}",
            made.block.addr,
            made.block.size
        );
        expect(s.free(&made.obj), &[MEMPLUG_STATUS_OK], "deallocate")?;
    }
    Ok("1.1 requests tagged 0..=4, and the unknown 77, are served alike (a tag is a hint)".into())
}

fn short_structs(ctx: &Ctx, m: &Mech) -> Checked {
    let mut s = Scope::new(ctx, m);
    let live = m.live();
    let align = m.props.min_alignment;
    // A short request.
    let req = request(m, 64, align);
    let short = Sized::new(&req, 8);
    let made = s.m.make_raw(
        &ctx.log,
        "allocator.allocate",
        m.alloc.allocate,
        short.ptr(),
        req.object_id,
        MEMPLUG_BLOCK_SIZE_1_0,
    );
    if made.status == MEMPLUG_STATUS_OK {
        s.m.deallocate(&ctx.log, &made.obj);
    }
    expect(made.status, &[MEMPLUG_STATUS_INVALID_ARGUMENT], "allocate with request struct_size 8")?;
    expect_live(m, live, "after the refused short request")?;
    // A short output block.
    let made = s.m.make_raw(&ctx.log, "allocator.allocate", m.alloc.allocate, &req, req.object_id, 8);
    if made.status == MEMPLUG_STATUS_OK {
        fail!(
            "allocate with an output block of struct_size 8 returned OK (the block cannot hold the answer)"
        );
    }
    expect(made.status, &[MEMPLUG_STATUS_INVALID_ARGUMENT], "allocate with output struct_size 8")?;
    expect_live(m, live, "after the refused short output")?;
    // A short object reference.
    let a = s.alloc_ok(64, align)?;
    let short = Sized::new(&a, 8);
    let dealloc = m.alloc.deallocate.expect("validated");
    // SAFETY: a published slot; the buffer outlives the call.
    let (st, _) = call(&ctx.log, "allocator.deallocate", |sink| unsafe { dealloc(m.ctx, short.ptr(), sink) });
    expect(st, &[MEMPLUG_STATUS_INVALID_ARGUMENT], "deallocate with reference struct_size 8")?;
    // The refused call freed nothing: the full reference still frees it.
    expect(s.free(&a), &[MEMPLUG_STATUS_OK], "deallocate after the refused short reference")?;
    // A short properties output.
    let (st, _) = m.properties(&ctx.log, 8);
    expect(st, &[MEMPLUG_STATUS_INVALID_ARGUMENT], "properties with struct_size 8")?;
    Ok("short request, output, reference and properties refused".into())
}

fn long_structs(ctx: &Ctx, m: &Mech) -> Checked {
    let s = Scope::new(ctx, m);
    let req = request(m, 64, m.props.min_alignment);
    let long = Sized::new(&req, 64);
    let made = s.m.make_raw(
        &ctx.log,
        "allocator.allocate",
        m.alloc.allocate,
        long.ptr(),
        req.object_id,
        MEMPLUG_BLOCK_SIZE_1_0,
    );
    if made.status == MEMPLUG_STATUS_OK {
        // Track it like any other allocation.
        let again = made.obj;
        let long_ref = Sized::new(&again, 96);
        let dealloc = m.alloc.deallocate.expect("validated");
        // SAFETY: a published slot; the buffer outlives the call.
        let (st, _) =
            call(&ctx.log, "allocator.deallocate", |sink| unsafe { dealloc(m.ctx, long_ref.ptr(), sink) });
        if st != MEMPLUG_STATUS_OK {
            s.m.deallocate(&ctx.log, &again);
        }
        expect(st, &[MEMPLUG_STATUS_OK], "deallocate with reference struct_size 96 (garbage after 1.0)")?;
    }
    expect(made.status, &[MEMPLUG_STATUS_OK], "allocate with request struct_size 64 (garbage after 1.0)")?;
    ensure!(
        made.block.addr != 0 && made.block.size >= 64,
        "allocate with a long request returned address {:#x}, size {}",
        made.block.addr,
        made.block.size
    );
    Ok("request of 64 bytes and reference of 96 bytes accepted".into())
}

fn wrong_mechanism(ctx: &Ctx, m: &Mech) -> Checked {
    let mut s = Scope::new(ctx, m);
    let a = s.alloc_ok(64, m.props.min_alignment)?;
    let live = m.live();
    let mut foreign = a;
    foreign.mechanism_id = m.id ^ (1 << 63);
    expect(
        m.deallocate(&ctx.log, &foreign),
        &[MEMPLUG_STATUS_WRONG_MECHANISM],
        &format!("deallocate naming mechanism id {:#x}", foreign.mechanism_id),
    )?;
    expect_live(m, live, "after the refused foreign deallocate")?;
    expect(s.free(&a), &[MEMPLUG_STATUS_OK], "deallocate by the right mechanism afterwards")?;
    Ok("refused; the allocation stayed live and freed afterwards".into())
}

fn other_kind(k: MemplugDeviceKind) -> MemplugDeviceKind {
    if k == MEMPLUG_DEVICE_CPU {
        MEMPLUG_DEVICE_CUDA
    } else {
        MEMPLUG_DEVICE_CPU
    }
}

fn wrong_device(ctx: &Ctx, m: &Mech) -> Checked {
    let mut s = Scope::new(ctx, m);
    let a = s.alloc_ok(64, m.props.min_alignment)?;
    let live = m.live();
    for (what, device) in [
        ("ordinal + 1", MemplugDevice { kind: m.device.kind, ordinal: m.device.ordinal.wrapping_add(1) }),
        ("another kind", MemplugDevice { kind: other_kind(m.device.kind), ordinal: m.device.ordinal }),
    ] {
        let mut o = a;
        o.device = device;
        expect(
            m.deallocate(&ctx.log, &o),
            &[MEMPLUG_STATUS_WRONG_DEVICE],
            &format!("deallocate naming the device's {what}"),
        )?;
        expect_live(m, live, "after the refused deallocate")?;
        let mut req = request(m, 64, m.props.min_alignment);
        req.device = device;
        let made = s.allocate(&req);
        expect(made.status, &[MEMPLUG_STATUS_WRONG_DEVICE], &format!("allocate for the device's {what}"))?;
        expect_live(m, live, "after the refused allocate")?;
    }
    expect(s.free(&a), &[MEMPLUG_STATUS_OK], "deallocate on the right device afterwards")?;
    Ok("other ordinal and other kind refused, for allocate and deallocate".into())
}

fn unknown_allocation(ctx: &Ctx, m: &Mech) -> Checked {
    let mut s = Scope::new(ctx, m);
    let a = s.alloc_ok(64, m.props.min_alignment)?;
    let live = m.live();
    let mut forged_high = a;
    forged_high.handle ^= 0xffff_0000_0000_0000;
    let mut forged_low = a;
    forged_low.handle = a.handle.wrapping_add(0x1000);
    let mut other_id = a;
    other_id.object_id = a.object_id.wrapping_add(0x10_0000);
    let never = MemplugObjectRef {
        object_id: crate::raw::next_object_id(),
        addr: 0x1000,
        size: 64,
        handle: 0x7ead_beef,
        ..a
    };
    for (what, o) in [
        ("a handle with its high bits flipped", forged_high),
        ("a handle + 0x1000", forged_low),
        ("the right handle with another object id", other_id),
        ("a reference never issued", never),
    ] {
        expect(
            m.deallocate(&ctx.log, &o),
            &[MEMPLUG_STATUS_UNKNOWN_ALLOCATION],
            &format!("deallocate of {what}"),
        )?;
        expect_live(m, live, &format!("after the refused deallocate of {what}"))?;
    }
    expect(s.free(&a), &[MEMPLUG_STATUS_OK], "deallocate of the real allocation afterwards")?;
    Ok("forged, altered and never-issued references refused".into())
}

fn double_free(ctx: &Ctx, m: &Mech) -> Checked {
    let mut s = Scope::new(ctx, m);
    let a = s.alloc_ok(64, m.props.min_alignment)?;
    expect(s.free(&a), &[MEMPLUG_STATUS_OK], "first deallocate")?;
    let live = m.live();
    expect(
        m.deallocate(&ctx.log, &a),
        &[MEMPLUG_STATUS_UNKNOWN_ALLOCATION],
        "second deallocate of the same allocation",
    )?;
    expect_live(m, live, "after the refused second deallocate")?;
    Ok("second free refused".into())
}

fn reservation_identity(ctx: &Ctx, m: &Mech) -> Checked {
    if m.vb.is_none() {
        skip!("no virtual_backing capability (flag clear, pointer NULL)");
    }
    let g = m.props.granularity;
    let mut s = Scope::new(ctx, m);
    let r = s.reserve_ok(4 * g)?;
    let a = s.alloc_ok(64, m.props.min_alignment)?;
    let mut foreign = r;
    foreign.mechanism_id = m.id ^ (1 << 63);
    expect(
        m.commit(&ctx.log, &foreign, 0, g),
        &[MEMPLUG_STATUS_WRONG_MECHANISM],
        "commit on a reservation naming another mechanism",
    )?;
    let mut other_device = r;
    other_device.device.ordinal = other_device.device.ordinal.wrapping_add(1);
    expect(
        m.commit(&ctx.log, &other_device, 0, g),
        &[MEMPLUG_STATUS_WRONG_DEVICE],
        "commit on a reservation naming another device",
    )?;
    let mut forged = r;
    forged.handle ^= 0xffff_0000_0000_0000;
    expect(
        m.commit(&ctx.log, &forged, 0, g),
        &[MEMPLUG_STATUS_UNKNOWN_ALLOCATION],
        "commit on a forged reservation",
    )?;
    expect(
        m.committed(&ctx.log, &forged).0,
        &[MEMPLUG_STATUS_UNKNOWN_ALLOCATION],
        "committed_bytes of a forged reservation",
    )?;
    expect(
        m.release_reservation(&ctx.log, &forged),
        &[MEMPLUG_STATUS_UNKNOWN_ALLOCATION],
        "release of a forged reservation",
    )?;
    expect(
        m.commit(&ctx.log, &a, 0, g),
        &[MEMPLUG_STATUS_UNKNOWN_ALLOCATION],
        "commit on an allocation passed as a reservation",
    )?;
    let (st, n) = m.committed(&ctx.log, &r);
    expect(st, &[MEMPLUG_STATUS_OK], "committed_bytes")?;
    ensure!(n == 0, "committed_bytes reports {n} bytes though every commit was refused");
    expect(s.release_reservation(&r), &[MEMPLUG_STATUS_OK], "release")?;
    expect(
        m.release_reservation(&ctx.log, &r),
        &[MEMPLUG_STATUS_UNKNOWN_ALLOCATION],
        "second release of the same reservation",
    )?;
    expect(
        m.commit(&ctx.log, &r, 0, g),
        &[MEMPLUG_STATUS_UNKNOWN_ALLOCATION],
        "commit on a released reservation",
    )?;
    Ok("foreign, other-device, forged, wrong-kind and released references refused".into())
}

/// `lifecycle.live_objects`: every kind of object counts exactly one.
pub(crate) fn live_objects(ctx: &Ctx, m: &Mech) -> Checked {
    let mut s = Scope::new(ctx, m);
    let base = m.live();
    let mut counted = vec!["allocations"];
    let a: Vec<MemplugObjectRef> =
        (0..3).map(|_| s.alloc_ok(64, m.props.min_alignment)).collect::<Result<_, _>>()?;
    expect_live(m, base + 3, "with 3 allocations")?;
    let mut n = 3;
    if m.vb.is_some() {
        s.reserve_ok(m.props.granularity)?;
        n += 1;
        expect_live(m, base + n, "with a reservation more")?;
        counted.push("reservations");
    }
    if m.sm.is_some() {
        s.create_ok(m.props.granularity)?;
        n += 1;
        expect_live(m, base + n, "with a physical object more")?;
        counted.push("physical objects");
    }
    if m.sync.is_some() {
        let st = s.stream_ok()?;
        n += 1;
        expect_live(m, base + n, "with a stream more")?;
        let f = s.fence_ok(st)?;
        n += 1;
        expect_live(m, base + n, "with a fence more")?;
        expect(s.fence_destroy(f), &[MEMPLUG_STATUS_OK], "fence_destroy")?;
        expect(s.stream_destroy(st), &[MEMPLUG_STATUS_OK], "stream_destroy")?;
        n -= 2;
        expect_live(m, base + n, "after destroying the fence and the stream")?;
        counted.push("streams");
        counted.push("fences");
    }
    for o in &a {
        let st = s.free(o);
        if st != MEMPLUG_STATUS_OK {
            fail!("deallocate: {}", status_name(st));
        }
    }
    drop(s);
    expect_live(m, base, "after releasing everything")?;
    Ok(format!("counted exactly: {}", counted.join(", ")))
}

/// The most bytes a block may say it has for a request of `request`
/// bytes: the request rounded up to the largest of the granularity,
/// `max_alignment` and 4096, plus the larger of the granularity and 2 MiB
/// (room for a size class or a huge page, never orders of magnitude).
/// Saturates instead of overflowing.
pub(crate) fn size_bound(m: &Mech, request: u64) -> u64 {
    let unit = m.props.granularity.max(m.props.max_alignment).max(4096);
    let slack = m.props.granularity.max(2 << 20);
    request.checked_next_multiple_of(unit).and_then(|r| r.checked_add(slack)).unwrap_or(u64::MAX)
}

/// `allocator.block_size_sane`.
fn block_size_sane(ctx: &Ctx, m: &Mech) -> Checked {
    const ASK: u64 = 4096;
    let mut s = Scope::new(ctx, m);
    let bound = size_bound(m, ASK);
    let sane = |what: &str, made: &crate::raw::Made| -> Result<u64, super::Verdict> {
        expect(made.status, &[MEMPLUG_STATUS_OK], &format!("{what}({ASK})"))?;
        let got = made.block.size;
        ensure!(got >= ASK, "{what}({ASK}) reported {got} bytes, fewer than asked");
        ensure!(
            got <= bound,
            "{what}({ASK}) reported {got} bytes ({got:#x}), more than the bound {bound} = round_up({ASK}, \
             max(granularity {}, max_alignment {}, 4096)) + max(granularity, 2 MiB): a block must not claim \
             memory it does not have",
            m.props.granularity,
            m.props.max_alignment
        );
        Ok(got)
    };
    let mut seen =
        vec![format!("allocate {}", sane("allocate", &s.allocate(&request(m, ASK, m.props.min_alignment)))?)];
    if m.vb.is_some() {
        let made = s.reserve(ASK);
        seen.push(format!("reserve {}", sane("reserve", &made)?));
    }
    if m.sm.is_some() {
        let made = s.create(ASK);
        seen.push(format!("create {}", sane("create", &made)?));
    }
    Ok(format!(
        "{ASK}-byte requests reported ({}) within [{ASK}, {bound}], bound = round_up(request, \
         max(granularity, max_alignment, 4096)) + max(granularity, 2 MiB)",
        seen.join(", ")
    ))
}

/// Sizes of the `identity.no_overlap` allocations, cycled.
const MIXED_SIZES: [u64; 8] = [16, 4096, 100, 65536, 24, 1 << 20, 3000, 512];

/// `identity.no_overlap`: the address ranges are compared as numbers
/// first; only once they are proved disjoint (and mapped read-write) does
/// the kit write to them.
fn no_overlap(ctx: &Ctx, m: &Mech, st: &MechState) -> Checked {
    let mut s = Scope::new(ctx, m);
    // (start, bytes counted, what)
    let mut ranges: Vec<(u64, u64, String)> = Vec::new();
    // The bytes a range covers: what the block reports when that is sane
    // (allocator.block_size_sane judges the rest), else what was asked.
    let counted =
        |asked: u64, got: u64| if got >= asked && got <= size_bound(m, asked) { got } else { asked };
    let mut allocations = Vec::new();
    for i in 0..64 {
        let size = MIXED_SIZES[i % MIXED_SIZES.len()];
        let made = s.allocate(&request(m, size, m.props.min_alignment));
        expect(made.status, &[MEMPLUG_STATUS_OK], &format!("allocate #{i} ({size} bytes, with {i} live)"))?;
        ensure!(made.block.addr != 0, "allocate #{i} ({size} bytes) returned OK with address 0");
        ranges.push((
            made.block.addr,
            counted(size, made.block.size),
            format!("allocation #{i} ({size} bytes)"),
        ));
        allocations.push((made.block.addr, size));
    }
    let mut reserved = 0;
    if m.vb.is_some() {
        let g = m.props.granularity;
        for (i, n) in [1u64, 2, 4, 8].into_iter().enumerate() {
            let made = s.reserve(n * g);
            expect(made.status, &[MEMPLUG_STATUS_OK], &format!("reserve #{i} ({n} granules)"))?;
            ensure!(made.block.addr != 0, "reserve #{i} returned OK with address 0");
            ranges.push((
                made.block.addr,
                counted(n * g, made.block.size),
                format!("reservation #{i} ({n}g)"),
            ));
            reserved += 1;
        }
    }
    ranges.sort_by_key(|r| r.0);
    for w in ranges.windows(2) {
        let ((a, alen, awhat), (b, blen, bwhat)) = (&w[0], &w[1]);
        if a.saturating_add(*alen) > *b {
            let same = if a == b { " (one address handed out twice)" } else { "" };
            fail!("{awhat} at [{a:#x}, +{alen}) and {bwhat} at [{b:#x}, +{blen}) overlap{same}, both live");
        }
    }
    let mut detail = format!(
        "{} allocations and {reserved} reservations live at once, pairwise disjoint",
        allocations.len()
    );
    if m.is_cpu() && st.touch_ok {
        // Disjoint as numbers; now as memory: a tag at each end of every
        // block, all written before any is read back.
        for (i, &(addr, size)) in allocations.iter().enumerate() {
            ensure!(writable(addr, size), "allocation #{i} [{addr:#x}, +{size}) is not mapped read-write");
        }
        let tag =
            |i: usize, end: bool| (i as u8).wrapping_mul(2).wrapping_add(u8::from(end)).wrapping_add(0x31);
        // SAFETY: each range is a live allocation of the kit, mapped
        // read-write (checked above), disjoint from every other (checked
        // above).
        unsafe {
            for (i, &(addr, size)) in allocations.iter().enumerate() {
                (addr as *mut u8).write_volatile(tag(i, false));
                ((addr + size - 1) as *mut u8).write_volatile(tag(i, true));
            }
            for (i, &(addr, size)) in allocations.iter().enumerate() {
                let (first, last) =
                    ((addr as *const u8).read_volatile(), ((addr + size - 1) as *const u8).read_volatile());
                ensure!(
                    first == tag(i, false) && last == tag(i, true),
                    "allocation #{i} at {addr:#x} does not keep what was written to it while the other blocks \
                     were written: two addresses show the same memory"
                );
            }
        }
        detail += "; each keeps its own contents";
    }
    Ok(detail)
}
