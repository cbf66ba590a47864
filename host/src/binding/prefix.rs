//! Shared prefixes: [`MemoryBinding::create_shared`], the owning
//! [`SharedPrefix`], and its retire job.

use super::settle::{self, Charge};
use super::view::RegionView;
use super::{round_up, BindingError, BindingInner, MemoryBinding};
use crate::deferred::{Retire, RetireOutcome};
use crate::governor::Lease;
use crate::mechanism::{Access, Handle, HandleRef, SharedMappingApi, VirtualBackingApi};
use crate::tokens::PhysicalObject;
use std::fmt;
use std::sync::Arc;

impl MemoryBinding {
    /// Creates a shared prefix of `size` bytes (rounded up to the
    /// granularity), filled by `init` through a temporary writable view.
    /// Its physical bytes are charged once, however many regions map it.
    ///
    /// ```
    /// # use memplug_host::{governor::AllocationClass, *};
    /// # use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
    /// # let mgr = ProcessMemoryManager::new();
    /// # // SAFETY: the reference CPU plugin's entry, built against this ABI.
    /// # let cpu = unsafe { Plugin::from_entry(memplug_plugin_cpu::cpu_plugin_entry, "cpu", &LoadOptions::default()) }?;
    /// # mgr.register_plugin(cpu)?;
    /// # let cpu0 = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };
    /// # let needs = Requirements { virtual_backing: true, shared_mapping: true, sync: false };
    /// # let ctx = mgr.select(cpu0, needs)?;
    /// # let pool = mgr.create_pool("kv", 64 << 20)?;
    /// let kv = mgr.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Kv))?;
    /// let prompt = b"You are a helpful assistant.";
    /// let prefix = kv.create_shared(1 << 20, |view| {
    ///     // SAFETY: CPU memory, writable through this temporary view only.
    ///     unsafe { view.as_mut_slice()[..prompt.len()].copy_from_slice(prompt) }
    /// })?;
    ///
    /// let (mut a, mut b) = (kv.reserve_virtual(16 << 20)?, kv.reserve_virtual(16 << 20)?);
    /// for r in [&mut a, &mut b] {
    ///     r.map_prefix(&prefix)?; // read-only, at the region's base
    ///     assert!(r.prefix_is_read_only());
    ///     // SAFETY: the prefix is mapped readable at the base.
    ///     let start = unsafe { std::slice::from_raw_parts(r.addr() as *const u8, prompt.len()) };
    ///     assert_eq!(start, prompt);
    ///     r.grow_to(prefix.len() + (1 << 20), |_| Ok::<(), String>(()))?; // private tokens after it
    /// }
    /// // One prefix charge, plus each region's own part.
    /// assert_eq!(pool.used(), prefix.charged() + 2 * (1 << 20));
    ///
    /// // A region that already has bytes of its own takes no prefix.
    /// assert!(matches!(a.map_prefix(&prefix), Err(BindingError::State(_))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn create_shared(
        &self,
        size: u64,
        init: impl FnOnce(&mut RegionView),
    ) -> Result<Arc<SharedPrefix>, BindingError> {
        let b = &*self.inner;
        let m = b.mechanism();
        let sm = m.shared_mapping().ok_or_else(|| b.unsupported("shared_mapping"))?;
        let vb = m.virtual_backing().ok_or_else(|| b.unsupported("virtual_backing"))?;
        let len = round_up(size, m.properties().granularity)
            .ok_or_else(|| BindingError::Invalid(format!("shared prefix of {size} bytes overflows")))?;
        let (object, lease) = settle::commit_or_undo(
            b,
            len,
            |_| sm.create_placed(len, b.class, &b.placement),
            |o| sm.release(o),
        )?;
        if let Err(e) = fill(b, &sm, &vb, &object, len, init) {
            let _ = settle::release_or_quarantine(
                b,
                Charge::Whole(Some(lease)),
                |_| sm.release(object),
                |_, _| "physical object (fill failed)".into(),
            );
            return Err(e);
        }
        Ok(Arc::new(SharedPrefix {
            binding: self.inner.clone(),
            object: Some(object),
            lease: Some(lease),
            len,
        }))
    }
}

impl MemoryBinding {
    /// A shared prefix backed by memory another process (or mechanism of
    /// the same kind) exported as `handle` (ABI 1.2 typed export), of `size`
    /// bytes: charged once to this binding's pool like one made by
    /// [`create_shared`](Self::create_shared), and mapped into regions the
    /// same way. The handle stays the caller's.
    pub fn import_shared(&self, handle: HandleRef<'_>, size: u64) -> Result<Arc<SharedPrefix>, BindingError> {
        let b = &*self.inner;
        let m = b.mechanism();
        let sm = m.shared_mapping().ok_or_else(|| b.unsupported("shared_mapping"))?;
        let len = round_up(size, m.properties().granularity)
            .ok_or_else(|| BindingError::Invalid(format!("shared prefix of {size} bytes overflows")))?;
        let (object, lease) =
            settle::commit_or_undo(b, len, |_| sm.import_handle(handle, len), |o| sm.release(o))?;
        Ok(Arc::new(SharedPrefix {
            binding: self.inner.clone(),
            object: Some(object),
            lease: Some(lease),
            len,
        }))
    }
}

/// Fills `object` through a temporary writable mapping of `len` bytes.
fn fill(
    b: &BindingInner,
    sm: &SharedMappingApi<'_>,
    vb: &VirtualBackingApi<'_>,
    object: &PhysicalObject,
    len: u64,
    init: impl FnOnce(&mut RegionView),
) -> Result<(), BindingError> {
    let tmp = vb.reserve(len)?;
    let mut result = sm.map(object, 0, &tmp, 0, len, Access::ReadWrite).map_err(BindingError::from);
    if result.is_ok() {
        init(&mut RegionView { addr: tmp.addr(), len, lost: false, offloaded: false });
        result = sm.unmap(&tmp, 0, len).map_err(Into::into);
    }
    // Always give the temporary reservation back: releasing it also drops a
    // mapping whose unmap failed. One the plugin will not release is
    // quarantined, never dropped silently (invariant 7), and its failure
    // is the fill's.
    let mut refused = None;
    let _ = settle::release_or_quarantine(
        b,
        Charge::Whole(None),
        |_| vb.release(tmp),
        |e, reason| {
            refused = Some(e.error.clone());
            format!("temporary reservation {} of a shared prefix: {reason}", e.object.object_id())
        },
    );
    match refused {
        Some(e) => result.and(Err(e.into())),
        None => result,
    }
}

/// A shared prefix: one physical object, charged once, mapped read-only
/// into any number of regions. Freed (after fences) when the last `Arc`
/// drops; each region's mapping keeps its own plugin-side reference.
pub struct SharedPrefix {
    pub(super) binding: Arc<BindingInner>,
    object: Option<PhysicalObject>,
    lease: Option<Lease>,
    pub(super) len: u64,
}

impl SharedPrefix {
    /// Its length in bytes: the size asked, rounded up to the mechanism's
    /// granularity. A region that maps it starts with these bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the prefix has no bytes (only if the mechanism accepted a
    /// size of 0; SDK-built mechanisms refuse one).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Bytes charged to the pool for it, once, however many regions map
    /// it. After a device loss the pool's books settle this charge at
    /// termination; the figure here stays what was charged.
    pub fn charged(&self) -> u64 {
        self.lease.as_ref().map_or(0, Lease::bytes)
    }
    /// Whether the prefix went with a lost device (see
    /// [`Region::is_lost`](super::Region::is_lost)).
    pub fn is_lost(&self) -> bool {
        self.binding.is_lost()
    }
    pub(super) fn object(&self) -> &PhysicalObject {
        self.object.as_ref().expect("present until drop")
    }
    /// A new handle of kind `kind` (one `MEMPLUG_HANDLE_*` bit) to this
    /// prefix's memory, owned by the caller, for another process to import
    /// with [`MemoryBinding::import_shared`] (ABI 1.2 typed export; the
    /// binding that made it names the kinds at creation,
    /// `BindingSpec::export_types`). The prefix stays charged here.
    pub fn export_handle(&self, kind: u32) -> Result<Handle, BindingError> {
        let b = &*self.binding;
        let sm = b.mechanism().shared_mapping().ok_or_else(|| b.unsupported("shared_mapping"))?;
        Ok(sm.export_handle(self.object(), kind)?)
    }
}

impl fmt::Debug for SharedPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedPrefix({} B)", self.len)
    }
}

impl Drop for SharedPrefix {
    fn drop(&mut self) {
        let job = PrefixRetire {
            binding: self.binding.clone(),
            object: self.object.take(),
            lease: self.lease.take(),
        };
        // Regions holding mappings keep an Arc, so reaching here means no
        // region maps it any more; their own frees were fence-ordered.
        let _ = Retire::retire(Box::new(job));
    }
}

struct PrefixRetire {
    binding: Arc<BindingInner>,
    object: Option<PhysicalObject>,
    lease: Option<Lease>,
}

impl Retire for PrefixRetire {
    fn settled_elsewhere(&self) -> bool {
        self.binding.is_lost()
    }
    fn charged_to(&self) -> Option<crate::deferred::ChargedTo> {
        self.binding.charged_to()
    }
    fn retire(mut self: Box<Self>) -> RetireOutcome {
        let b = &*self.binding;
        let (Some(object), Some(lease)) = (self.object.take(), self.lease.take()) else {
            return RetireOutcome::Freed { bytes: 0 };
        };
        let sm = b.mechanism().shared_mapping().expect("checked at create");
        settle::release_or_quarantine(
            b,
            Charge::Whole(Some(lease)),
            |_| sm.release(object),
            |e, reason| format!("physical object {}: {reason}", e.object.object_id()),
        )
    }
    fn describe(&self) -> String {
        format!("shared prefix ({} B)", self.object.as_ref().map_or(0, PhysicalObject::size))
    }
}
