//! The per-mechanism context every slot receives as `ctx`: the vendor's
//! implementation next to the facts the export layer knows about the
//! mechanism at build time (its id, device and properties), and the checks
//! those facts decide, made before the vendor's trait is called.
//!
//! Each check's success path is a few compares against fields of the
//! context the slot already holds; every refusal is formatted out of line,
//! on the failure path only.

use crate::abi::MemplugDevice;
use crate::author::*;
use crate::status::Status;

/// Request flag bits some ABI minor defines: none, up to 1.1.
pub(super) const KNOWN_REQUEST_FLAGS: u32 = 0;

/// What a slot's `ctx` points at: an `Arc<MechCtx<M>>`'s contents, shared
/// by the built mechanism and every [`MechanismState`](super::MechanismState).
pub(super) struct MechCtx<M> {
    pub(super) facts: Facts,
    /// Set once the mechanism is reported lost ([`super::HostLink`]): every
    /// slot then answers DEVICE_LOST without calling the vendor.
    pub(super) lost: super::host_link::LostFlag,
    pub(super) imp: M,
}

/// What the export layer knows of a mechanism, fixed at build time.
pub(super) struct Facts {
    pub(super) id: u64,
    /// The device as one word ([`device_word`]): one compare per check.
    device: u64,
    min_alignment: u64,
    max_alignment: u64,
    /// `granularity - 1` when the granularity is a power of two; all ones
    /// otherwise (no range is a multiple of a granularity that is not one).
    granule_mask: u64,
    /// The complements of the descriptor's `export_types` and `page_sizes`:
    /// a request's kinds and page size are refused when they share a bit
    /// with these ([`Facts::wrong_bits`]).
    unoffered_exports: u32,
    unlisted_pages: u64,
    pub(super) properties: Properties,
    pub(super) descriptor: crate::Descriptor,
    /// The `MEMPLUG_COPY_*` spaces of the copy slot (ABI 1.3), set once
    /// when the sync capability is added (after the context is shared,
    /// hence an atomic; zero without a copy slot).
    copy_kinds: core::sync::atomic::AtomicU32,
    name: Box<str>,
}

/// A device as one 64-bit word: two fields compared in one instruction.
#[inline(always)]
fn device_word(d: MemplugDevice) -> u64 {
    u64::from(d.ordinal) << 32 | u64::from(d.kind)
}

/// Slot contexts are `*mut c_void`; this is the one cast back.
///
/// # Safety
/// `ctx` is the `ctx` of a mechanism descriptor built for `M`, whose
/// plugin has not been unloaded.
/// The tag a descriptor view of a minor below 1.2 sets in its `ctx` (the
/// context's lowest address bit, always clear: it is at least 8-aligned).
/// It tells a slot which code a loss is: DEVICE_LOST exists from 1.2 on,
/// and a host that agreed on less is answered DEVICE_UNAVAILABLE.
pub(super) const PRE_1_2_VIEW: usize = 1;

/// A mechanism reported lost answers every slot with DEVICE_LOST (or, to a
/// host of a minor below 1.2, DEVICE_UNAVAILABLE): a mask, one load and a
/// branch on the success path.
#[inline(always)]
pub(super) unsafe fn mech<'a, M>(ctx: *mut core::ffi::c_void) -> PluginResult<&'a MechCtx<M>> {
    let raw = ctx as usize;
    let m = &*((raw & !PRE_1_2_VIEW) as *const MechCtx<M>);
    if m.lost.load(core::sync::atomic::Ordering::Relaxed) {
        return Err(m.facts.lost(raw & PRE_1_2_VIEW != 0));
    }
    Ok(m)
}

impl Facts {
    pub(super) fn new(
        name: &str,
        id: u64,
        device: MemplugDevice,
        properties: Properties,
        descriptor: crate::Descriptor,
    ) -> Facts {
        let g = properties.granularity;
        Facts {
            id,
            device: device_word(device),
            min_alignment: properties.min_alignment,
            max_alignment: properties.max_alignment,
            granule_mask: if g.is_power_of_two() { g - 1 } else { u64::MAX },
            unoffered_exports: !descriptor.export_types,
            unlisted_pages: !descriptor.page_sizes,
            properties,
            descriptor,
            copy_kinds: Default::default(),
            name: name.into(),
        }
    }

    pub(super) fn set_copy_kinds(&self, kinds: u32) {
        self.copy_kinds.store(kinds, core::sync::atomic::Ordering::Relaxed);
    }

    pub(super) fn copy_kinds(&self) -> u32 {
        self.copy_kinds.load(core::sync::atomic::Ordering::Relaxed)
    }

    #[cold]
    #[inline(never)]
    fn lost(&self, pre_1_2: bool) -> PluginError {
        let status = if pre_1_2 { Status::DeviceUnavailable } else { Status::DeviceLost };
        PluginError::new(
            status,
            format!("mechanism '{}' was reported lost: its device or context is gone", self.name),
        )
    }

    fn device(&self) -> (u32, u32) {
        (self.device as u32, (self.device >> 32) as u32)
    }

    /// The checks every request gets, as one word that is zero exactly
    /// when all pass: no unknown flags, the mechanism's device, export
    /// kinds it offers, and a page size that is zero or a power of two
    /// (`p & (p - 1)` is zero exactly then) its `page_sizes` lists (a
    /// single bit is listed exactly when it has none in common with the
    /// complement). One `or` per check and one test for all, instead of a
    /// compare and a branch (or a flag) each.
    #[inline(always)]
    fn wrong_bits(&self, r: &Request) -> u64 {
        let p = r.page_size;
        u64::from(r.flags & !KNOWN_REQUEST_FLAGS)
            | (device_word(r.device) ^ self.device)
            | u64::from(r.export_types & self.unoffered_exports)
            | (p & p.wrapping_sub(1))
            | (p & self.unlisted_pages)
    }

    /// The request of `allocate` as the vendor sees it: the checks of
    /// [`Facts::request`], and an alignment that is a power of two at most
    /// `max_alignment`, raised to `min_alignment`.
    ///
    /// The refusal gets the fields as scalars, so the success path never
    /// stores the request to memory for it.
    #[inline(always)]
    pub(super) fn allocation(&self, r: Request) -> PluginResult<Request> {
        // `a - 1` wraps to all ones for zero (above any maximum), and has
        // no bit in common with `a` exactly when `a` is a power of two.
        let mask = r.alignment.wrapping_sub(1);
        let ok =
            ((self.wrong_bits(&r) | (r.alignment & mask)) == 0) & (r.size != 0) & (mask < self.max_alignment);
        if !ok {
            return Err(self.refuse_allocation(
                r.flags,
                r.size,
                r.alignment,
                r.device,
                r.export_types,
                r.page_size,
            ));
        }
        Ok(Request { alignment: r.alignment.max(self.min_alignment), ..r })
    }

    /// The request of `reserve`, `create` and `import_fd` (`what`): no
    /// unknown flags, a non-zero size, the mechanism's device, export kinds
    /// it offers and a page size it lists; not the alignment, which the ABI
    /// says they ignore.
    #[inline(always)]
    pub(super) fn request(&self, r: &Request, what: &'static str) -> PluginResult<()> {
        if (self.wrong_bits(r) != 0) | (r.size == 0) {
            return Err(self.refuse_request(what, r));
        }
        Ok(())
    }

    /// A reference to an object of this mechanism: its `mechanism_id` and
    /// `device` (`what` names the object for the message).
    #[inline(always)]
    pub(super) fn object(&self, o: &ObjectRef, what: &'static str) -> PluginResult<()> {
        if (o.mechanism_id != self.id) | (device_word(o.device) != self.device) {
            return Err(self.refuse_object(what, o.mechanism_id, o.device));
        }
        Ok(())
    }

    /// A range `(offset, len)`: non-empty, both ends on the granularity, and
    /// `offset + len` within 64 bits. Its bound against the object's size
    /// is the vendor's to check (only the vendor knows the size).
    #[inline(always)]
    pub(super) fn range(&self, offset: u64, len: u64, what: &'static str) -> PluginResult<()> {
        let ok = (len != 0) & ((offset | len) & self.granule_mask == 0) & offset.checked_add(len).is_some();
        if !ok {
            return Err(self.refuse_range(what, offset, len));
        }
        Ok(())
    }

    /// Why [`Facts::allocation`] refused: the fields it checks, passed in
    /// registers (the request itself is not in memory on that path).
    #[cold]
    #[inline(never)]
    fn refuse_allocation(
        &self,
        flags: u32,
        size: u64,
        alignment: u64,
        device: MemplugDevice,
        export_types: u32,
        page_size: u64,
    ) -> PluginError {
        let r = Request {
            flags,
            size,
            alignment,
            object_id: 0,
            device,
            class_tag: 0,
            hints: 0,
            export_types,
            page_size,
            location: crate::Location::ANY,
        };
        if let Err(e) = self.request(&r, "allocate") {
            return e;
        }
        PluginError::invalid_argument(format!(
            "allocate: alignment {alignment} must be a power of two from 1 to {} (max_alignment of \
             mechanism \"{}\")",
            self.max_alignment, self.name
        ))
    }

    #[cold]
    #[inline(never)]
    fn refuse_request(&self, what: &str, r: &Request) -> PluginError {
        let (flags, size, device) = (r.flags, r.size, r.device);
        let unoffered = r.export_types & !self.descriptor.export_types;
        if unoffered != 0 {
            return PluginError::unsupported(format!(
                "{what}: export kinds {unoffered:#x} are not ones mechanism \"{}\" offers (export_types {:#x})",
                self.name, self.descriptor.export_types
            ));
        }
        if !self.descriptor.accepts_page_size(r.page_size) {
            return PluginError::invalid_argument(format!(
                "{what}: page size {:#x} is not one mechanism \"{}\" publishes (page_sizes {:#x})",
                r.page_size, self.name, self.descriptor.page_sizes
            ));
        }
        if device_word(device) != self.device {
            return self.wrong_device(what, "request", device);
        }
        if flags & !KNOWN_REQUEST_FLAGS != 0 {
            return PluginError::invalid_argument(format!(
                "{what}: request flags {flags:#x} have bits no ABI minor up to 1.{} defines",
                crate::abi::MEMPLUG_ABI_MINOR
            ));
        }
        debug_assert_eq!(size, 0);
        PluginError::invalid_argument(format!("{what}: size is zero"))
    }

    #[cold]
    #[inline(never)]
    fn refuse_object(&self, what: &str, mechanism_id: u64, device: MemplugDevice) -> PluginError {
        if mechanism_id != self.id {
            return PluginError::wrong_mechanism(format!(
                "{what} belongs to mechanism {mechanism_id}, not to \"{}\" (id {})",
                self.name, self.id
            ));
        }
        self.wrong_device(what, "reference", device)
    }

    fn wrong_device(&self, what: &str, kind_of: &str, d: MemplugDevice) -> PluginError {
        let (kind, ordinal) = self.device();
        PluginError::wrong_device(format!(
            "{what}: the {kind_of} names device (kind {}, ordinal {}); mechanism \"{}\" serves only (kind \
             {kind}, ordinal {ordinal})",
            d.kind, d.ordinal, self.name
        ))
    }

    #[cold]
    #[inline(never)]
    fn refuse_range(&self, what: &str, offset: u64, len: u64) -> PluginError {
        let g = self.properties.granularity;
        let why = if len == 0 {
            "is empty".to_string()
        } else if !g.is_power_of_two() {
            return PluginError::internal(format!(
                "{what}: mechanism \"{}\" publishes granularity {g}, not a power of two, so no range can \
                 be checked",
                self.name
            ));
        } else if (offset | len) & self.granule_mask != 0 {
            format!("is not aligned to the granularity of {g:#x} bytes")
        } else {
            "overflows: offset + len exceeds 2^64".to_string()
        };
        PluginError::new(Status::OutOfRange, format!("{what} range (offset {offset:#x}, len {len:#x}) {why}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-word check ([`Facts::wrong_bits`], and the alignment bits
    /// `allocation` ors in) refuses exactly what a check of each field on
    /// its own refuses, and every refusal gets a message.
    #[test]
    fn the_one_word_check_refuses_exactly_what_each_field_check_refuses() {
        let dev = MemplugDevice { kind: crate::abi::MEMPLUG_DEVICE_CPU, ordinal: 2 };
        let descriptor =
            crate::Descriptor { page_sizes: 1 << 12 | 1 << 21, export_types: 0b101, ..Default::default() };
        let properties = Properties { min_alignment: 16, max_alignment: 1 << 12, granularity: 4096 };
        let f = Facts::new("m", 7, dev, properties, descriptor);
        let other = MemplugDevice { kind: dev.kind, ordinal: 3 };
        let pages = [0, 1, 3, 1 << 12, 1 << 13, 1 << 21, (1 << 21) | (1 << 12), u64::MAX];
        let alignments = [0, 1, 3, 16, 48, 1 << 12, 1 << 13, u64::MAX];
        for (flags, size, device, export_types, page_size, alignment) in (0..2u32).flat_map(|fl| {
            [0u64, 64].into_iter().flat_map(move |sz| {
                [dev, other].into_iter().flat_map(move |d| {
                    [0u32, 0b100, 0b010].into_iter().flat_map(move |e| {
                        pages
                            .into_iter()
                            .flat_map(move |p| alignments.into_iter().map(move |a| (fl, sz, d, e, p, a)))
                    })
                })
            })
        }) {
            let r = Request {
                flags,
                size,
                alignment,
                object_id: 1,
                device,
                class_tag: 0,
                hints: 0,
                export_types,
                page_size,
                location: crate::Location::ANY,
            };
            let request_ok = flags & !KNOWN_REQUEST_FLAGS == 0
                && size != 0
                && device == dev
                && f.descriptor.accepts_page_size(page_size)
                && export_types & !f.descriptor.export_types == 0;
            let allocation_ok = request_ok && alignment.is_power_of_two() && alignment <= f.max_alignment;
            let what = format!("{r:?}");
            match f.request(&r, "create") {
                Ok(()) => assert!(request_ok, "create accepted {what}"),
                Err(e) => assert!(!request_ok && !e.message.is_empty(), "create refused {what}: {e:?}"),
            }
            match f.allocation(r) {
                Ok(v) => {
                    assert!(allocation_ok, "allocate accepted {what}");
                    assert_eq!(v.alignment, alignment.max(16));
                }
                Err(e) => assert!(!allocation_ok && !e.message.is_empty(), "allocate refused {what}: {e:?}"),
            }
        }
    }
}
