//! The required capability: plain allocations (`Allocator`).

use super::*;

/// Required capability: plain allocations.
///
/// Every method is called through the SDK's slot functions, which run it
/// behind a panic boundary (a panic is `MEMPLUG_STATUS_INTERNAL` with its
/// message), turn `Err` into its code and message, and write the host's
/// out-params only on `Ok`. Before calling you they read the host's structs
/// as untrusted prefixes (NULL and short structs refused), check the
/// out-param can be written, and check what the mechanism's facts decide
/// (see each method). Methods are called from any thread, concurrently.
///
/// A minimal mechanism: a bump arena that cuts blocks from one buffer and
/// starts over when the last block is freed, exported as a plugin and used
/// through the host.
///
/// ```
/// use memplug_sdk::{abi, Allocator, Block, ExportedPlugin, MechanismBuilder, ObjectRef};
/// use memplug_sdk::{PluginBuilder, PluginError, PluginResult, Properties, Request};
/// use std::alloc::{alloc_zeroed, dealloc, Layout};
/// use std::collections::HashMap;
/// use std::sync::Mutex;
///
/// const ARENA: Layout = match Layout::from_size_align(1 << 20, 4096) {
///     Ok(l) => l,
///     Err(_) => panic!("a valid layout"),
/// };
///
/// struct Arena {
///     base: u64,
///     carved: Mutex<Carved>,
/// }
///
/// #[derive(Default)]
/// struct Carved {
///     /// Offset of the first byte not yet handed out.
///     next: u64,
///     last_handle: u64,
///     /// handle → (object_id, addr, size), to check references against.
///     live: HashMap<u64, (u64, u64, u64)>,
/// }
///
/// impl Arena {
///     fn new() -> Arena {
///         // SAFETY: ARENA is not zero-sized.
///         let p = unsafe { alloc_zeroed(ARENA) };
///         assert!(!p.is_null(), "no memory for the arena");
///         Arena { base: p as u64, carved: Mutex::default() }
///     }
/// }
///
/// impl Drop for Arena {
///     fn drop(&mut self) {
///         // SAFETY: allocated in `new` with ARENA; the host unloads the
///         // plugin (and so drops this) only when no block is live.
///         unsafe { dealloc(self.base as *mut u8, ARENA) }
///     }
/// }
///
/// impl Allocator for Arena {
///     fn properties(&self) -> Properties {
///         Properties { min_alignment: 16, max_alignment: 4096, granularity: 0 }
///     }
///
///     // Size 0, a bad alignment or another device never get here.
///     fn allocate(&self, r: &Request) -> PluginResult<Block> {
///         let mut c = self.carved.lock().unwrap();
///         let end_of_arena = self.base + ARENA.size() as u64;
///         let addr = (self.base + c.next).next_multiple_of(r.alignment);
///         let end = addr.checked_add(r.size).filter(|&e| e <= end_of_arena);
///         let end = end.ok_or_else(|| PluginError::out_of_memory(format!("{} B do not fit", r.size)))?;
///         c.next = end - self.base;
///         c.last_handle += 1;
///         let handle = c.last_handle;
///         c.live.insert(handle, (r.object_id, addr, r.size));
///         Ok(Block { addr, size: r.size, handle })
///     }
///
///     // Another mechanism's or device's reference never gets here; whether
///     // the handle is a live block of ours is ours to check.
///     fn deallocate(&self, o: &ObjectRef) -> PluginResult<()> {
///         let mut c = self.carved.lock().unwrap();
///         if c.live.get(&o.handle) != Some(&(o.object_id, o.addr, o.size)) {
///             return Err(PluginError::unknown_allocation(format!("handle {} is no live block", o.handle)));
///         }
///         c.live.remove(&o.handle);
///         if c.live.is_empty() {
///             c.next = 0;
///         }
///         Ok(())
///     }
/// }
///
/// const CPU0: abi::MemplugDevice = abi::MemplugDevice { kind: abi::MEMPLUG_DEVICE_CPU, ordinal: 0 };
///
/// fn arena_plugin() -> ExportedPlugin {
///     let arena = MechanismBuilder::new("arena", 1, CPU0, Arena::new());
///     let state = arena.state(); // freed with the plugin at unload
///     PluginBuilder::new("arena-plugin", "0.1.0")
///         .mechanism(arena.build())
///         .live_objects(move || state.carved.lock().unwrap().live.len() as u64)
///         .build()
/// }
/// // In a cdylib: `memplug_sdk::export_plugin!(arena_plugin);`. Linked in:
/// memplug_sdk::declare_entry!(arena_entry, arena_plugin);
///
/// // The host's side.
/// use memplug_host::{governor::AllocationClass, *};
///
/// let mgr = ProcessMemoryManager::new();
/// // SAFETY: the entry is the SDK's, for the plugin above.
/// mgr.register_plugin(unsafe { Plugin::from_entry(arena_entry, "arena", &LoadOptions::default()) }?)?;
/// let ctx = mgr.select(CPU0, Requirements::ALLOCATOR_ONLY)?;
/// let pool = mgr.create_pool("arena", 1 << 20)?;
/// let b = mgr.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Other))?;
///
/// let x = b.allocate(1000, 8)?;
/// assert_eq!(x.addr() % 16, 0); // raised to min_alignment
/// let y = b.allocate(64, 64)?;
/// assert!(y.addr() >= x.addr() + 1000);
/// let refused = b.allocate(64, 3).unwrap_err(); // not a power of two: refused before the arena
/// assert!(matches!(refused, BindingError::Plugin(e) if e.status == Status::InvalidArgument));
///
/// drop((x, y, b, ctx));
/// mgr.unload_plugin("arena-plugin")?; // nothing live: the arena is freed
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Allocator: Send + Sync + 'static {
    /// Whether `memory_info` is published; when false the slot is NULL and
    /// the host reports the absence.
    const HAS_MEMORY_INFO: bool = false;

    /// The mechanism's properties. Called once, by
    /// [`MechanismBuilder::new`](crate::MechanismBuilder::new): the SDK
    /// answers the `properties` slot with that copy and checks every request
    /// and range against it, so it must not change afterwards. The host
    /// refuses a mechanism whose alignments are not powers of two with
    /// `min_alignment <= max_alignment`, or whose granularity is not a power
    /// of two while it publishes virtual backing or shared mapping.
    fn properties(&self) -> Properties;

    /// The memory descriptor (ABI 1.2): page sizes, attributes, export
    /// kinds, location. Called once, at build time, like
    /// [`Allocator::properties`]; published only to hosts that agreed on
    /// 1.2. Default: nothing said.
    fn descriptor(&self) -> crate::Descriptor {
        crate::Descriptor::default()
    }

    /// Makes an allocation of at least `request.size` bytes aligned to
    /// `request.alignment`.
    ///
    /// Already checked by the SDK: no unknown flag bits, `size` non-zero,
    /// `alignment` a power of two no larger than `max_alignment` (all
    /// `INVALID_ARGUMENT`), `device` the mechanism's (`WRONG_DEVICE`), and
    /// the host's out block writable. `alignment` is at least
    /// `min_alignment` (the SDK raises smaller requests).
    ///
    /// Yours: sizes you cannot serve (`OUT_OF_MEMORY`, also for sizes no
    /// object could have, such as 2^63), and remembering `object_id` with
    /// the block so that [`Allocator::deallocate`] can check references.
    fn allocate(&self, request: &Request) -> PluginResult<Block>;

    /// Frees an allocation made by [`Allocator::allocate`].
    ///
    /// Already checked by the SDK: `object.mechanism_id`
    /// (`WRONG_MECHANISM`) and `object.device` (`WRONG_DEVICE`).
    ///
    /// Yours: that `object.handle` names a live allocation of this
    /// mechanism (not a reservation or physical object, not already freed)
    /// whose `object_id`, `addr` and `size` are those in the reference —
    /// `UNKNOWN_ALLOCATION` otherwise, changing nothing.
    fn deallocate(&self, object: &ObjectRef) -> PluginResult<()>;

    /// Free and total bytes of the device. Called only when
    /// `HAS_MEMORY_INFO` is true; must then not answer `UNSUPPORTED`.
    fn memory_info(&self) -> PluginResult<MemoryInfo> {
        Err(PluginError::unsupported("memory_info is not published"))
    }
}
