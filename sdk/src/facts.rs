//! The facts of the ABI in one place: how big each growable struct is at
//! each minor, and which slots each vtable has — what each is called, where
//! it lies, whether a mechanism must publish it, and the minor that added
//! it.
//!
//! Facts, not judgements: the host's loader, the conformance kit and the
//! fuzz oracle each decide for themselves what to make of a plugin (and say
//! so in their own words); they take from here only what the ABI defines.
//! The frozen size constants themselves stay in [`abi`],
//! because `include/memplug.h` is generated from there.

use crate::abi::{self, *};
use crate::prefix::Prefixed;
use core::marker::PhantomData;
use core::mem::offset_of;

/// The sizes of one growable struct at each minor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeFact {
    /// The C name of the struct.
    pub name: &'static str,
    /// `MEMPLUG_*_SIZE_1_0`: a reader refuses a struct shorter than this.
    pub size_1_0: u32,
    /// `MEMPLUG_*_SIZE_1_1`: the struct as ABI 1.1 defines it.
    pub size_1_1: u32,
    /// `MEMPLUG_*_SIZE_1_2`: the struct as ABI 1.2 defines it.
    pub size_1_2: u32,
    /// `MEMPLUG_*_SIZE_1_3`: the struct as ABI 1.3 defines it.
    pub size_1_3: u32,
    /// The minor that added the struct (its sizes at older minors are 0).
    pub since_minor: u32,
}

impl SizeFact {
    /// The size of the struct as ABI 1.`minor` defines it (a minor newer
    /// than this SDK's gets the newest size it knows).
    pub const fn at_minor(&self, minor: u32) -> u32 {
        match minor {
            0 => self.size_1_0,
            1 => self.size_1_1,
            2 => self.size_1_2,
            _ => self.size_1_3,
        }
    }

    /// The smallest `struct_size` a reader accepts: the size at the minor
    /// that added the struct ([`Prefixed::SIZE_1_0`] is the same number).
    pub const fn min_size(&self) -> u32 {
        self.at_minor(self.since_minor)
    }
}

macro_rules! size_fact {
    ($name:literal, $short:ident) => {
        SizeFact {
            name: $name,
            size_1_0: abi::size_1_0::$short,
            size_1_1: abi::size_1_1::$short,
            size_1_2: abi::size_1_2::$short,
            size_1_3: abi::size_1_3::$short,
            since_minor: 0,
        }
    };
    ($name:literal, $short:ident, since 2) => {
        SizeFact {
            name: $name,
            size_1_0: 0,
            size_1_1: 0,
            size_1_2: abi::size_1_2::$short,
            size_1_3: abi::size_1_3::$short,
            since_minor: 2,
        }
    };
}

/// Every growable struct of the ABI with its frozen sizes, in the order
/// `memplug.h` declares them.
pub const SIZES: &[SizeFact] = &[
    size_fact!("MemplugHostInfo", HOST_INFO),
    size_fact!("MemplugHostServices", HOST_SERVICES, since 2),
    size_fact!("MemplugNegotiation", NEGOTIATION),
    size_fact!("MemplugPlugin", PLUGIN),
    size_fact!("MemplugMechanism", MECHANISM),
    size_fact!("MemplugProperties", PROPERTIES),
    size_fact!("MemplugMemoryInfo", MEMORY_INFO),
    size_fact!("MemplugRequest", REQUEST),
    size_fact!("MemplugBlock", BLOCK),
    size_fact!("MemplugObjectRef", OBJECT_REF),
    size_fact!("MemplugAllocator", ALLOCATOR),
    size_fact!("MemplugVirtualBacking", VIRTUAL_BACKING),
    size_fact!("MemplugSharedMapping", SHARED_MAPPING),
    size_fact!("MemplugSync", SYNC),
    size_fact!("MemplugDeviceIdentity", DEVICE_IDENTITY, since 2),
    size_fact!("MemplugHandle", HANDLE, since 2),
    size_fact!("MemplugPeerAccess", PEER_ACCESS, since 2),
];

/// Whether a mechanism must publish a slot (non-NULL).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Always, whenever its table is published.
    Required,
    /// Never: NULL means the mechanism does not offer it.
    Optional,
    /// Exactly when the mechanism claims this `MEMPLUG_CAP_*` capability
    /// (and the agreed minor is at least the slot's `since_minor`).
    WithCapability(u32),
}

/// One slot (function pointer) of the vtable `T`.
pub struct SlotFact<T> {
    /// The field's name, as in `memplug.h`.
    pub name: &'static str,
    /// Byte offset of the field in `T`.
    pub offset: usize,
    /// Whether a mechanism must publish it.
    pub need: Need,
    /// The minor of ABI major 1 that added it.
    pub since_minor: u32,
    table: PhantomData<fn(&T)>,
}

impl<T> SlotFact<T> {
    const fn new(name: &'static str, offset: usize, need: Need, since_minor: u32) -> Self {
        SlotFact { name, offset, need, since_minor, table: PhantomData }
    }
}

impl<T> Clone for SlotFact<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for SlotFact<T> {}

impl<T> core::fmt::Debug for SlotFact<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SlotFact")
            .field("name", &self.name)
            .field("offset", &self.offset)
            .field("need", &self.need)
            .field("since_minor", &self.since_minor)
            .finish()
    }
}

/// A sub-vtable of a mechanism: `struct_size`, padding, then function
/// pointers only.
///
/// # Safety
/// `SLOTS` names every function-pointer field of `Self` exactly once, each
/// at its true offset; every field is a `u32` or an `Option<extern fn>`
/// (so no byte is padding).
pub unsafe trait Vtable: Prefixed + 'static {
    /// The table's field name in `MemplugMechanism`.
    const NAME: &'static str;
    /// Its slots, in the order the struct declares them.
    const SLOTS: &'static [SlotFact<Self>];
}

/// Whether `table` publishes `slot`: a non-NULL function pointer at its
/// offset.
pub fn slot_published<T: Vtable>(table: &T, slot: &SlotFact<T>) -> bool {
    // A `SlotFact<T>` is only made here, by `offset_of!` on a function
    // pointer field of `T`; checked anyway, as the read relies on it.
    assert!(slot.offset % core::mem::align_of::<usize>() == 0);
    assert!(slot.offset + core::mem::size_of::<usize>() <= core::mem::size_of::<T>());
    // SAFETY: in bounds and aligned (checked above); the bytes there are an
    // `Option<extern fn>` field (the `Vtable` contract), and every such
    // option has the layout of a nullable function pointer.
    unsafe {
        (table as *const T)
            .cast::<u8>()
            .add(slot.offset)
            .cast::<Option<unsafe extern "C" fn()>>()
            .read()
            .is_some()
    }
}

/// The slot of `T` called `name`, if the ABI defines one.
pub fn slot<T: Vtable>(name: &str) -> Option<&'static SlotFact<T>> {
    T::SLOTS.iter().find(|s| s.name == name)
}

/// The names of the slots of `table` with the need `need` that it leaves
/// NULL, in declaration order.
pub fn unpublished<T: Vtable>(table: &T, need: Need) -> impl Iterator<Item = &'static str> + '_ {
    T::SLOTS.iter().filter(move |s| s.need == need && !slot_published(table, s)).map(|s| s.name)
}

macro_rules! slots {
    ($t:ident, $table:literal: $($field:ident: $need:expr, $since:literal;)*) => {
        // SAFETY: the list below is checked against the struct's fields by
        // `every_slot_is_listed_once_at_its_offset`.
        unsafe impl Vtable for $t {
            const NAME: &'static str = $table;
            const SLOTS: &'static [SlotFact<$t>] =
                &[$(SlotFact::new(stringify!($field), offset_of!($t, $field), $need, $since)),*];
        }
    };
}

use Need::*;

slots!(MemplugAllocator, "allocator":
    properties: Required, 0;
    allocate: Required, 0;
    deallocate: Required, 0;
    memory_info: Optional, 0;
);

slots!(MemplugVirtualBacking, "virtual_backing":
    reserve: Required, 0;
    commit: Required, 0;
    decommit: Required, 0;
    committed_bytes: Required, 0;
    release: Required, 0;
    commit_on: WithCapability(MEMPLUG_CAP_QUEUED_BINDING), 2;
    decommit_on: WithCapability(MEMPLUG_CAP_QUEUED_BINDING), 2;
);

slots!(MemplugSharedMapping, "shared_mapping":
    create: Required, 0;
    map: Required, 0;
    unmap: Required, 0;
    retain: Required, 0;
    release: Required, 0;
    export_fd: WithCapability(MEMPLUG_CAP_SHARED_EXPORT), 1;
    import_fd: WithCapability(MEMPLUG_CAP_SHARED_EXPORT), 1;
    export_handle: WithCapability(MEMPLUG_CAP_TYPED_EXPORT), 2;
    import_handle: WithCapability(MEMPLUG_CAP_TYPED_EXPORT), 2;
    map_on: WithCapability(MEMPLUG_CAP_QUEUED_BINDING), 2;
    unmap_on: WithCapability(MEMPLUG_CAP_QUEUED_BINDING), 2;
);

slots!(MemplugSync, "sync":
    stream_create: Required, 0;
    stream_adopt: Optional, 0;
    stream_destroy: Required, 0;
    enqueue_host_fn: Required, 0;
    fence_record: Required, 0;
    fence_query: Required, 0;
    fence_wait: Required, 0;
    fence_destroy: Required, 0;
    stream_wait_fence: Optional, 2;
    stream_adopt_typed: Optional, 2;
    copy: Optional, 3;
);

slots!(MemplugPeerAccess, "peer_access":
    can_access_peer: Required, 2;
    set_peer_access: Required, 2;
);

/// The name of a device kind the ABI defines (1.0's two, and since 1.2
/// every kind DLPack numbers), as the host, the kit and the tools print it;
/// `None` for a number the ABI does not name (a vendor's or an unknown
/// one: each reader says which in its own words).
pub fn device_kind_name(kind: MemplugDeviceKind) -> Option<&'static str> {
    Some(match kind {
        MEMPLUG_DEVICE_CPU => "cpu",
        MEMPLUG_DEVICE_CUDA => "cuda",
        MEMPLUG_DEVICE_CUDA_HOST => "cuda_host",
        MEMPLUG_DEVICE_OPENCL => "opencl",
        MEMPLUG_DEVICE_VULKAN => "vulkan",
        MEMPLUG_DEVICE_METAL => "metal",
        MEMPLUG_DEVICE_VPI => "vpi",
        MEMPLUG_DEVICE_ROCM => "rocm",
        MEMPLUG_DEVICE_ROCM_HOST => "rocm_host",
        MEMPLUG_DEVICE_EXT_DEV => "ext_dev",
        MEMPLUG_DEVICE_CUDA_MANAGED => "cuda_managed",
        MEMPLUG_DEVICE_ONEAPI => "oneapi",
        MEMPLUG_DEVICE_WEBGPU => "webgpu",
        MEMPLUG_DEVICE_HEXAGON => "hexagon",
        MEMPLUG_DEVICE_MAIA => "maia",
        _ => return None,
    })
}

/// Whether a device kind lies in the range vendors number their own kinds
/// in (ABI 1.2, `MEMPLUG_DEVICE_VENDOR_FIRST..=_LAST`).
pub fn is_vendor_device_kind(kind: MemplugDeviceKind) -> bool {
    (MEMPLUG_DEVICE_VENDOR_FIRST..=MEMPLUG_DEVICE_VENDOR_LAST).contains(&kind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    /// `(name, offset)` of every function-pointer field of a struct, from
    /// an exhaustive destructuring pattern: a field added to the struct and
    /// not here fails to compile.
    macro_rules! fields {
        ($t:ident { $($plain:ident),* ; $($f:ident),* }) => {{
            let _exhaustive = |v: $t| {
                let $t { $($plain: _,)* $($f: _,)* } = v;
            };
            vec![$((stringify!($f), offset_of!($t, $f))),*]
        }};
    }

    fn check<T: Vtable>(fields: Vec<(&'static str, usize)>, sizes: &SizeFact) {
        let listed: Vec<(&str, usize)> = T::SLOTS.iter().map(|s| (s.name, s.offset)).collect();
        assert_eq!(listed, fields, "{}: every slot once, in order, at its offset", T::NAME);
        for s in T::SLOTS {
            let end = (s.offset + size_of::<usize>()) as u32;
            assert!(end <= sizes.size_1_3, "{}.{} lies inside the 1.3 struct", T::NAME, s.name);
            // The minor that added a slot is the first whose size holds it.
            let first = (0..=3).find(|m| end <= sizes.at_minor(*m)).expect("inside the 1.3 struct");
            assert_eq!(first, s.since_minor, "{}.{}: since_minor agrees with the sizes", T::NAME, s.name);
        }
        // Zeroed: nothing published. One slot set: that one only.
        // SAFETY: a `Prefixed` type is valid when zeroed.
        let zero: T = unsafe { core::mem::zeroed() };
        assert!(T::SLOTS.iter().all(|s| !slot_published(&zero, s)));
        for s in T::SLOTS {
            let mut t = zero;
            unsafe extern "C" fn stub() {}
            // SAFETY: `s.offset` is a function-pointer field of `T` (checked
            // above against `offset_of!`).
            unsafe {
                (&mut t as *mut T).cast::<u8>().add(s.offset).cast::<unsafe extern "C" fn()>().write(stub)
            };
            let published: Vec<&str> =
                T::SLOTS.iter().filter(|o| slot_published(&t, o)).map(|o| o.name).collect();
            assert_eq!(published, [s.name]);
        }
    }

    fn sizes_of(name: &str) -> &'static SizeFact {
        SIZES.iter().find(|s| s.name == name).expect("listed")
    }

    #[test]
    fn every_slot_is_listed_once_at_its_offset() {
        check::<MemplugAllocator>(
            fields!(MemplugAllocator { struct_size, reserved0; properties, allocate, deallocate, memory_info }),
            sizes_of("MemplugAllocator"),
        );
        check::<MemplugVirtualBacking>(
            fields!(MemplugVirtualBacking {
                struct_size, reserved0; reserve, commit, decommit, committed_bytes, release, commit_on, decommit_on
            }),
            sizes_of("MemplugVirtualBacking"),
        );
        check::<MemplugSharedMapping>(
            fields!(MemplugSharedMapping {
                struct_size, reserved0; create, map, unmap, retain, release, export_fd, import_fd, export_handle,
                import_handle, map_on, unmap_on
            }),
            sizes_of("MemplugSharedMapping"),
        );
        check::<MemplugSync>(
            fields!(MemplugSync {
                struct_size, reserved0;
                stream_create, stream_adopt, stream_destroy, enqueue_host_fn, fence_record, fence_query,
                fence_wait, fence_destroy, stream_wait_fence, stream_adopt_typed, copy
            }),
            sizes_of("MemplugSync"),
        );
        check::<MemplugPeerAccess>(
            fields!(MemplugPeerAccess { struct_size, reserved0; can_access_peer, set_peer_access }),
            sizes_of("MemplugPeerAccess"),
        );
    }

    #[test]
    fn the_slot_needs_are_the_abi_s() {
        let need = |t: &str, s: &str| match t {
            "allocator" => slot::<MemplugAllocator>(s).map(|f| f.need),
            "shared_mapping" => slot::<MemplugSharedMapping>(s).map(|f| f.need),
            "sync" => slot::<MemplugSync>(s).map(|f| f.need),
            _ => unreachable!(),
        };
        assert_eq!(need("allocator", "memory_info"), Some(Optional));
        assert_eq!(need("sync", "stream_adopt"), Some(Optional));
        assert_eq!(need("shared_mapping", "export_fd"), Some(WithCapability(MEMPLUG_CAP_SHARED_EXPORT)));
        assert_eq!(need("allocator", "no_such_slot"), None);
        let required = |slots: Vec<Need>| slots.into_iter().filter(|n| *n == Required).count();
        assert_eq!(required(MemplugAllocator::SLOTS.iter().map(|s| s.need).collect()), 3);
        assert_eq!(required(MemplugVirtualBacking::SLOTS.iter().map(|s| s.need).collect()), 5);
        assert_eq!(required(MemplugSharedMapping::SLOTS.iter().map(|s| s.need).collect()), 5);
        assert_eq!(required(MemplugSync::SLOTS.iter().map(|s| s.need).collect()), 7);
    }

    #[test]
    fn unpublished_lists_the_null_slots_of_a_need() {
        // SAFETY: valid when zeroed.
        let mut s: MemplugSync = unsafe { core::mem::zeroed() };
        unsafe extern "C" fn destroy(_: *mut core::ffi::c_void, _: u64, _: *const MemplugMessageSink) -> u32 {
            0
        }
        s.stream_destroy = Some(destroy);
        s.fence_destroy = Some(destroy);
        let missing: Vec<&str> = unpublished(&s, Required).collect();
        assert_eq!(
            missing,
            ["stream_create", "enqueue_host_fn", "fence_record", "fence_query", "fence_wait"]
        );
        assert_eq!(
            unpublished(&s, Optional).collect::<Vec<_>>(),
            ["stream_adopt", "stream_wait_fence", "stream_adopt_typed", "copy"]
        );
    }

    fn prefixed_size<T: Prefixed>() -> (u32, usize) {
        (T::SIZE_1_0, size_of::<T>())
    }

    #[test]
    fn the_size_table_matches_the_structs_and_the_prefix_minimums() {
        let structs = [
            ("MemplugHostInfo", prefixed_size::<MemplugHostInfo>()),
            ("MemplugHostServices", prefixed_size::<MemplugHostServices>()),
            ("MemplugNegotiation", prefixed_size::<MemplugNegotiation>()),
            ("MemplugPlugin", prefixed_size::<MemplugPlugin>()),
            ("MemplugMechanism", prefixed_size::<MemplugMechanism>()),
            ("MemplugProperties", prefixed_size::<MemplugProperties>()),
            ("MemplugMemoryInfo", prefixed_size::<MemplugMemoryInfo>()),
            ("MemplugRequest", prefixed_size::<MemplugRequest>()),
            ("MemplugBlock", prefixed_size::<MemplugBlock>()),
            ("MemplugObjectRef", prefixed_size::<MemplugObjectRef>()),
            ("MemplugAllocator", prefixed_size::<MemplugAllocator>()),
            ("MemplugVirtualBacking", prefixed_size::<MemplugVirtualBacking>()),
            ("MemplugSharedMapping", prefixed_size::<MemplugSharedMapping>()),
            ("MemplugSync", prefixed_size::<MemplugSync>()),
            ("MemplugDeviceIdentity", prefixed_size::<MemplugDeviceIdentity>()),
            ("MemplugHandle", prefixed_size::<MemplugHandle>()),
            ("MemplugPeerAccess", prefixed_size::<MemplugPeerAccess>()),
        ];
        assert_eq!(SIZES.len(), structs.len());
        for (fact, (name, (min, now))) in SIZES.iter().zip(structs) {
            assert_eq!(fact.name, name);
            assert_eq!(fact.min_size(), min, "{name}: Prefixed::SIZE_1_0 is the smallest size");
            assert_eq!(fact.size_1_3 as usize, now, "{name}: the 1.3 size is the current sizeof");
            assert!(min >= 4, "{name}: at least struct_size");
            let grown = [fact.size_1_0, fact.size_1_1, fact.size_1_2, fact.size_1_3];
            for (minor, pair) in grown.windows(2).enumerate() {
                let before_added = (minor as u32) < fact.since_minor;
                assert!(
                    before_added || pair[0] <= pair[1],
                    "{name}: 1.{minor} is a prefix of 1.{}",
                    minor + 1
                );
            }
            assert_eq!((fact.at_minor(fact.since_minor), fact.at_minor(7)), (min, now as u32));
        }
    }
}
