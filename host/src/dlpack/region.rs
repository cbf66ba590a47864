//! [`SharedRegion`]: a region that array libraries can see while it keeps
//! growing. The region sits behind a lock and a reference count; each
//! exported view holds a count, so the region outlives every view, and
//! it refuses to shrink (or be released) under a live view.

use super::{finish, prepare, ExportError, ExportOptions, ManagedTensor, Memory, TensorLayout};
use crate::binding::{
    BindingError, GrowError, MemoryBinding, OffloadReport, Region, RegionView, Residence, SharedPrefix,
};
use crate::fence::{PluginFence, SharedFence};
use crate::sync::{lock, Mutex};
use crate::tokens::Stream;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

struct Shared {
    region: Mutex<Region>,
    /// Live exported views. Decremented by deleters without the lock, so a
    /// deleter never waits for a grow in progress.
    views: AtomicUsize,
}

/// A [`Region`] shared between its owner and the DLPack views exported
/// from it. Cheap to clone; thread-safe. Growing is allowed while views
/// are alive (the base never moves and the bytes they see stay mapped);
/// shrinking is refused until they are gone. The region is released when
/// the last clone and the last view are.
#[derive(Clone)]
pub struct SharedRegion {
    inner: Arc<Shared>,
}

impl fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedRegion({:?}, {} views)", *lock(&self.inner.region), self.views())
    }
}

/// What an exported view holds.
struct ViewHold(Arc<Shared>);

impl Drop for ViewHold {
    fn drop(&mut self) {
        self.0.views.fetch_sub(1, Ordering::AcqRel);
    }
}

impl SharedRegion {
    /// Shares `region`.
    pub fn new(region: Region) -> Self {
        SharedRegion { inner: Arc::new(Shared { region: Mutex::new(region), views: AtomicUsize::new(0) }) }
    }

    /// Reads the region under its lock.
    pub fn with<R>(&self, f: impl FnOnce(&Region) -> R) -> R {
        f(&lock(&self.inner.region))
    }

    /// The base address and usable length now.
    pub fn view(&self) -> RegionView {
        self.with(Region::view)
    }

    /// Exported views still alive.
    pub fn views(&self) -> usize {
        self.inner.views.load(Ordering::Acquire)
    }

    /// [`Region::grow_to`] under the lock: `update` runs while it is held
    /// (it must not call back into this region).
    pub fn grow_to<E>(
        &self,
        len: u64,
        update: impl FnOnce(&RegionView) -> Result<(), E>,
    ) -> Result<(), GrowError<E>> {
        lock(&self.inner.region).grow_to(len, update)
    }

    /// [`Region::shrink_to`], refused while an exported view is alive: a
    /// consumer may still read any byte of the region's old length.
    pub fn shrink_to(&self, len: u64, fences: Vec<SharedFence>) -> Result<(), BindingError> {
        let mut r = lock(&self.inner.region);
        let views = self.views();
        if views != 0 && len < r.len() {
            return Err(BindingError::State(format!(
                "region at {:#x}: {views} exported DLPack view(s) alive; it cannot shrink under them",
                r.addr()
            )));
        }
        r.shrink_to(len, fences)
    }

    /// [`Region::grow_on`] under the lock: the commit is queued on
    /// `stream`; the fence says when the new bytes are usable.
    pub fn grow_on(&self, len: u64, stream: &Stream) -> Result<Arc<PluginFence>, BindingError> {
        lock(&self.inner.region).grow_on(len, stream)
    }

    /// Refuses `what` while an exported view is alive: a consumer may read
    /// any byte of the region, and offload and privatise take bytes away
    /// (for an instant, for a privatise).
    fn no_views(&self, r: &Region, what: &str) -> Result<(), BindingError> {
        match self.views() {
            0 => Ok(()),
            views => Err(BindingError::State(format!(
                "region at {:#x}: {views} exported DLPack view(s) alive; it cannot {what} under them",
                r.addr()
            ))),
        }
    }

    /// [`Region::offload_to`] under the lock, refused while a view is alive.
    pub fn offload_to(
        &self,
        target: &MemoryBinding,
        stream: &Stream,
        timeout: Duration,
    ) -> Result<OffloadReport, BindingError> {
        let mut r = lock(&self.inner.region);
        self.no_views(&r, "be offloaded")?;
        r.offload_to(target, stream, timeout)
    }

    /// [`Region::restore`] under the lock.
    pub fn restore(&self, stream: &Stream) -> Result<SharedFence, BindingError> {
        lock(&self.inner.region).restore(stream)
    }

    /// [`Region::privatise`] under the lock, refused while a view is alive.
    pub fn privatise(
        &self,
        offset: u64,
        len: u64,
        stream: &Stream,
        timeout: Duration,
    ) -> Result<SharedFence, BindingError> {
        let mut r = lock(&self.inner.region);
        self.no_views(&r, "privatise part of its prefix")?;
        r.privatise(offset, len, stream, timeout)
    }

    /// [`Region::residence`].
    pub fn residence(&self) -> Residence {
        self.with(Region::residence)
    }

    /// [`Region::map_prefix`] under the lock.
    pub fn map_prefix(&self, prefix: &Arc<SharedPrefix>) -> Result<(), BindingError> {
        lock(&self.inner.region).map_prefix(prefix)
    }

    /// [`Region::used_by`] under the lock.
    pub fn used_by(&self, fence: SharedFence) {
        lock(&self.inner.region).used_by(fence)
    }

    /// Exports a view of the usable bytes as they are now (`layout` must fit
    /// in them). Read-only when asked, and whenever it touches a prefix
    /// mapped read-only. The view keeps the region alive and unshrinkable
    /// until its deleter runs.
    pub fn to_dlpack(
        &self,
        layout: &TensorLayout,
        options: ExportOptions,
    ) -> Result<ManagedTensor, ExportError> {
        let r = lock(&self.inner.region);
        let memory = region_memory(&r);
        let p = prepare(&memory, layout, &options)?;
        // Counted under the lock, so a shrink that saw no view ran before
        // this view was made.
        self.inner.views.fetch_add(1, Ordering::AcqRel);
        drop(r);
        Ok(finish(p, memory, layout, options, Box::new(ViewHold(self.inner.clone()))))
    }
}

/// The usable bytes of `r` as an export sees them: the prefix, when mapped
/// read-only, is the read-only part, but for the ranges privatised since.
fn region_memory(r: &Region) -> Memory {
    let what = format!("region at {:#x}", r.addr());
    // While offloaded, only the prefix before its first private range is
    // on the device: a layout past it does not fit.
    let mut memory = Memory::of(r.binding_inner(), r.addr(), r.device_len(), r.is_lost(), what);
    if r.prefix_is_read_only() {
        memory.read_only = r.shared_pieces().iter().map(|&(offset, len)| (offset, offset + len)).collect();
    }
    memory
}

/// Whether [`SharedRegion::to_dlpack`] would accept a view of `region`'s
/// usable bytes with `layout` now (the same checks).
pub fn check_region(
    region: &Region,
    layout: &TensorLayout,
    options: &ExportOptions,
) -> Result<(), ExportError> {
    prepare(&region_memory(region), layout, options).map(drop)
}
