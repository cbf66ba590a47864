//! `descriptor.*`: what the plugin publishes, read as untrusted prefixes.

use super::{ensure, expect, fail, Checked, Ctx, Results, Verdict};
use crate::raw::{device_kind_name, is_vendor_kind, plugin_string, DescriptorSeen, Mech};
use core::ffi::c_void;
use memplug_sdk::abi::*;
use memplug_sdk::prefix::{self, PrefixError};

mod old_minors;
mod tables;

use old_minors::{minor_0_is_1_0, minor_1_is_1_1};
pub(crate) use tables::{mech_of, read_tables};

/// Most mechanisms the kit reads from one plugin.
const MAX_MECHANISMS: u32 = 4096;

/// The plugin descriptor, validated.
pub(crate) struct PluginView {
    pub name: String,
    pub version: String,
    pub min_minor: u32,
    pub max_minor: u32,
    /// The minor agreed in negotiation.
    pub agreed_minor: u32,
    pub ctx: *mut c_void,
    pub live_objects: unsafe extern "C" fn(*mut c_void) -> u64,
    pub unload: Option<unsafe extern "C" fn(*mut c_void)>,
    pub mechanisms: Vec<*const MemplugMechanism>,
}

impl PluginView {
    pub(crate) fn live(&self) -> u64 {
        // SAFETY: validated non-NULL.
        unsafe { (self.live_objects)(self.ctx) }
    }
}

/// One mechanism descriptor that could be read.
pub(crate) struct Published {
    pub name: String,
    pub desc: MemplugMechanism,
    /// Well-formed and not a duplicate of an earlier one: deeper checks run.
    pub checkable: bool,
}

pub(crate) fn device_string(d: MemplugDevice) -> String {
    match device_kind_name(d.kind) {
        Some(k) => format!("{k}:{}", d.ordinal),
        None if is_vendor_kind(d.kind) => format!("vendor({:#x}):{}", d.kind, d.ordinal),
        None => format!("unknown({}):{}", d.kind, d.ordinal),
    }
}

pub(crate) fn capability_names(caps: u32) -> Vec<&'static str> {
    [
        (MEMPLUG_CAP_ALLOCATOR, "allocator"),
        (MEMPLUG_CAP_VIRTUAL_BACKING, "virtual_backing"),
        (MEMPLUG_CAP_SHARED_MAPPING, "shared_mapping"),
        (MEMPLUG_CAP_SYNC, "sync"),
        (MEMPLUG_CAP_SHARED_EXPORT, "shared_export"),
        (MEMPLUG_CAP_TYPED_EXPORT, "typed_export"),
        (MEMPLUG_CAP_PEER_ACCESS, "peer_access"),
        (MEMPLUG_CAP_QUEUED_BINDING, "queued_binding"),
    ]
    .into_iter()
    .filter(|(bit, _)| caps & bit != 0)
    .map(|(_, n)| n)
    .collect()
}

pub(crate) fn plugin(res: &mut Results, p: &*const MemplugPlugin, agreed_minor: u32) -> Option<PluginView> {
    let mut view = None;
    res.run("descriptor.plugin", None, || {
        // SAFETY: plugin-owned descriptor, at least struct_size bytes.
        let d: MemplugPlugin = match unsafe { prefix::read(*p) } {
            Ok(d) => d,
            Err(PrefixError::Null) => fail!("the descriptor pointer is NULL"),
            Err(PrefixError::Short { declared: n, .. }) => {
                fail!("struct_size {n} is shorter than ABI 1.0's {MEMPLUG_PLUGIN_SIZE_1_0}")
            }
        };
        ensure!(d.abi_major == MEMPLUG_ABI_MAJOR, "abi_major is {}, expected 1", d.abi_major);
        ensure!(d.min_minor <= d.max_minor, "minor range 1.{}..=1.{} is empty", d.min_minor, d.max_minor);
        // SAFETY: plugin strings, read byte by byte up to a bound.
        let name = unsafe { plugin_string(d.name) }.map_err(|e| Verdict::Fail(format!("name {e}")))?;
        let version =
            unsafe { plugin_string(d.version) }.map_err(|e| Verdict::Fail(format!("version {e}")))?;
        let Some(live_objects) = d.live_objects else {
            fail!("live_objects is NULL (required)");
        };
        ensure!(d.mechanism_count >= 1, "mechanism_count is 0");
        ensure!(d.mechanism_count <= MAX_MECHANISMS, "mechanism_count {} is implausible", d.mechanism_count);
        ensure!(!d.mechanisms.is_null(), "mechanisms is NULL");
        // SAFETY: `mechanism_count` pointers, as the descriptor says.
        let mechanisms = (0..d.mechanism_count as usize).map(|i| unsafe { *d.mechanisms.add(i) }).collect();
        let detail = format!(
            "{name} {version}, ABI 1.{}..=1.{}, {} mechanism(s)",
            d.min_minor, d.max_minor, d.mechanism_count
        );
        view = Some(PluginView {
            name,
            version,
            min_minor: d.min_minor,
            max_minor: d.max_minor,
            agreed_minor,
            ctx: d.ctx,
            live_objects,
            unload: d.unload,
            mechanisms,
        });
        Ok(detail)
    });
    view
}

pub(crate) fn mechanisms(res: &mut Results, plugin: &PluginView) -> Vec<Published> {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for (i, &p) in plugin.mechanisms.iter().enumerate() {
        // SAFETY: plugin-owned descriptor, at least struct_size bytes.
        let mut d: MemplugMechanism = match unsafe { prefix::read(p) } {
            Ok(d) => d,
            Err(PrefixError::Null) => {
                problems.push(format!("mechanism #{i} is NULL"));
                continue;
            }
            Err(PrefixError::Short { declared: n, .. }) => {
                problems.push(format!(
                    "mechanism #{i}: struct_size {n} is shorter than ABI 1.0's {MEMPLUG_MECHANISM_SIZE_1_0}"
                ));
                continue;
            }
        };
        // The 1.2 identity is present only in a descriptor that holds the
        // whole pointer (a prefix read keeps the first bytes of one that
        // struct_size cuts).
        // SAFETY: read as a prefix above: at least 4 bytes.
        if unsafe { p.cast::<u32>().read_unaligned() } < MEMPLUG_MECHANISM_SIZE_1_2 {
            d.identity = core::ptr::null();
        }
        // SAFETY: a plugin string, read byte by byte up to a bound.
        let name = match unsafe { plugin_string(d.name) } {
            Ok(n) => n,
            Err(e) => {
                problems.push(format!("mechanism #{i}: name {e}"));
                continue;
            }
        };
        let mut checkable = true;
        if d.mechanism_id == 0 {
            problems.push(format!("mechanism '{name}' has id 0 (ids are non-zero)"));
            checkable = false;
        }
        if let Some(first) = out.iter().find(|o: &&Published| o.desc.mechanism_id == d.mechanism_id) {
            problems.push(format!("mechanisms '{}' and '{name}' share id {}", first.name, d.mechanism_id));
            checkable = false;
        }
        if out.iter().any(|o: &Published| o.name == name) {
            problems.push(format!("two mechanisms share the name '{name}'"));
            checkable = false;
        }
        out.push(Published { name, desc: d, checkable });
    }
    let n = plugin.mechanisms.len();
    res.add(
        "descriptor.mechanisms",
        None,
        if problems.is_empty() {
            Ok(format!(
                "{n} mechanism(s): {}",
                out.iter().map(|o| o.name.as_str()).collect::<Vec<_>>().join(", ")
            ))
        } else {
            Err(Verdict::Fail(format!(
                "{} (deeper checks run only on well-formed, unique mechanisms)",
                problems.join("; ")
            )))
        },
    );
    out
}

/// `descriptor.capabilities`; on failure whether deeper checks must not run.
fn capabilities(plugin: &PluginView, desc: &MemplugMechanism) -> Result<String, (Verdict, bool)> {
    let caps = desc.capabilities;
    let fatal = |m: String| (Verdict::Fail(m), true);
    if caps & MEMPLUG_CAP_ALLOCATOR == 0 {
        return Err(fatal("MEMPLUG_CAP_ALLOCATOR is not set (every mechanism has an allocator)".into()));
    }
    if desc.allocator.is_null() {
        return Err(fatal("MEMPLUG_CAP_ALLOCATOR is set but allocator is NULL".into()));
    }
    for (bit, null, flag, field) in [
        (
            MEMPLUG_CAP_VIRTUAL_BACKING,
            desc.virtual_backing.is_null(),
            "MEMPLUG_CAP_VIRTUAL_BACKING",
            "virtual_backing",
        ),
        (
            MEMPLUG_CAP_SHARED_MAPPING,
            desc.shared_mapping.is_null(),
            "MEMPLUG_CAP_SHARED_MAPPING",
            "shared_mapping",
        ),
        (MEMPLUG_CAP_SYNC, desc.sync.is_null(), "MEMPLUG_CAP_SYNC", "sync"),
    ] {
        let set = caps & bit != 0;
        if set && null {
            return Err(fatal(format!("{flag} is set but the {field} pointer is NULL")));
        }
        if !set && !null {
            return Err(fatal(format!("the {field} pointer is set but {flag} is not")));
        }
    }
    // Not fatal from here: a host refuses or ignores these, but the raw
    // vtables can still be exercised.
    let soft = |m: String| (Verdict::Fail(m), false);
    if caps & MEMPLUG_CAP_SHARED_EXPORT != 0 {
        if plugin.agreed_minor < 1 {
            return Err(soft(format!(
                "MEMPLUG_CAP_SHARED_EXPORT (bit 4) is an ABI 1.1 capability, but the agreed minor is 1.{} \
                 (the plugin speaks up to 1.{}): a host refuses the mechanism",
                plugin.agreed_minor, plugin.max_minor
            )));
        }
        if caps & MEMPLUG_CAP_SHARED_MAPPING == 0 {
            return Err(soft(
                "MEMPLUG_CAP_SHARED_EXPORT is set without MEMPLUG_CAP_SHARED_MAPPING: a host refuses the \
                 mechanism"
                    .into(),
            ));
        }
    }
    if caps & MEMPLUG_CAP_TYPED_EXPORT != 0 {
        if plugin.agreed_minor < 2 {
            return Err(soft(format!(
                "MEMPLUG_CAP_TYPED_EXPORT (bit 5) is an ABI 1.2 capability, but the agreed minor is 1.{} (the \
                 plugin speaks up to 1.{}): a host refuses the mechanism",
                plugin.agreed_minor, plugin.max_minor
            )));
        }
        if caps & MEMPLUG_CAP_SHARED_MAPPING == 0 {
            return Err(soft(
                "MEMPLUG_CAP_TYPED_EXPORT is set without MEMPLUG_CAP_SHARED_MAPPING (export_handle and \
                 import_handle live in the shared_mapping table): the flag claims slots that cannot exist"
                    .into(),
            ));
        }
    }
    for (bit, flag) in [
        (MEMPLUG_CAP_PEER_ACCESS, "MEMPLUG_CAP_PEER_ACCESS (bit 6)"),
        (MEMPLUG_CAP_QUEUED_BINDING, "MEMPLUG_CAP_QUEUED_BINDING (bit 7)"),
    ] {
        if caps & bit != 0 && plugin.agreed_minor < 2 {
            return Err(soft(format!(
                "{flag} is an ABI 1.2 capability, but the agreed minor is 1.{} (the plugin speaks up to 1.{}): a \
                 host refuses the mechanism",
                plugin.agreed_minor, plugin.max_minor
            )));
        }
    }
    if plugin.agreed_minor >= 2 {
        // The pointer is read only from a mechanism holding all of it
        // (struct_size >= 88: prefix reads copy whole words).
        let peer = caps & MEMPLUG_CAP_PEER_ACCESS != 0;
        if peer && desc.peer_access.is_null() {
            return Err(soft(
                "MEMPLUG_CAP_PEER_ACCESS is set but the peer_access pointer is NULL (or past the mechanism's \
                 struct_size): a host refuses the mechanism"
                    .into(),
            ));
        }
        if !peer && !desc.peer_access.is_null() {
            return Err(soft(
                "the peer_access pointer is set but MEMPLUG_CAP_PEER_ACCESS is not: a host refuses the mechanism"
                    .into(),
            ));
        }
        let both = MEMPLUG_CAP_VIRTUAL_BACKING | MEMPLUG_CAP_SYNC;
        if caps & MEMPLUG_CAP_QUEUED_BINDING != 0 && caps & both != both {
            return Err(soft(
                "MEMPLUG_CAP_QUEUED_BINDING is set without MEMPLUG_CAP_VIRTUAL_BACKING and MEMPLUG_CAP_SYNC \
                 (commit_on and its fence need both): a host refuses the mechanism"
                    .into(),
            ));
        }
    }
    let unknown = caps & !MEMPLUG_CAP_ALL_1_2;
    if unknown != 0 && plugin.max_minor <= MEMPLUG_ABI_MINOR {
        return Err(soft(format!(
            "capability bits {unknown:#x} are not defined by any minor up to the plugin's newest, 1.{} \
             (a host ignores them, and the plugin claims what it cannot have)",
            plugin.max_minor
        )));
    }
    let present = capability_names(caps);
    let absent: Vec<&str> =
        ["virtual_backing", "shared_mapping", "sync"].into_iter().filter(|c| !present.contains(c)).collect();
    let mut s = format!("present: {}", present.join(", "));
    if !absent.is_empty() {
        s += &format!("; absent (flag clear, pointer NULL): {}", absent.join(", "));
    }
    if unknown != 0 {
        s += &format!("; bits {unknown:#x} of a minor newer than this kit's (ignored)");
    }
    Ok(s)
}

/// The per-mechanism descriptor checks; the mechanism when deeper checks
/// can run on it.
pub(crate) fn mechanism(res: &mut Results, ctx: &Ctx, plugin: &PluginView, d: &Published) -> Option<Mech> {
    let name = Some(d.name.as_str());
    let desc = d.desc;
    let caps = desc.capabilities;
    let mut usable = true;
    let r = capabilities(plugin, &desc);
    if matches!(&r, Err((_, true))) {
        usable = false;
    }
    let r = r.map_err(|(v, _)| v);
    res.add("descriptor.capabilities", name, r);
    res.run("descriptor.minor_0_is_1_0", name, || minor_0_is_1_0(ctx, plugin, &desc));

    res.run("descriptor.minor_1_is_1_1", name, || minor_1_is_1_1(ctx, plugin, &desc));

    res.add("descriptor.device", name, device_kind(desc.device, plugin.agreed_minor));
    if !usable {
        return None;
    }

    let mut tables = None;
    let ok = res.run("descriptor.vtables", name, || {
        let t = read_tables(&desc, plugin.agreed_minor)?;
        let detail = if t.optional_null.is_empty() {
            "every slot published".into()
        } else {
            format!("required slots present; optional slots NULL: {}", t.optional_null.join(", "))
        };
        tables = Some(t);
        Ok(detail)
    });
    let t = tables.filter(|_| ok)?;
    let mut m = mech_of(&d.name, &desc, t, plugin.agreed_minor, plugin.live_objects, plugin.ctx);
    m.plugin_max_minor = plugin.max_minor;
    let mut props = None;
    let mut seen = DescriptorSeen::Older;
    let ok = res.run("descriptor.properties", name, || {
        // A host that agreed on 1.2 asks for the memory descriptor too
        // (judged by descriptor.memory_descriptor).
        let size =
            if plugin.agreed_minor >= 2 { MEMPLUG_PROPERTIES_SIZE_1_2 } else { MEMPLUG_PROPERTIES_SIZE_1_0 };
        let (s, out) = m.properties(&ctx.log, size);
        expect(s, &[MEMPLUG_STATUS_OK], "properties")?;
        ensure!(out.tail_intact(), "properties wrote past struct_size {size}");
        let mut p: MemplugProperties = out.read();
        if plugin.agreed_minor >= 2 {
            seen = if out.untouched_in(MEMPLUG_PROPERTIES_SIZE_1_0 as usize, size as usize) {
                DescriptorSeen::Unwritten
            } else {
                DescriptorSeen::Written
            };
        }
        if seen != DescriptorSeen::Written {
            // Nothing said: the fields past the 1.0 prefix read as zero.
            p = MemplugProperties {
                min_alignment: p.min_alignment,
                max_alignment: p.max_alignment,
                granularity: p.granularity,
                ..Default::default()
            };
        }
        ensure!(
            p.min_alignment.is_power_of_two() && p.max_alignment.is_power_of_two(),
            "alignments must be powers of two (min {}, max {})",
            p.min_alignment,
            p.max_alignment
        );
        ensure!(
            p.min_alignment <= p.max_alignment,
            "min_alignment {} > max_alignment {}",
            p.min_alignment,
            p.max_alignment
        );
        if caps & (MEMPLUG_CAP_VIRTUAL_BACKING | MEMPLUG_CAP_SHARED_MAPPING) != 0 {
            ensure!(p.granularity.is_power_of_two(), "granularity {} is not a power of two", p.granularity);
        }
        props = Some(p);
        Ok(format!("alignment {}..={}, granularity {}", p.min_alignment, p.max_alignment, p.granularity))
    });
    m.props = props.filter(|_| ok)?;
    m.descriptor = seen;
    Some(m)
}

/// `descriptor.device`: a kind the agreed minor defines.
fn device_kind(d: MemplugDevice, agreed_minor: u32) -> Checked {
    let kind = d.kind;
    if agreed_minor < 2 {
        if matches!(kind, MEMPLUG_DEVICE_CPU | MEMPLUG_DEVICE_CUDA) {
            return Ok(device_string(d));
        }
        let later = if device_kind_name(kind).is_some() || is_vendor_kind(kind) {
            " (ABI 1.2 defines it: a host that agreed on 1.2 would know it)"
        } else {
            ""
        };
        fail!(
            "device kind {kind} is not defined by ABI 1.{agreed_minor}, the agreed minor{later}: a host shows it as \
             unknown"
        );
    }
    if device_kind_name(kind).is_some() {
        return Ok(format!("{} (a kind ABI 1.2 numbers as DLPack does)", device_string(d)));
    }
    if is_vendor_kind(kind) {
        return Ok(format!(
            "{} (a vendor's kind, in MEMPLUG_DEVICE_VENDOR_FIRST..=MEMPLUG_DEVICE_VENDOR_LAST)",
            device_string(d)
        ));
    }
    fail!(
        "device kind {kind} ({kind:#x}) is neither one ABI 1.2 defines (DLPack's numbers) nor in the vendor range \
         {MEMPLUG_DEVICE_VENDOR_FIRST:#x}..={MEMPLUG_DEVICE_VENDOR_LAST:#x}: a host shows it as unknown"
    )
}
