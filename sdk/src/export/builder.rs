//! Builders that freeze a vendor's mechanisms and plugin into the ABI
//! descriptors a host reads, one view per minor the SDK speaks.
//!
//! Everything a descriptor points at (the descriptors, sub-vtables, names,
//! mechanism lists, contexts) is owned by the [`ExportedPlugin`], and freed
//! with it: the entry's cell drops it when the host calls the plugin's
//! `unload` slot ([`super::entry`]), so loading and unloading a library
//! again and again does not grow memory.

use super::context::{Facts, MechCtx};
use super::host_link::{HostLink, LostFlag};
use super::owned::Owned;
use super::thunks::*;
use super::thunks_1_2::*;
use super::thunks_1_3::*;
use crate::abi::{self, *};
use crate::author::*;
use crate::descriptor::DeviceIdentity;
use core::ffi::{c_char, c_void};
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// One mechanism under construction: a vendor object `M` implementing
/// [`Allocator`] and whichever optional capabilities it opts into.
pub struct MechanismBuilder<M: 'static> {
    name: CString,
    id: u64,
    device: MemplugDevice,
    ctx: Arc<MechCtx<M>>,
    virtual_backing: Option<MemplugVirtualBacking>,
    shared_mapping: Option<MemplugSharedMapping>,
    sync: Option<MemplugSync>,
    peer_access: Option<MemplugPeerAccess>,
    identity: Option<DeviceIdentity>,
}

/// A counted reference to a mechanism's implementation, for plugin-level
/// bookkeeping such as [`PluginBuilder::live_objects`]: it derefs to `M`.
///
/// The implementation is freed (its `Drop` runs) when the built plugin and
/// every `MechanismState` of it are gone — normally when the host calls the
/// plugin's `unload` slot, which drops the plugin and the `live_objects`
/// function holding this.
pub struct MechanismState<M>(Arc<MechCtx<M>>);

impl<M> Clone for MechanismState<M> {
    fn clone(&self) -> Self {
        MechanismState(Arc::clone(&self.0))
    }
}

impl<M> core::ops::Deref for MechanismState<M> {
    type Target = M;
    fn deref(&self) -> &M {
        &self.0.imp
    }
}

impl<M: Allocator> MechanismBuilder<M> {
    /// A mechanism named `name`, with identifier `id` (non-zero, unique in
    /// the plugin; the name unique too), serving `device`, implemented by
    /// `imp`.
    ///
    /// Calls `imp.properties()` once: the id, the device and those
    /// properties are what the SDK checks every call against before the
    /// vendor's trait sees it (see [`Allocator`]), and the `properties`
    /// slot answers with them.
    pub fn new(name: &str, id: u64, device: MemplugDevice, imp: M) -> Self {
        let properties = imp.properties();
        let descriptor = imp.descriptor();
        MechanismBuilder {
            name: CString::new(name).expect("mechanism name contains NUL"),
            id,
            device,
            ctx: Arc::new(MechCtx {
                facts: Facts::new(name, id, device, properties, descriptor),
                lost: Default::default(),
                imp,
            }),
            virtual_backing: None,
            shared_mapping: None,
            sync: None,
            peer_access: None,
            identity: None,
        }
    }

    /// Publishes the device's identity (ABI 1.2: UUID, PCI address,
    /// sub-device, NUMA node), to hosts that agreed on 1.2.
    pub fn identity(mut self, identity: DeviceIdentity) -> Self {
        self.identity = Some(DeviceIdentity { struct_size: abi::size_1_2::DEVICE_IDENTITY, ..identity });
        self
    }

    /// A counted reference to the implementation (see [`MechanismState`]),
    /// freed with the plugin at unload. Prefer it to
    /// [`MechanismBuilder::implementation`].
    pub fn state(&self) -> MechanismState<M> {
        MechanismState(Arc::clone(&self.ctx))
    }

    /// The implementation, as a reference for the rest of the process.
    ///
    /// For the reference to stay valid, calling this keeps the
    /// implementation alive for good: it is then never freed, not at
    /// `unload` either, and every load of the library that calls this
    /// leaks it (the descriptors are still freed). Use
    /// [`MechanismBuilder::state`] unless something really needs a
    /// `&'static M`.
    pub fn implementation(&self) -> &'static M {
        let kept = Arc::into_raw(Arc::clone(&self.ctx));
        // SAFETY: the count taken by `into_raw` is never given back, so the
        // context is never freed.
        unsafe { &(*kept).imp }
    }

    /// Publishes the virtual backing capability, implemented by `M`.
    pub fn virtual_backing(mut self) -> Self
    where
        M: VirtualBacking,
    {
        self.virtual_backing = Some(MemplugVirtualBacking {
            struct_size: abi::size_1_2::VIRTUAL_BACKING,
            reserved0: 0,
            reserve: Some(v_reserve::<M>),
            commit: Some(v_commit::<M>),
            decommit: Some(v_decommit::<M>),
            committed_bytes: Some(v_committed::<M>),
            release: Some(v_release::<M>),
            commit_on: if M::CAN_QUEUE { Some(v_commit_on::<M>) } else { None },
            decommit_on: if M::CAN_QUEUE { Some(v_decommit_on::<M>) } else { None },
        });
        self
    }

    /// Publishes the shared mapping capability, implemented by `M` (with
    /// `export_fd`/`import_fd` when `M::CAN_EXPORT`).
    pub fn shared_mapping(mut self) -> Self
    where
        M: SharedMapping,
    {
        // The whole (1.2) table; `build` derives the views of older minors.
        self.shared_mapping = Some(MemplugSharedMapping {
            struct_size: abi::size_1_2::SHARED_MAPPING,
            reserved0: 0,
            create: Some(s_create::<M>),
            map: Some(s_map::<M>),
            unmap: Some(s_unmap::<M>),
            retain: Some(s_retain::<M>),
            release: Some(s_release::<M>),
            export_fd: if M::CAN_EXPORT { Some(s_export_fd::<M>) } else { None },
            import_fd: if M::CAN_EXPORT { Some(s_import_fd::<M>) } else { None },
            export_handle: if M::CAN_EXPORT_HANDLES { Some(s_export_handle::<M>) } else { None },
            import_handle: if M::CAN_EXPORT_HANDLES { Some(s_import_handle::<M>) } else { None },
            map_on: if M::CAN_QUEUE_MAPS { Some(s_map_on::<M>) } else { None },
            unmap_on: if M::CAN_QUEUE_MAPS { Some(s_unmap_on::<M>) } else { None },
        });
        self
    }

    /// Publishes the sync capability, implemented by `M`.
    pub fn sync(mut self) -> Self
    where
        M: StreamSync,
    {
        let copy_kinds = if M::CAN_COPY { self.ctx.imp.copy_kinds() } else { 0 };
        assert!(
            !M::CAN_COPY || copy_kinds != 0,
            "StreamSync::CAN_COPY is set but copy_kinds() names no MEMPLUG_COPY_* space"
        );
        self.ctx.facts.set_copy_kinds(copy_kinds);
        self.sync = Some(MemplugSync {
            struct_size: abi::size_1_3::SYNC,
            reserved0: 0,
            stream_create: Some(y_stream_create::<M>),
            stream_adopt: if M::CAN_ADOPT { Some(y_stream_adopt::<M>) } else { None },
            stream_destroy: Some(y_stream_destroy::<M>),
            enqueue_host_fn: Some(y_enqueue::<M>),
            fence_record: Some(y_fence_record::<M>),
            fence_query: Some(y_fence_query::<M>),
            fence_wait: Some(y_fence_wait::<M>),
            fence_destroy: Some(y_fence_destroy::<M>),
            stream_wait_fence: if M::CAN_WAIT_FENCE { Some(y_stream_wait_fence::<M>) } else { None },
            stream_adopt_typed: if M::CAN_ADOPT_TYPED { Some(y_stream_adopt_typed::<M>) } else { None },
            copy: if M::CAN_COPY { Some(y_copy::<M>) } else { None },
        });
        self
    }

    /// Publishes the peer access capability (ABI 1.2), implemented by `M`.
    pub fn peer_access(mut self) -> Self
    where
        M: PeerAccess,
    {
        self.peer_access = Some(MemplugPeerAccess {
            struct_size: abi::size_1_2::PEER_ACCESS,
            reserved0: 0,
            can_access_peer: Some(p_can_access_peer::<M>),
            set_peer_access: Some(p_set_peer_access::<M>),
        });
        self
    }

    /// Freezes the mechanism into its ABI structs, owned by what this
    /// returns (and then by the plugin it is added to). One descriptor per
    /// minor the SDK speaks: a host that agreed on 1.0 gets a 1.0 view (no
    /// 1.1 capability bit, 1.0-sized sub-vtables), so it never sees what it
    /// cannot use and a 1.1 host never has to mask.
    pub fn build(mut self) -> BuiltMechanism {
        fn own<T>(v: Option<T>) -> Option<Owned<T>> {
            v.map(Owned::new)
        }
        fn ptr<T>(v: &Option<Owned<T>>) -> *const T {
            v.as_ref().map_or(core::ptr::null(), |o| o.ptr() as *const T)
        }
        let allocator = Owned::new(MemplugAllocator {
            struct_size: abi::size_1_0::ALLOCATOR,
            reserved0: 0,
            properties: Some(a_properties::<M>),
            allocate: Some(a_allocate::<M>),
            deallocate: Some(a_deallocate::<M>),
            memory_info: if M::HAS_MEMORY_INFO { Some(a_memory_info::<M>) } else { None },
        });
        let mut caps = abi::MEMPLUG_CAP_ALLOCATOR;
        if self.virtual_backing.is_some() {
            caps |= abi::MEMPLUG_CAP_VIRTUAL_BACKING;
        }
        if let Some(sm) = &self.shared_mapping {
            caps |= abi::MEMPLUG_CAP_SHARED_MAPPING;
            if sm.export_fd.is_some() {
                caps |= abi::MEMPLUG_CAP_SHARED_EXPORT;
            }
            if sm.export_handle.is_some() {
                caps |= abi::MEMPLUG_CAP_TYPED_EXPORT;
            }
        }
        if self.sync.is_some() {
            caps |= abi::MEMPLUG_CAP_SYNC;
        }
        if self.peer_access.is_some() {
            caps |= abi::MEMPLUG_CAP_PEER_ACCESS;
        }
        // Queued binding is one capability over two tables: published only
        // when the virtual backing queues, streams exist, and a shared
        // mapping (if any) queues its maps too; otherwise the slots go.
        let vb_queues = self.virtual_backing.is_some_and(|v| v.commit_on.is_some());
        let sm_queues = self.shared_mapping.is_none_or(|m| m.map_on.is_some());
        if vb_queues && sm_queues && self.sync.is_some() {
            caps |= abi::MEMPLUG_CAP_QUEUED_BINDING;
        } else {
            if let Some(v) = &mut self.virtual_backing {
                (v.commit_on, v.decommit_on) = (None, None);
            }
            if let Some(m) = &mut self.shared_mapping {
                (m.map_on, m.unmap_on) = (None, None);
            }
        }
        // Each older minor's view of the shared mapping table: its prefix
        // only (the 1.2 table is the whole one).
        let shared_1_0 = own(self.shared_mapping.map(|sm| MemplugSharedMapping {
            struct_size: abi::size_1_0::SHARED_MAPPING,
            export_fd: None,
            import_fd: None,
            export_handle: None,
            import_handle: None,
            map_on: None,
            unmap_on: None,
            ..sm
        }));
        let shared_1_1 = own(self.shared_mapping.map(|sm| MemplugSharedMapping {
            struct_size: abi::size_1_1::SHARED_MAPPING,
            export_handle: None,
            import_handle: None,
            map_on: None,
            unmap_on: None,
            ..sm
        }));
        // The virtual backing and sync tables of 1.0 and 1.1 are the same
        // (1.1 added nothing to them); 1.2's are the whole tables.
        let virtual_backing = own(self.virtual_backing.map(|v| MemplugVirtualBacking {
            struct_size: abi::size_1_0::VIRTUAL_BACKING,
            commit_on: None,
            decommit_on: None,
            ..v
        }));
        let virtual_backing_1_2 = own(self.virtual_backing);
        let sync_1_2 =
            own(self.sync.map(|y| MemplugSync { struct_size: abi::size_1_2::SYNC, copy: None, ..y }));
        let sync_1_3 = own(self.sync);
        let peer_access = own(self.peer_access);
        let shared_1_2 = own(self
            .shared_mapping
            .map(|sm| MemplugSharedMapping { struct_size: abi::size_1_2::SHARED_MAPPING, ..sm }));
        let sync = own(self.sync.map(|y| MemplugSync {
            struct_size: abi::size_1_0::SYNC,
            stream_wait_fence: None,
            stream_adopt_typed: None,
            copy: None,
            ..y
        }));
        let name = OwnedCStr::new(self.name);
        let mech_1_1 = MemplugMechanism {
            struct_size: abi::size_1_1::MECHANISM,
            capabilities: caps & abi::MEMPLUG_CAP_ALL_1_1,
            mechanism_id: self.id,
            name: name.ptr(),
            device: self.device,
            ctx: Arc::as_ptr(&self.ctx) as *mut c_void,
            allocator: allocator.ptr(),
            virtual_backing: ptr(&virtual_backing),
            shared_mapping: ptr(&shared_1_1),
            sync: ptr(&sync),
            identity: core::ptr::null(),
            peer_access: core::ptr::null(),
        };
        let mech_1_0 = MemplugMechanism {
            struct_size: abi::size_1_0::MECHANISM,
            capabilities: caps & abi::MEMPLUG_CAP_ALL_1_0,
            shared_mapping: ptr(&shared_1_0),
            ..mech_1_1
        };
        // The 1.0 and 1.1 views tag their context: a lost mechanism answers
        // their hosts with a code those minors know (context.rs).
        let tagged = |m: MemplugMechanism| MemplugMechanism {
            ctx: (m.ctx as usize | super::context::PRE_1_2_VIEW) as *mut c_void,
            ..m
        };
        let (mech_1_0, mech_1_1_view) = (tagged(mech_1_0), tagged(mech_1_1));
        // The 1.2 view: every capability, the whole shared mapping table,
        // the identity, an untagged context.
        let identity = own(self.identity);
        let mech_1_2 = MemplugMechanism {
            struct_size: abi::size_1_2::MECHANISM,
            capabilities: caps,
            virtual_backing: ptr(&virtual_backing_1_2),
            shared_mapping: ptr(&shared_1_2),
            sync: ptr(&sync_1_2),
            identity: ptr(&identity),
            peer_access: ptr(&peer_access),
            ..mech_1_1
        };
        // The 1.3 view: the 1.2 one with the whole sync table (`copy`).
        let mech_1_3 = MemplugMechanism { sync: ptr(&sync_1_3), ..mech_1_2 };
        BuiltMechanism {
            views: [
                Owned::new(mech_1_0),
                Owned::new(mech_1_1_view),
                Owned::new(mech_1_2),
                Owned::new(mech_1_3),
            ],
            _tables: Tables {
                _allocator: allocator,
                _virtual_backing: virtual_backing,
                _shared_1_0: shared_1_0,
                _shared_1_1: shared_1_1,
                _shared_1_2: shared_1_2,
                _virtual_backing_1_2: virtual_backing_1_2,
                _sync_1_2: sync_1_2,
                _sync_1_3: sync_1_3,
                _peer_access: peer_access,
                _sync: sync,
                _identity: identity,
                _name: name,
            },
            id: self.id,
            lost: self.ctx.lost.clone(),
            _ctx: self.ctx,
        }
    }
}

/// A mechanism frozen into its ABI descriptors, one per minor the SDK
/// speaks (index = minor), with everything they point at.
pub struct BuiltMechanism {
    views: [Owned<MemplugMechanism>; VIEWS],
    id: u64,
    lost: LostFlag,
    _tables: Tables,
    /// The slots' context; type-erased, kept for its drop.
    _ctx: Arc<dyn Send + Sync>,
}

/// What a mechanism's descriptors point at, kept for its drop (never read
/// here: the host reads it through the descriptors).
struct Tables {
    _allocator: Owned<MemplugAllocator>,
    _virtual_backing: Option<Owned<MemplugVirtualBacking>>,
    _shared_1_0: Option<Owned<MemplugSharedMapping>>,
    _shared_1_1: Option<Owned<MemplugSharedMapping>>,
    _shared_1_2: Option<Owned<MemplugSharedMapping>>,
    _virtual_backing_1_2: Option<Owned<MemplugVirtualBacking>>,
    _sync_1_2: Option<Owned<MemplugSync>>,
    _sync_1_3: Option<Owned<MemplugSync>>,
    _peer_access: Option<Owned<MemplugPeerAccess>>,
    _sync: Option<Owned<MemplugSync>>,
    _identity: Option<Owned<DeviceIdentity>>,
    _name: OwnedCStr,
}

/// A C string a descriptor points at, freed on drop.
struct OwnedCStr(*mut c_char);

impl OwnedCStr {
    fn new(s: CString) -> Self {
        OwnedCStr(s.into_raw())
    }
    fn ptr(&self) -> *const c_char {
        self.0
    }
}

impl Drop for OwnedCStr {
    fn drop(&mut self) {
        // SAFETY: from `CString::into_raw` in `new`, reclaimed only here.
        drop(unsafe { CString::from_raw(self.0) });
    }
}

// SAFETY: the descriptors and tables are immutable once built (the host only
// reads them), the contexts are `Send + Sync`, and every slot is required by
// the ABI to be callable from any thread.
unsafe impl Send for BuiltMechanism {}
unsafe impl Sync for BuiltMechanism {}
unsafe impl Send for OwnedCStr {}
unsafe impl Sync for OwnedCStr {}

/// Number of minors this SDK writes descriptors for (1.0 to 1.3).
const VIEWS: usize = abi::MEMPLUG_ABI_MINOR as usize + 1;

/// The whole plugin under construction.
pub struct PluginBuilder {
    name: &'static str,
    version: &'static str,
    min_minor: u32,
    max_minor: u32,
    mechanisms: Vec<BuiltMechanism>,
    live_objects: Option<Box<dyn Fn() -> u64 + Send + Sync>>,
    link: Option<HostLink>,
}

impl PluginBuilder {
    /// A plugin called `name` (unique among the plugins a host loads), at
    /// `version`; both go into the descriptor as C strings.
    pub fn new(name: &'static str, version: &'static str) -> Self {
        PluginBuilder {
            name,
            version,
            min_minor: 0,
            max_minor: abi::MEMPLUG_ABI_MINOR,
            mechanisms: Vec::new(),
            live_objects: None,
            link: None,
        }
    }

    /// Narrows the minor range the plugin speaks (default: 0 to the SDK's
    /// newest).
    pub fn minors(mut self, min: u32, max: u32) -> Self {
        self.min_minor = min;
        self.max_minor = max;
        self
    }

    /// Adds a built mechanism (at least one is required).
    pub fn mechanism(mut self, m: BuiltMechanism) -> Self {
        self.mechanisms.push(m);
        self
    }

    /// How many objects (allocations, reservations, physical objects,
    /// streams, fences) the plugin holds alive (required: the host's unload
    /// gate asks it, and never unloads while it is non-zero). Give it a
    /// [`MechanismBuilder::state`] to count from; it is dropped at unload.
    /// A panic in it reports `u64::MAX` (the host then keeps the plugin).
    pub fn live_objects(mut self, f: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        self.live_objects = Some(Box::new(f));
        self
    }

    /// The plugin's line to its hosts (ABI 1.2 services): every mechanism
    /// added is reachable through `link`, which reports losses to every
    /// host that negotiated 1.2 or newer.
    pub fn host_link(mut self, link: &HostLink) -> Self {
        self.link = Some(link.clone());
        self
    }

    /// Freezes the plugin into its descriptors (one per minor).
    pub fn build(self) -> ExportedPlugin {
        if let Some(link) = &self.link {
            for m in &self.mechanisms {
                link.add_mechanism(m.id, m.lost.clone());
            }
        }
        let live = self.live_objects.expect("PluginBuilder::live_objects is required");
        let ctx = Owned::new(PluginCtx { live, holder: core::ptr::null(), release: None });
        let name = OwnedCStr::new(CString::new(self.name).expect("plugin name contains NUL"));
        let version = OwnedCStr::new(CString::new(self.version).expect("plugin version contains NUL"));
        let count = self.mechanisms.len() as u32;
        let lists: [Owned<[*const MemplugMechanism]>; VIEWS] = core::array::from_fn(|minor| {
            let ptrs: Vec<*const MemplugMechanism> =
                self.mechanisms.iter().map(|m| m.views[minor].ptr() as *const _).collect();
            Owned::from_box(ptrs.into_boxed_slice())
        });
        let descs = core::array::from_fn(|minor| {
            Owned::new(MemplugPlugin {
                struct_size: abi::size_1_0::PLUGIN,
                abi_major: abi::MEMPLUG_ABI_MAJOR,
                min_minor: self.min_minor,
                max_minor: self.max_minor,
                name: name.ptr(),
                version: version.ptr(),
                ctx: ctx.ptr().cast(),
                mechanism_count: count,
                reserved0: 0,
                mechanisms: lists[minor].ptr() as *const *const MemplugMechanism,
                live_objects: Some(live_thunk),
                unload: None,
            })
        });
        ExportedPlugin {
            descs,
            max_minor: self.max_minor,
            _lists: lists,
            _mechanisms: self.mechanisms,
            _strings: [name, version],
            ctx,
            link: self.link,
        }
    }
}

/// The plugin descriptor's `ctx`: the `live_objects` function, and who
/// holds the plugin (set when the entry's cell takes it: the cell, and the
/// function that gives its hold back), which `unload` calls.
pub(super) struct PluginCtx {
    live: Box<dyn Fn() -> u64 + Send + Sync>,
    holder: *const c_void,
    release: Option<unsafe fn(*const c_void)>,
}

/// The descriptor's `unload` slot: the host's last call into this load of
/// the plugin. Gives the holder's hold back (the last one frees the plugin).
unsafe extern "C" fn unload_thunk(ctx: *mut c_void) {
    // Read both before the plugin (and `ctx` with it) may be freed.
    let (holder, release) = {
        let c = &*(ctx as *const PluginCtx);
        (c.holder, c.release)
    };
    if let Some(release) = release {
        // `unload` reports nothing; a panic in the vendor's `Drop` is caught
        // and leaves the rest of the plugin unfreed.
        let _ = catch_unwind(AssertUnwindSafe(|| release(holder)));
    }
}

unsafe extern "C" fn live_thunk(ctx: *mut c_void) -> u64 {
    // A panic here cannot be reported through a status; report "still
    // alive" so the host refuses to unload, the conservative answer.
    catch_unwind(AssertUnwindSafe(|| ((*(ctx as *const PluginCtx)).live)())).unwrap_or(u64::MAX)
}

/// A finished plugin: its descriptors (one view per minor) and everything
/// they point at, freed on drop.
pub struct ExportedPlugin {
    descs: [Owned<MemplugPlugin>; VIEWS],
    max_minor: u32,
    _lists: [Owned<[*const MemplugMechanism]>; VIEWS],
    _mechanisms: Vec<BuiltMechanism>,
    _strings: [OwnedCStr; 2],
    ctx: Owned<PluginCtx>,
    link: Option<HostLink>,
}

impl Drop for ExportedPlugin {
    fn drop(&mut self) {
        // The last hold was given back: no host may be called any more.
        if let Some(link) = &self.link {
            link.detach_all();
        }
    }
}

// SAFETY: the descriptors are immutable once published, the context's
// function is `Send + Sync`, its cell pointer names a `static`, and every
// slot is required by the ABI to be callable from any thread.
unsafe impl Send for ExportedPlugin {}
unsafe impl Sync for ExportedPlugin {}

impl ExportedPlugin {
    /// Attaches a host's services (negotiation agreed on 1.2 or newer).
    ///
    /// # Safety
    /// As for [`HostLink`]'s attach: NULL or the host's live table.
    pub(super) unsafe fn attach_host(&self, services: *const MemplugHostServices) {
        if let Some(link) = &self.link {
            link.attach(services);
        }
    }

    /// The descriptor of the newest minor the plugin speaks.
    pub fn descriptor(&self) -> &MemplugPlugin {
        self.descriptor_for(self.max_minor)
    }

    /// The descriptor a host that agreed on `minor` gets: what ABI 1.`minor`
    /// defines and nothing newer (minors past this SDK's newest get its
    /// newest view). Valid while `self` is.
    pub fn descriptor_for(&self, minor: u32) -> &MemplugPlugin {
        // SAFETY: owned by `self`, written only before it is published.
        unsafe { &*self.descs[(minor as usize).min(VIEWS - 1)].ptr() }
    }

    /// Hands the plugin to its holder (the entry's cell): publishes the
    /// `unload` slot, which calls `release(holder)` to give the hold back.
    /// Called once, before any descriptor is handed out.
    ///
    /// # Safety
    /// `holder` outlives the plugin and does not move (it is a `static`),
    /// and `release` may be called with it from any thread.
    pub(super) unsafe fn bind(&mut self, holder: *const c_void, release: unsafe fn(*const c_void)) {
        let ctx = self.ctx.ptr();
        (*ctx).holder = holder;
        (*ctx).release = Some(release);
        for d in &self.descs {
            (*d.ptr()).unload = Some(unload_thunk);
        }
    }
}
