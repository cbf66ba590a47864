//! What ABI 1.2 lets a mechanism say about its memory and its device
//! beyond alignments and a granularity: the memory descriptor (page sizes,
//! attributes, export kinds, location) and the device's identity. A vendor
//! returns a [`Descriptor`] from [`Allocator::descriptor`](crate::Allocator::descriptor)
//! and gives a [`DeviceIdentity`] to
//! [`MechanismBuilder::identity`](crate::MechanismBuilder::identity); the
//! SDK publishes both to hosts that agreed on 1.2 (older hosts see
//! neither) and checks requests against the page sizes.

use crate::abi;

/// Where memory lives: a `MEMPLUG_LOCATION_*` kind and the node or tier it
/// names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Location {
    /// `MEMPLUG_LOCATION_*`; in a request, `MEMPLUG_LOCATION_ANY` (zero) is
    /// no preference.
    pub kind: u32,
    /// The NUMA node or tier `kind` names; zero otherwise.
    pub id: u32,
}

impl Location {
    /// No preference (requests) / not said (descriptors).
    pub const ANY: Location = Location { kind: abi::MEMPLUG_LOCATION_ANY, id: 0 };
    /// On the mechanism's device.
    pub const DEVICE: Location = Location { kind: abi::MEMPLUG_LOCATION_DEVICE, id: 0 };
    /// In host memory, no particular node.
    pub const HOST: Location = Location { kind: abi::MEMPLUG_LOCATION_HOST, id: 0 };

    /// In host memory on NUMA node `node`.
    pub const fn numa_node(node: u32) -> Location {
        Location { kind: abi::MEMPLUG_LOCATION_NUMA_NODE, id: node }
    }

    /// In memory tier `tier` (0 the fastest).
    pub const fn tier(tier: u32) -> Location {
        Location { kind: abi::MEMPLUG_LOCATION_TIER, id: tier }
    }
}

/// A mechanism's memory descriptor (ABI 1.2). Every field defaults to "not
/// said"; claim only what every object the mechanism makes has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// Zero (same as the granularity) or a power-of-two multiple of it.
    pub recommended_granularity: u64,
    /// Bit `k` set: pages of `2^k` bytes can back memory (see
    /// [`Descriptor::page_size_bit`]). A request naming a page size not
    /// here is refused by the SDK with `INVALID_ARGUMENT`.
    pub page_sizes: u64,
    /// `MEMPLUG_ATTR_*` bits.
    pub attributes: u32,
    /// `MEMPLUG_HANDLE_*` kinds physical objects can be exported as.
    pub export_types: u32,
    /// Where the memory lives ([`Location::ANY`]: not said).
    pub location: Location,
    /// Physical objects map at any granularity-aligned offset
    /// (`MEMPLUG_PROP_MAPS_AT_OFFSETS`).
    pub maps_at_offsets: bool,
}

impl Descriptor {
    /// The `page_sizes` bit of a page of `bytes` (a power of two).
    pub const fn page_size_bit(bytes: u64) -> u64 {
        1 << bytes.trailing_zeros()
    }

    /// Whether a request's `page_size` is acceptable: zero (the
    /// mechanism's choice) or a power of two listed in `page_sizes`.
    #[inline(always)]
    pub const fn accepts_page_size(&self, page_size: u64) -> bool {
        page_size == 0 || (page_size.is_power_of_two() && self.page_sizes & page_size != 0)
    }

    /// The ABI 1.2 property fields for this descriptor.
    pub(crate) fn write_into(&self, p: &mut abi::MemplugProperties) {
        p.recommended_granularity = self.recommended_granularity;
        p.page_sizes = self.page_sizes;
        p.attributes = self.attributes;
        p.export_types = self.export_types;
        p.location_kind = self.location.kind;
        p.location_id = self.location.id;
        p.flags = if self.maps_at_offsets { abi::MEMPLUG_PROP_MAPS_AT_OFFSETS } else { 0 };
    }
}

/// Every `MEMPLUG_IDENTITY_*` bit ABI 1.2 defines (a reader keeps these
/// and drops bits of a later minor).
pub const IDENTITY_BITS: u32 = abi::MEMPLUG_IDENTITY_UUID
    | abi::MEMPLUG_IDENTITY_PCI
    | abi::MEMPLUG_IDENTITY_SUB_DEVICE
    | abi::MEMPLUG_IDENTITY_NUMA_NODE;

/// A device's identity (ABI 1.2): UUID, PCI address, sub-device, NUMA node,
/// each meaningful when its `MEMPLUG_IDENTITY_*` bit is set in `valid`.
pub type DeviceIdentity = abi::MemplugDeviceIdentity;

/// A typed handle a vendor exports a physical object as (ABI 1.2,
/// [`SharedMapping::export_handle`](crate::SharedMapping::export_handle)).
#[derive(Debug)]
pub enum Handle {
    /// A descriptor of kind `kind` (`MEMPLUG_HANDLE_OPAQUE_FD`,
    /// `DMABUF_FD` or `MEMFD`), new and owned by the caller.
    Fd {
        /// The `MEMPLUG_HANDLE_*` kind (one of [`FD_KINDS`]).
        kind: u32,
        /// The descriptor; closing it is the owner's.
        fd: std::os::fd::OwnedFd,
    },
    /// A Windows NT handle (`MEMPLUG_HANDLE_WIN32`), owned by the caller.
    Win32(u64),
    /// A vendor's opaque bytes (`MEMPLUG_HANDLE_VENDOR_BLOB`), at most
    /// `MEMPLUG_HANDLE_BLOB_MAX`.
    Blob(Vec<u8>),
}

impl Handle {
    /// Its `MEMPLUG_HANDLE_*` kind.
    pub fn kind(&self) -> u32 {
        match self {
            Handle::Fd { kind, .. } => *kind,
            Handle::Win32(_) => abi::MEMPLUG_HANDLE_WIN32,
            Handle::Blob(_) => abi::MEMPLUG_HANDLE_VENDOR_BLOB,
        }
    }
}

/// A typed handle a vendor is asked to import (ABI 1.2,
/// [`SharedMapping::import_handle`](crate::SharedMapping::import_handle)):
/// borrowed, the caller keeps it.
#[derive(Clone, Copy, Debug)]
pub enum HandleRef<'a> {
    /// A descriptor of kind `kind`; duplicate it to keep it.
    Fd {
        /// The `MEMPLUG_HANDLE_*` kind (one of [`FD_KINDS`]).
        kind: u32,
        /// The descriptor, valid for the call only.
        fd: std::os::fd::BorrowedFd<'a>,
    },
    /// A Windows NT handle (`MEMPLUG_HANDLE_WIN32`), borrowed.
    Win32(u64),
    /// A vendor's opaque bytes (`MEMPLUG_HANDLE_VENDOR_BLOB`), borrowed, at
    /// most `MEMPLUG_HANDLE_BLOB_MAX`.
    Blob(&'a [u8]),
}

/// The `MEMPLUG_HANDLE_*` kinds that are file descriptors (a handle of
/// one of these carries its memory in `MemplugHandle::fd`).
pub const FD_KINDS: u32 =
    abi::MEMPLUG_HANDLE_OPAQUE_FD | abi::MEMPLUG_HANDLE_DMABUF_FD | abi::MEMPLUG_HANDLE_MEMFD;
/// Every `MEMPLUG_HANDLE_*` kind ABI 1.2 defines.
pub const HANDLE_KINDS: u32 = FD_KINDS | abi::MEMPLUG_HANDLE_WIN32 | abi::MEMPLUG_HANDLE_VENDOR_BLOB;
