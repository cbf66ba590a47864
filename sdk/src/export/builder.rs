//! Builders that freeze a vendor's mechanisms and plugin into the static
//! ABI descriptors a host reads, one view per minor the SDK speaks.

use super::args::this;
use super::thunks::*;
use crate::abi::{self, *};
use crate::author::*;
use core::ffi::c_void;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// One mechanism under construction: a vendor object `M` implementing
/// [`Allocator`] and whichever optional capabilities it opts into.
pub struct MechanismBuilder<M: 'static> {
    name: CString,
    id: u64,
    device: MemplugDevice,
    imp: &'static M,
    virtual_backing: Option<MemplugVirtualBacking>,
    shared_mapping: Option<MemplugSharedMapping>,
    sync: Option<MemplugSync>,
}

impl<M: Allocator> MechanismBuilder<M> {
    /// `id` must be non-zero and unique in the plugin; `name` unique too.
    /// The implementation lives as long as the loaded library.
    pub fn new(name: &str, id: u64, device: MemplugDevice, imp: M) -> Self {
        MechanismBuilder {
            name: CString::new(name).expect("mechanism name contains NUL"),
            id,
            device,
            imp: Box::leak(Box::new(imp)),
            virtual_backing: None,
            shared_mapping: None,
            sync: None,
        }
    }

    /// The implementation, for plugin-level bookkeeping such as
    /// `live_objects`.
    pub fn implementation(&self) -> &'static M {
        self.imp
    }

    pub fn virtual_backing(mut self) -> Self
    where
        M: VirtualBacking,
    {
        self.virtual_backing = Some(MemplugVirtualBacking {
            struct_size: abi::size_1_0::VIRTUAL_BACKING,
            reserved0: 0,
            reserve: Some(v_reserve::<M>),
            commit: Some(v_commit::<M>),
            decommit: Some(v_decommit::<M>),
            committed_bytes: Some(v_committed::<M>),
            release: Some(v_release::<M>),
        });
        self
    }

    pub fn shared_mapping(mut self) -> Self
    where
        M: SharedMapping,
    {
        // The 1.1 table; `build` derives the 1.0 view a 1.0 host gets.
        self.shared_mapping = Some(MemplugSharedMapping {
            struct_size: abi::size_1_1::SHARED_MAPPING,
            reserved0: 0,
            create: Some(s_create::<M>),
            map: Some(s_map::<M>),
            unmap: Some(s_unmap::<M>),
            retain: Some(s_retain::<M>),
            release: Some(s_release::<M>),
            export_fd: if M::CAN_EXPORT { Some(s_export_fd::<M>) } else { None },
            import_fd: if M::CAN_EXPORT { Some(s_import_fd::<M>) } else { None },
        });
        self
    }

    pub fn sync(mut self) -> Self
    where
        M: StreamSync,
    {
        self.sync = Some(MemplugSync {
            struct_size: abi::size_1_0::SYNC,
            reserved0: 0,
            stream_create: Some(y_stream_create::<M>),
            stream_adopt: if M::CAN_ADOPT { Some(y_stream_adopt::<M>) } else { None },
            stream_destroy: Some(y_stream_destroy::<M>),
            enqueue_host_fn: Some(y_enqueue::<M>),
            fence_record: Some(y_fence_record::<M>),
            fence_query: Some(y_fence_query::<M>),
            fence_wait: Some(y_fence_wait::<M>),
            fence_destroy: Some(y_fence_destroy::<M>),
        });
        self
    }

    /// Freezes the mechanism into ABI structs that live as long as the
    /// library (they are leaked on purpose: a plugin descriptor is static).
    /// One descriptor per minor the SDK speaks: a host that agreed on 1.0
    /// gets a 1.0 view (no 1.1 capability bit, 1.0-sized sub-vtables), so
    /// it never sees what it cannot use and a 1.1 host never has to mask.
    pub fn build(self) -> BuiltMechanism {
        fn leak<T>(v: Option<T>) -> *const T {
            v.map_or(core::ptr::null(), |v| Box::leak(Box::new(v)) as *const T)
        }
        let allocator = MemplugAllocator {
            struct_size: abi::size_1_0::ALLOCATOR,
            reserved0: 0,
            properties: Some(a_properties::<M>),
            allocate: Some(a_allocate::<M>),
            deallocate: Some(a_deallocate::<M>),
            memory_info: if M::HAS_MEMORY_INFO { Some(a_memory_info::<M>) } else { None },
        };
        let mut caps = abi::MEMPLUG_CAP_ALLOCATOR;
        if self.virtual_backing.is_some() {
            caps |= abi::MEMPLUG_CAP_VIRTUAL_BACKING;
        }
        if let Some(sm) = &self.shared_mapping {
            caps |= abi::MEMPLUG_CAP_SHARED_MAPPING;
            if sm.export_fd.is_some() {
                caps |= abi::MEMPLUG_CAP_SHARED_EXPORT;
            }
        }
        if self.sync.is_some() {
            caps |= abi::MEMPLUG_CAP_SYNC;
        }
        // ABI 1.0's view of the shared mapping table: the 1.0 prefix only.
        let shared_1_0 = self.shared_mapping.map(|sm| MemplugSharedMapping {
            struct_size: abi::size_1_0::SHARED_MAPPING,
            export_fd: None,
            import_fd: None,
            ..sm
        });
        let mech_1_1 = MemplugMechanism {
            struct_size: abi::size_1_1::MECHANISM,
            capabilities: caps,
            mechanism_id: self.id,
            name: self.name.into_raw(),
            device: self.device,
            ctx: self.imp as *const M as *mut c_void,
            allocator: leak(Some(allocator)),
            virtual_backing: leak(self.virtual_backing),
            shared_mapping: leak(self.shared_mapping),
            sync: leak(self.sync),
        };
        let mech_1_0 = MemplugMechanism {
            struct_size: abi::size_1_0::MECHANISM,
            capabilities: caps & abi::MEMPLUG_CAP_ALL_1_0,
            shared_mapping: leak(shared_1_0),
            ..mech_1_1
        };
        BuiltMechanism([Box::leak(Box::new(mech_1_0)), Box::leak(Box::new(mech_1_1))])
    }
}

/// A mechanism frozen into its ABI descriptors, one per minor the SDK
/// speaks (index = minor).
pub struct BuiltMechanism([&'static MemplugMechanism; VIEWS]);

/// Number of minors this SDK writes descriptors for (1.0 and 1.1).
const VIEWS: usize = abi::MEMPLUG_ABI_MINOR as usize + 1;

/// The whole plugin under construction.
pub struct PluginBuilder {
    name: &'static str,
    version: &'static str,
    min_minor: u32,
    max_minor: u32,
    mechanisms: Vec<BuiltMechanism>,
    live_objects: Option<Box<dyn Fn() -> u64 + Send + Sync>>,
}

impl PluginBuilder {
    pub fn new(name: &'static str, version: &'static str) -> Self {
        PluginBuilder {
            name,
            version,
            min_minor: 0,
            max_minor: abi::MEMPLUG_ABI_MINOR,
            mechanisms: Vec::new(),
            live_objects: None,
        }
    }

    /// Narrows the minor range the plugin speaks (default: 0 to the SDK's
    /// newest).
    pub fn minors(mut self, min: u32, max: u32) -> Self {
        self.min_minor = min;
        self.max_minor = max;
        self
    }

    pub fn mechanism(mut self, m: BuiltMechanism) -> Self {
        self.mechanisms.push(m);
        self
    }

    /// How many objects the plugin holds alive (required: the host's unload
    /// gate asks it).
    pub fn live_objects(mut self, f: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        self.live_objects = Some(Box::new(f));
        self
    }

    pub fn build(self) -> ExportedPlugin {
        let live = self.live_objects.expect("PluginBuilder::live_objects is required");
        let live: &'static (dyn Fn() -> u64 + Send + Sync) = Box::leak(live);
        let live_ctx: &'static LiveFn = Box::leak(Box::new(LiveFn(live)));
        let name = CString::new(self.name).expect("plugin name contains NUL").into_raw();
        let version = CString::new(self.version).expect("plugin version contains NUL").into_raw();
        let count = self.mechanisms.len() as u32;
        let descs = core::array::from_fn(|minor| {
            let ptrs: Vec<*const MemplugMechanism> =
                self.mechanisms.iter().map(|m| m.0[minor] as *const _).collect();
            let desc = MemplugPlugin {
                struct_size: abi::size_1_0::PLUGIN,
                abi_major: abi::MEMPLUG_ABI_MAJOR,
                min_minor: self.min_minor,
                max_minor: self.max_minor,
                name,
                version,
                ctx: live_ctx as *const LiveFn as *mut c_void,
                mechanism_count: count,
                reserved0: 0,
                mechanisms: Box::leak(ptrs.into_boxed_slice()).as_ptr(),
                live_objects: Some(live_thunk),
                unload: None,
            };
            &*Box::leak(Box::new(desc))
        });
        ExportedPlugin { descs, max_minor: self.max_minor }
    }
}

struct LiveFn(&'static (dyn Fn() -> u64 + Send + Sync));

unsafe extern "C" fn live_thunk(ctx: *mut c_void) -> u64 {
    // A panic here cannot be reported through a status; report "still
    // alive" so the host refuses to unload, the conservative answer.
    catch_unwind(AssertUnwindSafe(|| (this::<LiveFn>(ctx).0)())).unwrap_or(u64::MAX)
}

/// A finished plugin descriptor (one view per minor), static for the life
/// of the library.
pub struct ExportedPlugin {
    descs: [&'static MemplugPlugin; VIEWS],
    max_minor: u32,
}

// SAFETY: the descriptor is immutable after build and every slot is required
// by the ABI to be callable from any thread.
unsafe impl Send for ExportedPlugin {}
unsafe impl Sync for ExportedPlugin {}

impl ExportedPlugin {
    /// The descriptor of the newest minor the plugin speaks.
    pub fn descriptor(&self) -> &'static MemplugPlugin {
        self.descriptor_for(self.max_minor)
    }

    /// The descriptor a host that agreed on `minor` gets: what ABI 1.`minor`
    /// defines and nothing newer (minors past this SDK's newest get its
    /// newest view).
    pub fn descriptor_for(&self, minor: u32) -> &'static MemplugPlugin {
        self.descs[(minor as usize).min(VIEWS - 1)]
    }
}
