//! Tokens for objects a mechanism made. They are plain data, `#[must_use]`
//! and not `Clone`: giving one back to its mechanism consumes it, so safe
//! code cannot free twice. Dropping a token frees nothing (the owning,
//! fence-ordered layer is the binding's); the object stays counted live and
//! the plugin's unload gate sees it.

use memplug_sdk::abi::{MemplugDevice, MemplugObjectRef, MEMPLUG_OBJECT_REF_SIZE_1_0};
use std::sync::atomic::{AtomicU64, Ordering};

/// Everything that names an object across the boundary, plus the host's
/// key of the mechanism that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawObject {
    /// Host-unique key of the `Mechanism` that made the object.
    pub mechanism_key: u64,
    /// The plugin's id of that mechanism.
    pub mechanism_id: u64,
    /// The device the object is on (the mechanism's).
    pub device: MemplugDevice,
    /// Host-assigned id, unique in this process, never derived from an
    /// address.
    pub object_id: u64,
    /// Address of the first byte in the mechanism's address space; zero
    /// for a physical object, which has no address until mapped.
    pub addr: u64,
    /// Bytes the plugin provided (at least the size asked).
    pub size: u64,
    /// The plugin's own handle of the object, opaque to the host.
    pub handle: u64,
}

impl RawObject {
    #[inline]
    pub(crate) fn abi_ref(&self) -> MemplugObjectRef {
        MemplugObjectRef {
            struct_size: MEMPLUG_OBJECT_REF_SIZE_1_0,
            reserved0: 0,
            mechanism_id: self.mechanism_id,
            device: self.device,
            object_id: self.object_id,
            addr: self.addr,
            size: self.size,
            handle: self.handle,
        }
    }
}

macro_rules! token {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[must_use = "dropping this token leaks the object; give it back to its mechanism"]
        #[derive(Debug, PartialEq, Eq)]
        pub struct $name(pub(crate) RawObject);

        impl $name {
            /// Device address of the first byte (zero for a physical object).
            #[inline]
            pub fn addr(&self) -> u64 {
                self.0.addr
            }
            /// Bytes the plugin actually provided.
            #[inline]
            pub fn size(&self) -> u64 {
                self.0.size
            }
            /// The host-assigned object id.
            #[inline]
            pub fn object_id(&self) -> u64 {
                self.0.object_id
            }
            /// Everything that names the object, as the host sends it to
            /// the plugin.
            #[inline]
            pub fn raw(&self) -> &RawObject {
                &self.0
            }
            /// Gives up the token without releasing the object.
            pub fn into_raw(self) -> RawObject {
                self.0
            }
            /// Rebuilds a token.
            ///
            /// # Safety
            /// `raw` must come from `into_raw` of a token of this type whose
            /// object was not released since; otherwise the call it is
            /// passed to is a use of a forged handle (the plugin should
            /// refuse it, but a plugin may trust it).
            pub unsafe fn from_raw(raw: RawObject) -> Self {
                $name(raw)
            }
        }
    };
}

token!(
    /// A plain allocation.
    Allocation
);
token!(
    /// A reserved address range of a virtual backing.
    Reservation
);
token!(
    /// One reference to a physical object of a shared mapping.
    PhysicalObject
);

/// A stream of a sync capability.
#[must_use]
#[derive(Debug, PartialEq, Eq)]
pub struct Stream {
    pub(crate) mechanism_key: u64,
    pub(crate) handle: u64,
}

impl Stream {
    /// The plugin's handle of the stream (opaque; what the C API and
    /// `sync.fence_record` pass back).
    pub fn handle(&self) -> u64 {
        self.handle
    }
}

/// A fence of a sync capability.
#[must_use]
#[derive(Debug, PartialEq, Eq)]
pub struct Fence {
    pub(crate) mechanism_key: u64,
    pub(crate) handle: u64,
}

impl Fence {
    /// The plugin's handle of the fence (opaque).
    pub fn handle(&self) -> u64 {
        self.handle
    }
}

/// Process-unique object ids without a shared counter on the hot path: each
/// thread takes a block of ids at a time (kept in the thread's state of
/// `crate::reentry`).
#[inline(always)]
pub(crate) fn next_object_id() -> u64 {
    crate::reentry::next_object_id()
}

/// Process-unique keys for mechanisms, so a token from one loaded mechanism
/// is never accepted by another, even when two plugins reuse an id.
pub(crate) fn next_mechanism_key() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_ids_are_unique_across_threads() {
        let ids: Vec<u64> = (0..4)
            .map(|_| std::thread::spawn(|| (0..1000).map(|_| next_object_id()).collect::<Vec<_>>()))
            .flat_map(|h| h.join().unwrap())
            .collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len());
        assert!(!ids.contains(&0));
    }
}
