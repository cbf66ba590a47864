//! ABI 1.2's memory descriptor and device identity, and what they claim:
//! `descriptor.memory_descriptor`, `descriptor.identity` and
//! `descriptor.page_size_requests` (what is published is well-formed, and
//! requests are judged by it), then `claims.*` (an attribute claimed is an
//! attribute delivered, as far as the host can see: read-only views fault,
//! new memory reads zero, the page size claimed backs the memory).
//!
//! Memory is touched only on host-visible mechanisms (a CPU device, or
//! `MEMPLUG_ATTR_HOST_VISIBLE` claimed) and only after `/proc/self/maps`
//! says the range is mapped; the write through a read-only view runs in a
//! forked child.

use super::{ensure, expect, expect_live, fail, skip, Checked, Ctx, Results, Scope, Verdict};
use crate::os::{self, in_child, protection, ChildEnd};
use crate::raw::{request_1_2, DescriptorSeen, Mech};
use memplug_sdk::abi::*;
use memplug_sdk::prefix;
use std::time::Duration;

const RW: u32 = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;

/// Every `MEMPLUG_ATTR_*` bit ABI 1.2 defines.
const KNOWN_ATTRIBUTES: u32 = (MEMPLUG_ATTR_ZERO_FILLED << 1) - 1;
/// The descriptor kinds of handle.
pub(crate) use memplug_sdk::descriptor::FD_KINDS as FD_HANDLES;
/// Every `MEMPLUG_HANDLE_*` bit ABI 1.2 defines.
pub(crate) use memplug_sdk::descriptor::HANDLE_KINDS as KNOWN_HANDLES;
/// Every `MEMPLUG_IDENTITY_*` bit ABI 1.2 defines.
use memplug_sdk::descriptor::IDENTITY_BITS as KNOWN_IDENTITY;

/// Page sizes a non-CPU device may plausibly claim: 1 KiB to 1 TiB.
const PAGE_BITS: core::ops::RangeInclusive<u32> = 10..=40;
/// Largest page `claims.page_size_used` commits (two of them).
const PAGE_TRIED_MAX: u64 = 64 << 20;

pub(crate) fn run_descriptor(res: &mut Results, ctx: &Ctx, m: &Mech) {
    let name = Some(m.name.as_str());
    res.run("descriptor.memory_descriptor", name, || memory_descriptor(m));
    res.run("descriptor.identity", name, || identity(m));
    res.run("descriptor.identity_stable", name, || super::identity_stable::identity_stable(ctx, m));
    res.run("descriptor.page_size_requests", name, || page_size_requests(ctx, m));
}

pub(crate) fn run_claims(res: &mut Results, ctx: &Ctx, m: &Mech) {
    let name = Some(m.name.as_str());
    res.run("claims.read_only_enforced", name, || read_only_enforced(ctx, m));
    res.run("claims.zero_filled", name, || zero_filled(ctx, m));
    res.run("claims.page_size_used", name, || page_size_used(ctx, m));
    res.run("claims.placement_used", name, || placement_used(ctx, m));
    res.run("claims.pinned_locked", name, || super::claims_pinned::pinned_locked(ctx, m));
}

/// Skips below 1.2: nothing of the descriptor exists there.
pub(crate) fn needs_1_2(m: &Mech, what: &str) -> Result<(), Verdict> {
    if m.agreed_minor < 2 {
        skip!(
            "the plugin agreed on ABI 1.{}: {what} is ABI 1.2's (nothing of it exists below)",
            m.agreed_minor
        );
    }
    Ok(())
}

/// The descriptor's claims, or a skip when none was read (below 1.2, or
/// left unwritten: `descriptor.memory_descriptor` fails for that).
pub(crate) fn claimed(m: &Mech) -> Result<&MemplugProperties, Verdict> {
    needs_1_2(m, "the memory descriptor")?;
    if m.descriptor == DescriptorSeen::Unwritten {
        skip!(
            "properties left the memory descriptor unwritten (descriptor.memory_descriptor fails for it), so \
             nothing is claimed"
        );
    }
    Ok(&m.props)
}

/// `MEMPLUG_ATTR_*` names.
fn attribute_names(bits: u32) -> String {
    let names = [
        (MEMPLUG_ATTR_DEVICE_LOCAL, "DEVICE_LOCAL"),
        (MEMPLUG_ATTR_HOST_VISIBLE, "HOST_VISIBLE"),
        (MEMPLUG_ATTR_HOST_COHERENT, "HOST_COHERENT"),
        (MEMPLUG_ATTR_PINNED, "PINNED"),
        (MEMPLUG_ATTR_COMPRESSED, "COMPRESSED"),
        (MEMPLUG_ATTR_RDMA, "RDMA"),
        (MEMPLUG_ATTR_READ_ONLY_ENFORCED, "READ_ONLY_ENFORCED"),
        (MEMPLUG_ATTR_ZERO_FILLED, "ZERO_FILLED"),
    ];
    bit_names(bits, &names)
}

/// `MEMPLUG_HANDLE_*` names.
pub(crate) fn handle_names(bits: u32) -> String {
    let names = [
        (MEMPLUG_HANDLE_OPAQUE_FD, "OPAQUE_FD"),
        (MEMPLUG_HANDLE_DMABUF_FD, "DMABUF_FD"),
        (MEMPLUG_HANDLE_MEMFD, "MEMFD"),
        (MEMPLUG_HANDLE_WIN32, "WIN32"),
        (MEMPLUG_HANDLE_VENDOR_BLOB, "VENDOR_BLOB"),
    ];
    bit_names(bits, &names)
}

fn bit_names(bits: u32, names: &[(u32, &str)]) -> String {
    let mut v: Vec<String> =
        names.iter().filter(|(b, _)| bits & b != 0).map(|(_, n)| n.to_string()).collect();
    let known: u32 = names.iter().map(|(b, _)| b).fold(0, |a, b| a | b);
    if bits & !known != 0 {
        v.push(format!("{:#x}", bits & !known));
    }
    if v.is_empty() {
        "none".into()
    } else {
        v.join("|")
    }
}

/// `4 KiB`, `2 MiB`, `1 GiB`.
pub(crate) fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} bytes"),
    }
}

/// The page sizes `page_sizes` lists, smallest first.
fn page_list(page_sizes: u64) -> Vec<u64> {
    (0..64).filter(|k| page_sizes & (1 << k) != 0).map(|k| 1u64 << k).collect()
}

fn location_name(kind: u32, id: u32) -> String {
    match kind {
        MEMPLUG_LOCATION_ANY => "not said".into(),
        MEMPLUG_LOCATION_DEVICE => "on the device".into(),
        MEMPLUG_LOCATION_HOST => "host memory".into(),
        MEMPLUG_LOCATION_NUMA_NODE => format!("NUMA node {id}"),
        MEMPLUG_LOCATION_TIER => format!("tier {id}"),
        k => format!("vendor location {k:#x} ({id})"),
    }
}

/// Unknown bits of a field: a failure, unless the plugin speaks a minor
/// newer than the kit's (then a note).
fn unknown_bits(m: &Mech, field: &str, bits: u32, notes: &mut Vec<String>) -> Result<(), Verdict> {
    if bits == 0 {
        return Ok(());
    }
    if m.newer_than_kit() {
        notes.push(format!("{field} bits {bits:#x} of a minor newer than this kit's (not judged)"));
        return Ok(());
    }
    fail!(
        "{field} sets bits {bits:#x}, which no minor up to the plugin's newest (1.{}) defines",
        m.plugin_max_minor
    )
}

/// `descriptor.memory_descriptor`.
fn memory_descriptor(m: &Mech) -> Checked {
    needs_1_2(m, "the memory descriptor")?;
    ensure!(
        m.descriptor == DescriptorSeen::Written,
        "agreed on ABI 1.2, but properties wrote nothing past the 1.0 prefix of the {MEMPLUG_PROPERTIES_SIZE_1_2}-byte \
         struct (the memory descriptor's bytes stayed as the kit filled them): a 1.2 plugin writes every field \
         it knows, zero for what it does not say"
    );
    let p = &m.props;
    let mut notes = Vec::new();
    let g = p.granularity;
    let r = p.recommended_granularity;
    if r != 0 {
        ensure!(
            g != 0,
            "recommended_granularity is {r:#x} but the granularity is 0 (the mechanism has no virtual ranges or \
             physical objects it could apply to)"
        );
        ensure!(
            r.is_power_of_two() && r % g == 0,
            "recommended_granularity {r:#x} is not zero or a power-of-two multiple of the granularity {g:#x}"
        );
    }
    let pages = page_list(p.page_sizes);
    if m.is_cpu() {
        let offered = os::kernel_page_sizes();
        let foreign: Vec<String> = pages.iter().filter(|s| !offered.contains(s)).map(|s| bytes(*s)).collect();
        ensure!(
            foreign.is_empty(),
            "page_sizes lists {} for a CPU device, but this kernel backs memory only with {}",
            foreign.join(", "),
            offered.iter().map(|s| bytes(*s)).collect::<Vec<_>>().join(", ")
        );
    } else {
        let odd: Vec<String> =
            pages.iter().filter(|s| !PAGE_BITS.contains(&s.trailing_zeros())).map(|s| bytes(*s)).collect();
        ensure!(
            odd.is_empty(),
            "page_sizes lists implausible pages: {} (1 KiB to 1 TiB expected)",
            odd.join(", ")
        );
    }
    let granular = m.caps & (MEMPLUG_CAP_VIRTUAL_BACKING | MEMPLUG_CAP_SHARED_MAPPING) != 0;
    if let (Some(&smallest), true) = (pages.first(), granular) {
        ensure!(
            smallest <= g,
            "the smallest page size listed, {}, is larger than the granularity {}: ranges and objects of one \
             granule cannot be backed by any page it lists",
            bytes(smallest),
            bytes(g)
        );
    }
    unknown_bits(m, "attributes", p.attributes & !KNOWN_ATTRIBUTES, &mut notes)?;
    let host_visible = m.is_cpu() || p.attributes & MEMPLUG_ATTR_HOST_VISIBLE != 0;
    ensure!(
        p.attributes & MEMPLUG_ATTR_HOST_COHERENT == 0 || host_visible,
        "attributes claim HOST_COHERENT without HOST_VISIBLE on a {} device: memory the host cannot see cannot be \
         coherent with it",
        super::descriptor::device_string(m.device)
    );
    unknown_bits(m, "export_types", p.export_types & !KNOWN_HANDLES, &mut notes)?;
    let kinds = p.export_types & KNOWN_HANDLES;
    if m.sm.is_none() {
        ensure!(
            kinds == 0,
            "export_types offers {} but the mechanism has no shared mapping (no physical object to export)",
            handle_names(kinds)
        );
    } else {
        let typed = m.caps & MEMPLUG_CAP_TYPED_EXPORT != 0;
        let fd_export = m.caps & MEMPLUG_CAP_SHARED_EXPORT != 0;
        ensure!(
            !typed || kinds != 0,
            "MEMPLUG_CAP_TYPED_EXPORT is set but export_types offers no kind of handle: export_handle has \
             nothing it may export"
        );
        ensure!(
            !fd_export || kinds & FD_HANDLES != 0,
            "MEMPLUG_CAP_SHARED_EXPORT is set but export_types names no descriptor kind (OPAQUE_FD, DMABUF_FD or \
             MEMFD): it says which kind export_fd returns"
        );
        ensure!(
            kinds == 0 || typed || fd_export,
            "export_types offers {} but the mechanism publishes neither export_fd nor export_handle",
            handle_names(kinds)
        );
    }
    let (kind, id) = (p.location_kind, p.location_id);
    let known_location = kind <= MEMPLUG_LOCATION_TIER;
    let vendor_location = (MEMPLUG_DEVICE_VENDOR_FIRST..=MEMPLUG_DEVICE_VENDOR_LAST).contains(&kind);
    if !known_location && !vendor_location {
        if m.newer_than_kit() {
            notes.push(format!("location_kind {kind} of a minor newer than this kit's (not judged)"));
        } else {
            fail!(
                "location_kind {kind} is none ABI 1.2 defines (MEMPLUG_LOCATION_ANY..=MEMPLUG_LOCATION_TIER) nor a \
                 vendor's ({MEMPLUG_DEVICE_VENDOR_FIRST:#x}..={MEMPLUG_DEVICE_VENDOR_LAST:#x})"
            );
        }
    }
    if matches!(kind, MEMPLUG_LOCATION_ANY | MEMPLUG_LOCATION_DEVICE | MEMPLUG_LOCATION_HOST) {
        ensure!(id == 0, "location_id is {id} for location kind {kind}, which names no node or tier (zero)");
    }
    if kind == MEMPLUG_LOCATION_NUMA_NODE && host_visible {
        ensure!(
            os::numa_node_exists(id) != Some(false),
            "the location is NUMA node {id}, which this machine does not have (/sys/devices/system/node)"
        );
    }
    unknown_bits(m, "flags", p.flags & !MEMPLUG_PROP_MAPS_AT_OFFSETS, &mut notes)?;
    ensure!(p.reserved1 == 0, "reserved1 is {:#x}, not zero", p.reserved1);
    let listed = if pages.is_empty() {
        "not said".to_string()
    } else {
        pages.iter().map(|s| bytes(*s)).collect::<Vec<_>>().join(", ")
    };
    let rec = if r == 0 { "the granularity".to_string() } else { bytes(r) };
    let mut d = format!(
        "recommended granularity {rec}; page sizes {listed}; attributes {}; export kinds {}; location {}; {}",
        attribute_names(p.attributes),
        handle_names(p.export_types),
        location_name(kind, id),
        if p.flags & MEMPLUG_PROP_MAPS_AT_OFFSETS != 0 { "maps at offsets" } else { "maps objects whole" }
    );
    if !notes.is_empty() {
        d += &format!("; note: {}", notes.join("; "));
    }
    Ok(d)
}

/// `descriptor.identity`.
fn identity(m: &Mech) -> Checked {
    needs_1_2(m, "the device identity")?;
    if m.identity.is_null() {
        skip!(
            "the mechanism publishes no identity (NULL, or a descriptor shorter than {MEMPLUG_MECHANISM_SIZE_1_2} \
             bytes): nothing more than its kind and ordinal is known (an explicit absence)"
        );
    }
    let at = m.identity as usize;
    ensure!(
        at >= 4096 && at % core::mem::align_of::<MemplugDeviceIdentity>() == 0,
        "the identity pointer {at:#x} cannot point at an identity"
    );
    // SAFETY: plugin-owned, immutable, at least struct_size bytes.
    let (id, declared) =
        unsafe { prefix::read_with_size(m.identity) }.map_err(|e| Verdict::Fail(format!("{e:?}")))?;
    ensure!(
        declared >= MEMPLUG_DEVICE_IDENTITY_SIZE_1_2,
        "the identity's struct_size {declared} is shorter than ABI 1.2's {MEMPLUG_DEVICE_IDENTITY_SIZE_1_2}"
    );
    let mut notes = Vec::new();
    unknown_bits(m, "the identity's valid", id.valid & !KNOWN_IDENTITY, &mut notes)?;
    let has = |bit: u32| id.valid & bit != 0;
    let mut said = Vec::new();
    if has(MEMPLUG_IDENTITY_UUID) {
        ensure!(
            id.uuid != [0; 16],
            "MEMPLUG_IDENTITY_UUID is valid but the UUID is all zeros (the nil UUID names no device)"
        );
        said.push(format!("UUID {}", id.uuid.iter().map(|b| format!("{b:02x}")).collect::<String>()));
    } else {
        ensure!(
            id.uuid == [0; 16],
            "the UUID is set but MEMPLUG_IDENTITY_UUID is not valid (fields not named in valid are zero)"
        );
    }
    let pci = [id.pci_domain, id.pci_bus, id.pci_device, id.pci_function];
    if has(MEMPLUG_IDENTITY_PCI) {
        ensure!(
            id.pci_bus <= 0xff && id.pci_device <= 0x1f && id.pci_function <= 7,
            "the PCI address {:04x}:{:02x}:{:02x}.{} is out of range (bus <= 0xff, device <= 0x1f, function <= 7)",
            id.pci_domain,
            id.pci_bus,
            id.pci_device,
            id.pci_function
        );
        let name =
            format!("{:04x}:{:02x}:{:02x}.{}", id.pci_domain, id.pci_bus, id.pci_device, id.pci_function);
        let sys = std::path::Path::new("/sys/bus/pci/devices");
        if sys.is_dir() && !sys.join(&name).exists() {
            notes.push(format!("no PCI function {name} is visible in /sys/bus/pci/devices here"));
        }
        said.push(format!("PCI {name}"));
    } else {
        ensure!(
            pci == [0; 4],
            "PCI fields are set but MEMPLUG_IDENTITY_PCI is not valid (fields not named in valid are zero)"
        );
    }
    if has(MEMPLUG_IDENTITY_SUB_DEVICE) {
        said.push(format!("sub-device {}", id.sub_device));
    } else {
        ensure!(
            id.sub_device == 0,
            "sub_device is {} but MEMPLUG_IDENTITY_SUB_DEVICE is not valid (fields not named in valid are zero)",
            id.sub_device
        );
    }
    if has(MEMPLUG_IDENTITY_NUMA_NODE) {
        ensure!(
            os::numa_node_exists(id.numa_node) != Some(false),
            "the identity names NUMA node {}, which this machine does not have (/sys/devices/system/node)",
            id.numa_node
        );
        if m.is_cpu() {
            ensure!(
                id.numa_node == m.device.ordinal,
                "the identity names NUMA node {} for device cpu:{}: a CPU device's ordinal is its NUMA node",
                id.numa_node,
                m.device.ordinal
            );
        }
        said.push(format!("NUMA node {}", id.numa_node));
    } else {
        ensure!(
            id.numa_node == 0,
            "numa_node is {} but MEMPLUG_IDENTITY_NUMA_NODE is not valid (fields not named in valid are zero)",
            id.numa_node
        );
    }
    let said = if said.is_empty() { "nothing valid".to_string() } else { said.join(", ") };
    let mut d = format!("{declared}-byte identity: {said}");
    if !notes.is_empty() {
        d += &format!("; note: {}", notes.join("; "));
    }
    Ok(d)
}

/// A page size the mechanism does not publish (a power of two from 4 KiB).
fn unpublished_page(page_sizes: u64) -> Option<u64> {
    (12..=40).map(|k| 1u64 << k).find(|p| page_sizes & p == 0)
}

/// `descriptor.page_size_requests`.
fn page_size_requests(ctx: &Ctx, m: &Mech) -> Checked {
    needs_1_2(m, "a request's page size")?;
    let pages = m.props.page_sizes;
    let Some(bad) = unpublished_page(pages) else {
        skip!("page_sizes lists every power of two from 4 KiB to 1 TiB: no unpublished page size to ask for");
    };
    let g = m.props.granularity.max(1);
    let mut s = Scope::new(ctx, m);
    let live = m.live();
    let mut slots = vec!["allocate"];
    if m.vb.is_some() {
        slots.push("reserve");
    }
    if m.sm.is_some() {
        slots.push("create");
    }
    let make = |s: &mut Scope, slot: &str, page: u64, size: u64| {
        let req = MemplugRequest {
            page_size: page,
            ..request_1_2(m, size, if slot == "allocate" { m.props.min_alignment.max(1) } else { g })
        };
        match slot {
            "allocate" => s.allocate(&req),
            "reserve" => s.reserve_req(&req),
            _ => s.create_req(&req),
        }
    };
    for slot in &slots {
        for (what, page) in [
            (format!("{} (not published)", bytes(bad)), bad),
            ("3 * 4 KiB (no power of two)".into(), 3 << 12),
        ] {
            let made = make(&mut s, slot, page, g.max(4096));
            expect(
                made.status,
                &[MEMPLUG_STATUS_INVALID_ARGUMENT],
                &format!("{slot} with page_size {what}"),
            )?;
            expect_live(m, live, &format!("after the refused {slot} with page_size {what}"))?;
        }
    }
    let mut served = String::new();
    if let Some(&smallest) = page_list(pages).first() {
        for slot in &slots {
            let size = smallest.max(g);
            let made = make(&mut s, slot, smallest, size);
            expect(
                made.status,
                &[MEMPLUG_STATUS_OK],
                &format!(
                    "{slot} of {} with page_size {}, which page_sizes lists",
                    bytes(size),
                    bytes(smallest)
                ),
            )?;
        }
        served = format!("; page_size {} (listed) served by {}", bytes(smallest), slots.join(", "));
    }
    Ok(format!(
        "page_size {} (not published) and 3 * 4 KiB refused with INVALID_ARGUMENT by {}{served}",
        bytes(bad),
        slots.join(", ")
    ))
}

/// Skips unless the host can see the mechanism's memory.
pub(super) fn host_visible(m: &Mech, claim: &str) -> Result<(), Verdict> {
    if !m.is_cpu() && m.props.attributes & MEMPLUG_ATTR_HOST_VISIBLE == 0 {
        skip!(
            "{claim} is claimed, but device {} is not host-visible (no MEMPLUG_ATTR_HOST_VISIBLE): the host cannot \
             look at its memory to check it",
            super::descriptor::device_string(m.device)
        );
    }
    Ok(())
}

fn byte(addr: u64) -> u8 {
    // SAFETY: callers check the range is mapped readable first.
    unsafe { (addr as *const u8).read_volatile() }
}

/// `claims.read_only_enforced`.
fn read_only_enforced(ctx: &Ctx, m: &Mech) -> Checked {
    let p = claimed(m)?;
    if p.attributes & MEMPLUG_ATTR_READ_ONLY_ENFORCED == 0 {
        skip!("the mechanism does not claim MEMPLUG_ATTR_READ_ONLY_ENFORCED");
    }
    host_visible(m, "MEMPLUG_ATTR_READ_ONLY_ENFORCED")?;
    if m.sm.is_none() || m.vb.is_none() {
        skip!(
            "MEMPLUG_ATTR_READ_ONLY_ENFORCED is claimed, but a read-only view needs shared mapping and virtual \
             backing, which the mechanism lacks: no read-only view can be made"
        );
    }
    let g = p.granularity;
    let mut s = Scope::new(ctx, m);
    let o = s.create_ok(2 * g)?;
    let rw = s.reserve_ok(2 * g)?;
    let ro = s.reserve_ok(2 * g)?;
    expect(s.map(&o, 0, &rw, 0, 2 * g, RW), &[MEMPLUG_STATUS_OK], "map read-write")?;
    expect(s.map(&o, 0, &ro, 0, 2 * g, MEMPLUG_ACCESS_READ), &[MEMPLUG_STATUS_OK], "map read-only")?;
    let Some(prot) = protection(ro.addr, 2 * g) else {
        if m.is_cpu() {
            fail!("the read-only view [{:#x}, +{}) is not mapped in this process", ro.addr, 2 * g);
        }
        skip!(
            "the read-only view at {:#x} is not mapped in this process: the host sees it by other means",
            ro.addr
        );
    };
    ensure!(prot.read, "the read-only view is mapped without read access ({prot:?})");
    ensure!(
        os::writable(rw.addr, 2 * g),
        "the read-write view [{:#x}, +{}) is not mapped read-write",
        rw.addr,
        2 * g
    );
    // SAFETY: mapped read-write (checked above).
    unsafe { ((rw.addr + g) as *mut u8).write_volatile(0x3c) };
    ensure!(byte(ro.addr + g) == 0x3c, "the read-only view does not show the object's bytes");
    if prot.write {
        fail!(
            "MEMPLUG_ATTR_READ_ONLY_ENFORCED is claimed, but the read-only view [{:#x}, +{}) is mapped writable \
             (/proc/self/maps): a write through it is not refused",
            ro.addr,
            2 * g
        );
    }
    let target = ro.addr + g;
    let end = in_child(Duration::from_secs(5), move || {
        // SAFETY: deliberately a write to a read-only view, in a child
        // that is expected to die of it.
        unsafe { (target as *mut u8).write_volatile(0x77) };
        0
    });
    let reached = byte(ro.addr + g) == 0x77;
    match end {
        ChildEnd::Signaled(sig) if sig == libc::SIGSEGV || sig == libc::SIGBUS => {
            ensure!(!reached, "the write through the read-only view faulted, yet the object's byte changed");
            Ok(format!(
                "a write through a read-only view of a physical object killed the child with {}; the object was \
                 not changed",
                os::signal_name(sig)
            ))
        }
        ChildEnd::Exited(0) => fail!(
            "MEMPLUG_ATTR_READ_ONLY_ENFORCED is claimed, but a write through a read-only view succeeded{}",
            if reached { " and changed the object (seen through the read-write view)" } else { "" }
        ),
        other => fail!("the child writing through the read-only view {}", other.describe()),
    }
}

/// The first non-zero byte of `[addr, addr + len)`, which is mapped
/// readable.
fn first_non_zero(addr: u64, len: u64) -> Option<(u64, u8)> {
    (0..len).map(|i| (i, byte(addr + i))).find(|&(_, b)| b != 0)
}

/// Fills `[addr, addr + len)`, mapped read-write, with `b`.
fn fill(addr: u64, len: u64, b: u8) {
    // SAFETY: callers check the range is mapped read-write first.
    unsafe { core::ptr::write_bytes(addr as *mut u8, b, len as usize) };
}

/// Fails unless `[addr, addr + len)` (new memory, `what`) is mapped and
/// reads zero; skips when a device other than the CPU does not map it into
/// the process (the host sees it by other means).
fn zeros(m: &Mech, addr: u64, len: u64, what: &str) -> Result<(), Verdict> {
    if !os::readable(addr, len) {
        if !m.is_cpu() {
            skip!(
                "{what} [{addr:#x}, +{len}) is not mapped in this process: the host sees it by other means"
            );
        }
        fail!("{what} [{addr:#x}, +{len}) is not mapped readable in this process");
    }
    if let Some((at, b)) = first_non_zero(addr, len) {
        fail!(
            "MEMPLUG_ATTR_ZERO_FILLED is claimed, but {what} does not read as zero: byte {at} of its {len} is {b:#04x} \
             (the request did not carry MEMPLUG_HINT_UNINITIALIZED_OK)"
        );
    }
    Ok(())
}

/// `claims.zero_filled`.
fn zero_filled(ctx: &Ctx, m: &Mech) -> Checked {
    let p = claimed(m)?;
    if p.attributes & MEMPLUG_ATTR_ZERO_FILLED == 0 {
        skip!("the mechanism does not claim MEMPLUG_ATTR_ZERO_FILLED");
    }
    host_visible(m, "MEMPLUG_ATTR_ZERO_FILLED")?;
    let mut s = Scope::new(ctx, m);
    let mut shown = Vec::new();
    // Allocations, new and reusing what was freed (dirtied first).
    let align = p.min_alignment.max(1);
    let sizes = [64u64, 4096, 65536 + 8, 1 << 20];
    for round in 0..3 {
        for size in sizes {
            let made = s.allocate(&request_1_2(m, size, align));
            expect(made.status, &[MEMPLUG_STATUS_OK], &format!("allocate({size})"))?;
            let a = made.obj;
            zeros(m, a.addr, size, &format!("a new allocation of {size} bytes (round {})", round + 1))?;
            ensure!(
                os::writable(a.addr, size),
                "the allocation [{:#x}, +{size}) is not mapped read-write",
                a.addr
            );
            fill(a.addr, size, 0xab);
            expect(s.free(&a), &[MEMPLUG_STATUS_OK], "deallocate")?;
        }
    }
    shown.push(format!("3 rounds of allocations of {sizes:?} bytes, each filled with 0xab before its free"));
    let g = p.granularity;
    if m.vb.is_some() {
        let r = s.reserve_ok(4 * g)?;
        expect(m.commit(&ctx.log, &r, 0, 4 * g), &[MEMPLUG_STATUS_OK], "commit [0, 4g)")?;
        zeros(m, r.addr, 4 * g, "a newly committed range")?;
        ensure!(os::writable(r.addr, 4 * g), "the committed range is not mapped read-write");
        fill(r.addr, 4 * g, 0xab);
        expect(m.decommit(&ctx.log, &r, g, 2 * g), &[MEMPLUG_STATUS_OK], "decommit [g, 3g)")?;
        expect(m.commit(&ctx.log, &r, g, 2 * g), &[MEMPLUG_STATUS_OK], "recommit [g, 3g)")?;
        zeros(m, r.addr + g, 2 * g, "a recommitted range (dirtied before its decommit)")?;
        expect(s.release_reservation(&r), &[MEMPLUG_STATUS_OK], "release")?;
        let r = s.reserve_ok(4 * g)?;
        expect(m.commit(&ctx.log, &r, 0, 4 * g), &[MEMPLUG_STATUS_OK], "commit in a new reservation")?;
        zeros(m, r.addr, 4 * g, "a range committed in a new reservation (after a dirtied one was released)")?;
        shown.push("committed, recommitted and newly reserved ranges".into());
    }
    if m.sm.is_some() && m.vb.is_some() {
        for round in 0..2 {
            let o = s.create_ok(2 * g)?;
            let r = s.reserve_ok(2 * g)?;
            expect(s.map(&o, 0, &r, 0, 2 * g, RW), &[MEMPLUG_STATUS_OK], "map a new physical object")?;
            zeros(m, r.addr, 2 * g, &format!("a new physical object (round {})", round + 1))?;
            ensure!(os::writable(r.addr, 2 * g), "the physical object's view is not mapped read-write");
            fill(r.addr, 2 * g, 0xab);
            expect(s.unmap(&r, 0, 2 * g), &[MEMPLUG_STATUS_OK], "unmap")?;
            expect(s.release_object(&o), &[MEMPLUG_STATUS_OK], "release")?;
            expect(s.release_reservation(&r), &[MEMPLUG_STATUS_OK], "release of the reservation")?;
        }
        shown.push("2 physical objects, the first dirtied before its release".into());
    }
    Ok(format!("new memory read zero: {}", shown.join("; ")))
}

/// `claims.page_size_used`.
fn page_size_used(ctx: &Ctx, m: &Mech) -> Checked {
    let p = claimed(m)?;
    let base = os::page_size();
    let larger: Vec<u64> = page_list(p.page_sizes).into_iter().filter(|&s| s > base).collect();
    if larger.is_empty() {
        if p.page_sizes == 0 {
            skip!("page_sizes is zero: the mechanism says nothing of the pages backing its memory");
        }
        skip!(
            "the mechanism claims only the base page ({}): nothing larger to look for",
            page_list(p.page_sizes).iter().map(|s| bytes(*s)).collect::<Vec<_>>().join(", ")
        );
    }
    if !m.is_cpu() {
        skip!(
            "device {}: which pages back its memory is not visible to the host",
            super::descriptor::device_string(m.device)
        );
    }
    if m.vb.is_none() {
        skip!("the check reserves and commits with a page size, and the mechanism has no virtual backing");
    }
    let tried: Vec<u64> = larger.iter().copied().filter(|&s| s <= PAGE_TRIED_MAX).collect();
    if tried.is_empty() {
        skip!(
            "the mechanism claims only pages larger than {} ({}): the kit does not commit two of them",
            bytes(PAGE_TRIED_MAX),
            larger.iter().map(|s| bytes(*s)).collect::<Vec<_>>().join(", ")
        );
    }
    let g = p.granularity.max(1);
    let mut s = Scope::new(ctx, m);
    let mut seen = Vec::new();
    for page in tried {
        let size = (2 * page).div_ceil(g) * g;
        let req = MemplugRequest { page_size: page, ..request_1_2(m, size, g) };
        let made = s.reserve_req(&req);
        expect(
            made.status,
            &[MEMPLUG_STATUS_OK],
            &format!("reserve({}) with page_size {}", bytes(size), bytes(page)),
        )?;
        let r = made.obj;
        expect(m.commit(&ctx.log, &r, 0, r.size), &[MEMPLUG_STATUS_OK], "commit of the whole reservation")?;
        ensure!(
            os::writable(r.addr, r.size),
            "the committed range [{:#x}, +{}) is not mapped read-write",
            r.addr,
            r.size
        );
        for off in (0..r.size).step_by(base as usize) {
            // SAFETY: mapped read-write (checked above).
            unsafe { ((r.addr + off) as *mut u8).write_volatile(1) };
        }
        let Some(b) = os::backing(r.addr, r.size) else {
            skip!("/proc/self/smaps cannot be read here: the pages backing memory are not visible");
        };
        let hugetlb = b.kernel_page_sizes.contains(&page);
        let thp = b.thp_bytes >= page;
        if !hugetlb && !thp {
            fail!(
                "page_sizes claims {} pages, but [{:#x}, +{}) reserved with page_size {} and committed and touched \
                 is backed by kernel pages of {} with {} in transparent huge pages ({} mapping(s); THP: {}): no {} \
                 page backs it",
                bytes(page),
                r.addr,
                r.size,
                bytes(page),
                b.kernel_page_sizes.iter().map(|s| bytes(*s)).collect::<Vec<_>>().join(", "),
                bytes(b.thp_bytes).replace("0 bytes", "0 KiB"),
                b.mappings,
                os::thp_setting(),
                bytes(page)
            );
        }
        seen.push(format!(
            "{}: {}",
            bytes(page),
            if hugetlb {
                "hugetlb pages".to_string()
            } else {
                format!("{} in transparent huge pages", bytes(b.thp_bytes))
            }
        ));
        expect(s.release_reservation(&r), &[MEMPLUG_STATUS_OK], "release")?;
    }
    Ok(format!(
        "reserved, committed and touched with each claimed page size; smaps shows {}",
        seen.join(", ")
    ))
}

/// A claimed NUMA node is where the pages are: every page of an allocation
/// and of a commit, written, lives on that node (`get_mempolicy`).
fn placement_used(ctx: &Ctx, m: &Mech) -> Checked {
    let p = claimed(m)?;
    if p.location_kind != MEMPLUG_LOCATION_NUMA_NODE {
        skip!(
            "the mechanism claims no NUMA node (location {})",
            location_name(p.location_kind, p.location_id)
        );
    }
    host_visible(m, "a NUMA node location")?;
    let node = p.location_id;
    let base = os::page_size();
    let mut s = Scope::new(ctx, m);
    let g = p.granularity.max(base);
    let mut ranges = Vec::new();
    let made = s.allocate(&request_1_2(m, 2 * g, p.min_alignment.max(1)));
    expect(made.status, &[MEMPLUG_STATUS_OK], "allocate(2 granules)")?;
    ranges.push(("an allocation", made.obj));
    if m.vb.is_some() {
        let r = s.reserve_ok(2 * g)?;
        expect(m.commit(&ctx.log, &r, 0, 2 * g), &[MEMPLUG_STATUS_OK], "commit of the whole reservation")?;
        ranges.push(("a commit", r));
    }
    for (what, o) in &ranges {
        ensure!(os::writable(o.addr, o.size), "{what} [{:#x}, +{}) is not mapped read-write", o.addr, o.size);
        for off in (0..o.size).step_by(base as usize) {
            // SAFETY: mapped read-write (checked above).
            unsafe { ((o.addr + off) as *mut u8).write_volatile(1) };
            let on = os::node_of_page(o.addr + off)
                .map_err(|e| Verdict::Skip(format!("{e}: placement cannot be seen")))?;
            ensure!(
                on == node,
                "the location claims NUMA node {node}, but page {off:#x} of {what} [{:#x}, +{}) is on node {on}",
                o.addr,
                o.size
            );
        }
    }
    Ok(format!(
        "every page of {} written is on NUMA node {node}",
        ranges.iter().map(|(w, _)| *w).collect::<Vec<_>>().join(" and of ")
    ))
}
