//! The objects behind the handles: one table per kind per manager slot, the
//! manager table, handle resolution, and the guards against re-entry from
//! callbacks.

use crate::error::{Error, Result};
use crate::handles::{
    self, Kind, LazyTable, Pinned, Raw, Removed, SlotTable, Vacant, MAX_INDEX, MAX_MANAGERS,
};
use crate::status::MemplugHostStatus as S;
use memplug_host_dep::governor::{HolderRegistration, Pool};
use memplug_host_dep::registry::Context;
use memplug_host_dep::{
    Mechanism, MemoryBinding, OwnedAllocation, ProcessMemoryManager, Region, SharedFence, SharedPrefix,
    Stream,
};
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// A manager, as its slot holds it.
pub(crate) struct ManagerState {
    pub pm: ProcessMemoryManager,
}

/// A pool handle's value.
pub(crate) struct PoolEntry {
    pub pool: Arc<Pool>,
}

/// What a holder's callback shares with its handle.
pub(crate) struct HolderShared {
    /// The holder's own handle, set right after registration.
    pub handle: AtomicU64,
    pub nonsense: AtomicU64,
}

/// A holder handle's value.
pub(crate) struct HolderEntry {
    pub reg: HolderRegistration,
    pub shared: Arc<HolderShared>,
}

/// A region handle's value: the region behind a mutex (grow and shrink
/// need it exclusively) and which thread holds that mutex, to refuse a
/// re-entrant call instead of deadlocking.
pub(crate) struct RegionEntry {
    pub region: Mutex<Region>,
    pub owner: AtomicU64,
}

/// A stream handle's value.
pub(crate) struct StreamEntry {
    pub mechanism: Mechanism,
    pub stream: Mutex<Option<Stream>>,
}

impl Drop for StreamEntry {
    fn drop(&mut self) {
        let stream = self.stream.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let (Some(s), Some(sync)) = (stream, self.mechanism.sync()) {
            // A stream the plugin refuses to destroy stays counted live on
            // its mechanism (visible in unload reports).
            let _ = sync.stream_destroy(s);
        }
    }
}

/// A raw pointer the C caller promised may be used from any thread.
#[derive(Clone, Copy)]
pub(crate) struct UserData(pub *mut c_void);
// SAFETY: the C API documents that userdata is passed to callbacks on any
// thread; making that safe is the caller's contract.
unsafe impl Send for UserData {}
unsafe impl Sync for UserData {}

/// Every table of one manager slot. Never freed; reused by the next manager
/// of the slot, generations included.
pub(crate) struct Tables {
    pub mechanisms: SlotTable<Arc<Context>>,
    pub pools: SlotTable<PoolEntry>,
    pub holders: SlotTable<HolderEntry>,
    pub bindings: SlotTable<MemoryBinding>,
    pub allocations: SlotTable<OwnedAllocation>,
    pub regions: SlotTable<RegionEntry>,
    pub prefixes: SlotTable<Arc<SharedPrefix>>,
    pub streams: SlotTable<StreamEntry>,
    pub fences: SlotTable<SharedFence>,
}

impl Tables {
    fn new() -> Self {
        Tables {
            mechanisms: SlotTable::new(MAX_INDEX),
            pools: SlotTable::new(MAX_INDEX),
            holders: SlotTable::new(MAX_INDEX),
            bindings: SlotTable::new(MAX_INDEX),
            allocations: SlotTable::new(MAX_INDEX),
            regions: SlotTable::new(MAX_INDEX),
            prefixes: SlotTable::new(MAX_INDEX),
            streams: SlotTable::new(MAX_INDEX),
            fences: SlotTable::new(MAX_INDEX),
        }
    }

    /// Drops every object, dependents first.
    pub(crate) fn sweep(&'static self) {
        self.allocations.sweep(drop);
        self.regions.sweep(drop);
        self.prefixes.sweep(drop);
        self.fences.sweep(drop);
        self.streams.sweep(drop);
        self.bindings.sweep(drop);
        self.holders.sweep(drop);
        self.mechanisms.sweep(drop);
        self.pools.sweep(drop);
    }
}

static MANAGERS: LazyTable<ManagerState> = LazyTable::new(MAX_MANAGERS - 1);
static TABLES: [OnceLock<&'static Tables>; MAX_MANAGERS as usize] =
    [const { OnceLock::new() }; MAX_MANAGERS as usize];

pub(crate) fn managers() -> &'static SlotTable<ManagerState> {
    MANAGERS.get()
}

/// The tables of a manager slot, created on first use.
pub(crate) fn tables_of(slot: u32) -> &'static Tables {
    TABLES[slot as usize].get_or_init(|| Box::leak(Box::new(Tables::new())))
}

/// The tables of a manager slot, if any object was ever made there.
#[inline]
pub(crate) fn existing_tables(slot: u32) -> Option<&'static Tables> {
    TABLES.get(slot as usize)?.get().copied()
}

/// A kind of object kept in a manager's tables.
pub(crate) trait Object: Sized + Send + Sync + 'static {
    const KIND: Kind;
    fn table(t: &'static Tables) -> &'static SlotTable<Self>;
}

macro_rules! object {
    ($t:ty, $kind:ident, $field:ident) => {
        impl Object for $t {
            const KIND: Kind = Kind::$kind;
            #[inline]
            fn table(t: &'static Tables) -> &'static SlotTable<Self> {
                &t.$field
            }
        }
    };
}

object!(Arc<Context>, Mechanism, mechanisms);
object!(PoolEntry, Pool, pools);
object!(HolderEntry, Holder, holders);
object!(MemoryBinding, Binding, bindings);
object!(OwnedAllocation, Allocation, allocations);
object!(RegionEntry, Region, regions);
object!(Arc<SharedPrefix>, Prefix, prefixes);
object!(StreamEntry, Stream, streams);
object!(SharedFence, Fence, fences);

#[inline]
fn table_for<T: Object>(bits: u64) -> Result<(&'static SlotTable<T>, Raw)> {
    let raw = handles::expect(bits, T::KIND)?;
    let tables =
        existing_tables(raw.manager).ok_or_else(|| Error::miss(handles::Miss::Invalid, T::KIND, bits))?;
    Ok((T::table(tables), raw))
}

/// Pins the object named by `bits`; also returns its manager slot.
#[inline]
pub(crate) fn pin<T: Object>(bits: u64) -> Result<(Pinned<T>, u32)> {
    let (table, raw) = table_for::<T>(bits)?;
    match table.pin(raw) {
        Ok(p) => Ok((p, raw.manager)),
        Err(m) => Err(Error::miss(m, T::KIND, bits)),
    }
}

/// Removes the object named by `bits` (`Ok(None)` for the zero handle).
#[inline]
pub(crate) fn remove<T: Object>(bits: u64) -> Result<Option<Removed<T>>> {
    if bits == 0 {
        return Ok(None);
    }
    let (table, raw) = table_for::<T>(bits)?;
    match table.remove(raw) {
        Ok(r) => Ok(Some(r)),
        Err(m) => Err(Error::miss(m, T::KIND, bits)),
    }
}

/// The two words stored with the object named by `bits`.
#[inline]
pub(crate) fn meta<T: Object>(bits: u64) -> Result<[u64; 2]> {
    let (table, raw) = table_for::<T>(bits)?;
    table.meta(raw).map_err(|m| Error::miss(m, T::KIND, bits))
}

/// Stores `value` in manager slot `manager`'s table; returns its handle.
#[inline]
pub(crate) fn insert<T: Object>(manager: u32, value: T, meta: [u64; 2]) -> Result<u64> {
    let table = T::table(tables_of(manager));
    match table.insert(value, meta) {
        Ok((index, gen)) => Ok(handles::encode(T::KIND, manager, gen, index)),
        Err(v) => {
            drop(v);
            Err(full(T::KIND))
        }
    }
}

/// A free slot of manager slot `manager`'s table, for a value made next.
#[inline]
pub(crate) fn vacant<T: Object>(manager: u32) -> Result<Vacant<T>> {
    T::table(tables_of(manager)).vacant().ok_or_else(|| full(T::KIND))
}

/// Fills a slot from [`vacant`]; returns the new handle.
#[inline]
pub(crate) fn fill<T: Object>(manager: u32, v: Vacant<T>, value: T, meta: [u64; 2]) -> u64 {
    let (index, gen) = v.fill(value, meta);
    handles::encode(T::KIND, manager, gen, index)
}

/// Removes and drops the object named by `bits` (the zero handle: no-op).
#[inline]
pub(crate) fn remove_drop<T: Object>(bits: u64) -> Result<()> {
    if bits == 0 {
        return Ok(());
    }
    let (table, raw) = table_for::<T>(bits)?;
    table.remove_drop(raw).map_err(|m| Error::miss(m, T::KIND, bits))
}

#[cold]
fn full(kind: Kind) -> Error {
    Error::new(S::LimitReached, format!("this manager has too many live {} handles", kind.name()))
}

/// Pins a manager; returns it and its slot.
pub(crate) fn pin_manager(bits: u64) -> Result<(Pinned<ManagerState>, u32)> {
    let raw = handles::expect(bits, Kind::Manager)?;
    match managers().pin(raw) {
        Ok(p) => Ok((p, raw.manager)),
        Err(m) => Err(Error::miss(m, Kind::Manager, bits)),
    }
}

/// Refuses a handle of another manager than `manager`.
#[inline]
pub(crate) fn same_manager(manager: u32, bits: u64, kind: Kind) -> Result<()> {
    let raw = handles::decode(bits);
    if raw.manager != manager {
        return Err(Error::new(
            S::WrongManager,
            format!("the {} handle {bits:#018x} belongs to another manager", kind.name()),
        ));
    }
    Ok(())
}

thread_local! {
    /// Callbacks of the C caller this thread is running now.
    static IN_CALLBACK: Cell<u32> = const { Cell::new(0) };
    static THREAD_TOKEN: u8 = const { 0 };
}

/// Marks this thread as running a C callback while it lives.
pub(crate) struct CallbackScope(());

impl CallbackScope {
    pub(crate) fn enter() -> CallbackScope {
        let _ = IN_CALLBACK.try_with(|c| c.set(c.get() + 1));
        CallbackScope(())
    }
}

impl Drop for CallbackScope {
    fn drop(&mut self) {
        let _ = IN_CALLBACK.try_with(|c| c.set(c.get().saturating_sub(1)));
    }
}

/// Refuses a call that must not run inside a callback.
pub(crate) fn not_in_callback(what: &str) -> Result<()> {
    if IN_CALLBACK.try_with(|c| c.get()).unwrap_or(0) > 0 {
        return Err(Error::new(
            S::Reentrant,
            format!("{what} is not allowed inside a callback the host is running"),
        ));
    }
    Ok(())
}

/// A number naming this thread among live threads (never 0).
pub(crate) fn thread_token() -> u64 {
    THREAD_TOKEN.with(|t| t as *const u8 as u64)
}

/// Locks a region for this thread, refusing re-entry from a callback run
/// while this thread already holds it.
pub(crate) fn lock_region(entry: &RegionEntry) -> Result<RegionLock<'_>> {
    let me = thread_token();
    if entry.owner.load(Ordering::Acquire) == me {
        return Err(Error::new(
            S::Reentrant,
            "this region's grow is running the callback that made this call",
        ));
    }
    let guard = entry.region.lock().unwrap_or_else(|p| p.into_inner());
    entry.owner.store(me, Ordering::Release);
    Ok(RegionLock { entry, guard })
}

pub(crate) struct RegionLock<'a> {
    entry: &'a RegionEntry,
    pub guard: std::sync::MutexGuard<'a, Region>,
}

impl Drop for RegionLock<'_> {
    fn drop(&mut self) {
        self.entry.owner.store(0, Ordering::Release);
    }
}
