//! A registration that follows a region's growth: the region's committed
//! range grows in granules, and UCX registers a fixed range, so each grow
//! is registered as a new part ([`GrowingRegistration::extend`]), which
//! pins that part as any registration does. The parts are offered to a
//! peer one by one (each has its own remote key).

use crate::context::Ucx;
use crate::error::UcxError;
use crate::local::LocalRegion;
use crate::registration::{Access, Registration};
use memplug_host::Context;
use std::sync::Arc;

/// The registered range `[from, end)` of one region, in parts.
pub struct GrowingRegistration {
    ucx: Ucx,
    context: Arc<Context>,
    access: Access,
    from: u64,
    end: u64,
    parts: Vec<Registration>,
}

impl GrowingRegistration {
    /// Registers `[from, region.len())` (nothing yet when the region is no
    /// longer than `from`); later grows are registered by
    /// [`extend`](Self::extend).
    pub fn new(
        ucx: &Ucx,
        context: &Arc<Context>,
        region: &mut impl LocalRegion,
        from: u64,
        access: Access,
    ) -> Result<GrowingRegistration, UcxError> {
        let mut g = GrowingRegistration {
            ucx: ucx.clone(),
            context: context.clone(),
            access,
            from,
            end: from,
            parts: Vec::new(),
        };
        g.extend(region)?;
        Ok(g)
    }

    /// Registers what the region grew by since the last call: the new
    /// part, or `None` when it did not grow. A region shorter than the
    /// registered end (a shrink cannot take registered bytes while they
    /// are pinned; the part stays registered) registers nothing.
    pub fn extend(&mut self, region: &mut impl LocalRegion) -> Result<Option<&Registration>, UcxError> {
        let len = region.view().len;
        if len <= self.end {
            return Ok(None);
        }
        let part = self.ucx.register_region(&self.context, region, self.end, len - self.end, self.access)?;
        self.end = len;
        self.parts.push(part);
        Ok(self.parts.last())
    }

    /// The first registered byte's offset in the region.
    pub fn from(&self) -> u64 {
        self.from
    }

    /// The offset past the last registered byte.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// The parts, in order of offset (each offered separately).
    pub fn parts(&self) -> &[Registration] {
        &self.parts
    }

    /// Deregisters every part, last first; refused (`Busy`) while a peer
    /// holds one, the parts not yet deregistered kept (retry after the
    /// release or revoke).
    pub fn deregister(&mut self) -> Result<(), UcxError> {
        while let Some(p) = self.parts.pop() {
            let len = p.len();
            if let Err((p, e)) = p.deregister() {
                self.parts.push(p);
                return Err(e);
            }
            // Parts are contiguous from `from`: the last one ended at `end`.
            self.end -= len;
        }
        Ok(())
    }
}
