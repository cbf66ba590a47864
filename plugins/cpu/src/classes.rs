//! What the host says its memory is for (ABI 1.1 `class_tag`), as the
//! plugin sees it: physical objects alive now, counted by the class of the
//! request that made them (`create` or `import_fd`).
//!
//! The CPU plugin does not place memory by class (host memory has one
//! kind); it records the class so a host can see its tags arrive, and so a
//! vendor has a model of reading them. The counts are process-wide (every
//! instance of the plugin in the process adds to them) and reachable only
//! from Rust ([`live_physical_objects`]): they are a debugging view, not
//! part of the ABI.

use memplug_sdk::RequestClass;
use std::sync::atomic::{AtomicU64, Ordering};

static LIVE: [AtomicU64; RequestClass::ALL.len()] = [const { AtomicU64::new(0) }; RequestClass::ALL.len()];

fn slot(class: RequestClass) -> &'static AtomicU64 {
    // `ALL[c.tag()] == c`: the tag of a known class is its index.
    &LIVE[class.tag() as usize]
}

/// A live physical object's share of the count: counted while it exists,
/// uncounted when dropped (with the object's last reference).
pub(crate) struct Counted(RequestClass);

impl Counted {
    pub(crate) fn new(class: RequestClass) -> Counted {
        slot(class).fetch_add(1, Ordering::Relaxed);
        Counted(class)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        slot(self.0).fetch_sub(1, Ordering::Relaxed);
    }
}

/// Physical objects alive now in this process whose creating request
/// carried `class` (a tag the plugin does not know counts as
/// [`RequestClass::Other`], as does a 1.0 request, which has no tag).
/// Rust API only; not part of the ABI.
pub fn live_physical_objects(class: RequestClass) -> u64 {
    slot(class).load(Ordering::Relaxed)
}
