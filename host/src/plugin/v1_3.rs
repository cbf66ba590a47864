//! The loader's judgement of what ABI 1.3 adds: the copy spaces of the
//! properties, which must agree with the sync table's `copy` slot (read,
//! like the rest of 1.3, only at an agreed minor of at least 3; the slot is
//! cleared below it by `sync_tail`).

use super::Reader;
use crate::mechanism::{CopyKinds, MechanismInner};
use memplug_sdk::abi::*;

impl Reader<'_> {
    /// The `MEMPLUG_COPY_*` spaces a mechanism publishes: none below 1.3
    /// (the host asked for a shorter struct). Spaces without a copy slot,
    /// or a copy slot with no space, contradict each other; bits of a later
    /// minor are kept as bits.
    pub(super) fn copy_kinds(
        &self,
        out: &MemplugProperties,
        m: &MechanismInner,
    ) -> Result<CopyKinds, String> {
        if m.minor < 3 {
            return Ok(CopyKinds::NONE);
        }
        let published = m.sync.as_ref().is_some_and(|y| y.copy.is_some());
        match (published, out.copy_kinds) {
            (true, 0) => Err("the sync table publishes copy but copy_kinds names no MEMPLUG_COPY_* space".into()),
            (false, k) if k != 0 => Err(format!(
                "copy_kinds is {k:#x} but the mechanism publishes no copy slot (it needs MEMPLUG_CAP_SYNC and a \
                 sync table of at least {MEMPLUG_SYNC_SIZE_1_3} bytes)"
            )),
            (_, k) => Ok(CopyKinds(k)),
        }
    }
}
