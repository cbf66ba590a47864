//! What ties handles to managers: the process-wide manager table, the
//! tables of every manager seat (one [`SlotTable`] per kind of object), the
//! values stored in them, and resolving a handle to its value.
//!
//! A manager *seat* is a manager's index in the manager table; it is also
//! the `manager` field of every handle issued through that manager. A
//! seat's tables are never freed: a manager created later in the same seat
//! reuses them, generations included, so a handle of a destroyed manager
//! stays stale forever.

use crate::error::{Error, Result};
use crate::handle::{self, Kind, Raw, MAX_INDEX, MAX_MANAGERS};
use crate::slot_table::{LazyTable, Miss, Pinned, Removed, SlotTable, Vacant};
use crate::status::MemplugHostStatus as S;
use memplug_host_dep::governor::{HolderRegistration, Pool};
use memplug_host_dep::registry::Context;
use memplug_host_dep::{
    CachedAllocation, Mechanism, MemoryBinding, OwnedAllocation, ProcessMemoryManager, Region, SharedFence,
    SharedPrefix, Stream,
};
use std::sync::atomic::Ordering::{AcqRel, Acquire};
use std::sync::atomic::{AtomicPtr, AtomicU64};
use std::sync::{Arc, Mutex};

/// A manager, as its seat holds it.
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
    /// Answers larger than everything the pool had charged when the ticket
    /// was issued, clamped to that figure (`nonsense_answers` of
    /// `MemplugHostHolderStats`).
    pub answers_above_pool_use: AtomicU64,
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

/// A fence handle's value: the fence every free waits on, and — for one
/// recorded on a stream (`memplug_host_fence_record`) — the plugin's fence
/// itself, which `memplug_host_stream_wait_fence` hands to the plugin.
pub(crate) struct FenceEntry {
    pub fence: SharedFence,
    pub recorded: Option<Arc<memplug_host_dep::PluginFence>>,
}

/// A subscription handle's value: dropping it ends the subscription
/// (`crate::lifecycle`).
/// What a subscription entry ends when it is removed (a lifecycle
/// subscriber); a trait, so the tables need not know the subscriber's type.
pub(crate) trait Closes: Send + Sync {
    fn close(&self);
}

/// A caching binding handle's object (`capi/src/cache.rs`).
pub(crate) struct CacheEntry {
    pub cache: memplug_host_dep::CachingBinding,
}

pub(crate) struct SubscriptionEntry {
    pub subscriber: Arc<dyn Closes>,
}

impl Drop for SubscriptionEntry {
    fn drop(&mut self) {
        self.subscriber.close();
    }
}

/// Every table of one manager seat. Never freed; reused by the next manager
/// of the seat, generations included.
pub(crate) struct Tables {
    pub mechanisms: SlotTable<Arc<Context>>,
    pub pools: SlotTable<PoolEntry>,
    pub holders: SlotTable<HolderEntry>,
    pub bindings: SlotTable<MemoryBinding>,
    pub allocations: SlotTable<OwnedAllocation>,
    pub regions: SlotTable<RegionEntry>,
    pub prefixes: SlotTable<Arc<SharedPrefix>>,
    pub streams: SlotTable<StreamEntry>,
    pub fences: SlotTable<FenceEntry>,
    pub subscriptions: SlotTable<SubscriptionEntry>,
    pub caches: SlotTable<CacheEntry>,
    pub cached: SlotTable<CachedAllocation>,
    pub nodes: SlotTable<crate::node::NodeEntry>,
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
            subscriptions: SlotTable::new(MAX_INDEX),
            caches: SlotTable::new(MAX_INDEX),
            cached: SlotTable::new(MAX_INDEX),
            nodes: SlotTable::new(MAX_INDEX),
        }
    }

    /// Drops every object, dependents first.
    pub(crate) fn sweep(&'static self) {
        // Subscriptions first: no lifecycle callback runs once the objects
        // below start going.
        self.subscriptions.sweep(drop);
        // Node links and authorities next: a link leaves (its idle budget
        // back to the authority) while its pools still work.
        self.nodes.sweep(drop);
        self.cached.sweep(drop);
        self.caches.sweep(drop);
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
/// Each seat's tables, null until first made; never freed once made. A
/// pointer, not a `OnceLock`: every C call reads its handle's seat here,
/// and a load and a null test cost less than the lock's state and value
/// (callgrind).
static TABLES: [AtomicPtr<Tables>; MAX_MANAGERS as usize] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_MANAGERS as usize];

pub(crate) fn managers() -> &'static SlotTable<ManagerState> {
    MANAGERS.get()
}

/// The tables of a manager seat, created on first use.
pub(crate) fn tables_of(seat: u32) -> &'static Tables {
    if let Some(t) = existing_tables(seat) {
        return t;
    }
    let fresh = Box::into_raw(Box::new(Tables::new()));
    match TABLES[seat as usize].compare_exchange(std::ptr::null_mut(), fresh, AcqRel, Acquire) {
        // SAFETY: just leaked; published for the process's life.
        Ok(_) => unsafe { &*fresh },
        Err(won) => {
            // Another thread made them first: ours were never shared.
            // SAFETY: `fresh` came from Box::into_raw above and nobody else
            // saw it.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: published by the winner, never freed.
            unsafe { &*won }
        }
    }
}

/// The tables of a manager seat, if any object was ever made there.
#[inline]
pub(crate) fn existing_tables(seat: u32) -> Option<&'static Tables> {
    let p = TABLES.get(seat as usize)?.load(Acquire);
    // SAFETY: non-null only once published by `tables_of` (made before the
    // release store, never freed).
    (!p.is_null()).then(|| unsafe { &*p })
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
object!(FenceEntry, Fence, fences);
object!(SubscriptionEntry, Subscription, subscriptions);
object!(CacheEntry, Cache, caches);
object!(CachedAllocation, CachedAllocation, cached);
object!(crate::node::NodeEntry, Node, nodes);

#[inline(always)]
fn table_for<T: Object>(bits: u64) -> Result<(&'static SlotTable<T>, Raw)> {
    let (tables, raw) = tables_for::<T>(bits)?;
    Ok((T::table(tables), raw))
}

#[inline(always)]
fn tables_for<T: Object>(bits: u64) -> Result<(&'static Tables, Raw)> {
    let raw = handle::expect(bits, T::KIND)?;
    let tables = existing_tables(raw.manager).ok_or_else(|| Error::miss(Miss::Invalid, T::KIND, bits))?;
    Ok((tables, raw))
}

/// [`pin`], also returning the seat's tables, for a [`vacant_in`] of the
/// object made next in the same seat (an allocation of a binding): the
/// seat's tables are looked up once, not twice.
#[inline(always)]
pub(crate) fn pin_with_tables<T: Object>(bits: u64) -> Result<(Pinned<T>, u32, &'static Tables)> {
    let (tables, raw) = tables_for::<T>(bits)?;
    match T::table(tables).pin(raw.key()) {
        Ok(p) => Ok((p, raw.manager, tables)),
        Err(m) => Err(Error::miss(m, T::KIND, bits)),
    }
}

/// [`pin_with_tables`] of a handle already decoded as `raw` (by
/// [`handle::expect`]); also returns the seat's tables.
#[inline(always)]
pub(crate) fn pin_raw<T: Object>(raw: Raw, bits: u64) -> Result<(Pinned<T>, &'static Tables)> {
    let tables = existing_tables(raw.manager).ok_or_else(|| Error::miss(Miss::Invalid, T::KIND, bits))?;
    match T::table(tables).pin(raw.key()) {
        Ok(p) => Ok((p, tables)),
        Err(m) => Err(Error::miss(m, T::KIND, bits)),
    }
}

/// [`vacant`] in tables from [`pin_with_tables`].
#[inline]
pub(crate) fn vacant_in<T: Object>(tables: &'static Tables) -> Result<Vacant<T>> {
    T::table(tables).vacant().ok_or_else(|| full(T::KIND))
}

/// Pins the object named by `bits`; also returns its manager seat.
/// Always inlined (as `SlotTable::pin`): every call of a handle's object
/// goes through here, and out of line it cost a frame and a result moved
/// through memory.
#[inline(always)]
pub(crate) fn pin<T: Object>(bits: u64) -> Result<(Pinned<T>, u32)> {
    let (table, raw) = table_for::<T>(bits)?;
    match table.pin(raw.key()) {
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
    match table.remove(raw.key()) {
        Ok(r) => Ok(Some(r)),
        Err(m) => Err(Error::miss(m, T::KIND, bits)),
    }
}

/// The two words stored with the object named by `bits`.
#[inline]
pub(crate) fn meta<T: Object>(bits: u64) -> Result<[u64; 2]> {
    let (table, raw) = table_for::<T>(bits)?;
    table.meta(raw.key()).map_err(|m| Error::miss(m, T::KIND, bits))
}

/// The last step of every function that makes an object: stores `value`
/// in its table ([`insert`]) and writes its handle to `out`.
///
/// # Safety
/// `out` is non-NULL and writable (the caller checked it).
pub(crate) unsafe fn issue<T: Object, H>(
    seat: u32,
    value: T,
    meta: [u64; 2],
    out: *mut H,
    handle: fn(u64) -> H,
) -> Result<()> {
    let id = insert(seat, value, meta)?;
    // SAFETY: the caller's.
    unsafe { crate::error::write_out(out, handle(id)) };
    Ok(())
}

/// Stores `value` in the table of manager seat `seat`; returns its handle.
#[inline]
pub(crate) fn insert<T: Object>(seat: u32, value: T, meta: [u64; 2]) -> Result<u64> {
    let table = T::table(tables_of(seat));
    match table.insert(value, meta) {
        Ok((index, gen)) => Ok(handle::encode(T::KIND, seat, gen, index)),
        Err(v) => {
            drop(v);
            Err(full(T::KIND))
        }
    }
}

/// A free slot of the table of manager seat `seat`, for a value made next.
#[inline]
pub(crate) fn vacant<T: Object>(seat: u32) -> Result<Vacant<T>> {
    T::table(tables_of(seat)).vacant().ok_or_else(|| full(T::KIND))
}

/// Fills a slot from [`vacant`]; returns the new handle.
#[inline]
pub(crate) fn fill<T: Object>(seat: u32, v: Vacant<T>, value: T, meta: [u64; 2]) -> u64 {
    let (index, gen) = v.fill(value, meta);
    handle::encode(T::KIND, seat, gen, index)
}

/// [`fill`] with the value a maker returned (`made`), for the allocating
/// calls: `Err` is handed back (the slot goes back with `v`), `Ok` moves
/// into the slot straight from the maker's result, with the two words
/// `meta` reads from it; returns the new handle and those words. Always
/// inlined, and moving the value once: unpacked with `?` first, the
/// allocation (72 bytes) was copied twice more on its way into the slot
/// (callgrind).
#[inline(always)]
pub(crate) fn fill_made<T: Object, E>(
    seat: u32,
    v: Vacant<T>,
    made: std::result::Result<T, E>,
    meta: impl FnOnce(&T) -> [u64; 2],
) -> std::result::Result<(u64, [u64; 2]), E> {
    let made = std::mem::ManuallyDrop::new(made);
    match &*made {
        Ok(value) => {
            let words = meta(value);
            // SAFETY: `made` is never dropped nor read again: its value
            // moves out once, here.
            let value = unsafe { std::ptr::read(value) };
            Ok((fill(seat, v, value, words), words))
        }
        // SAFETY: as above, for the error.
        Err(e) => Err(unsafe { std::ptr::read(e) }),
    }
}

/// Takes the object named by `bits` out of its table to own it (`Ok(None)`
/// for the zero handle), waiting for readers that pinned it for a moment
/// (pins of such objects are a few instructions long and call nothing).
/// Always inlined: out of line, the object (an allocation: 72 bytes) was
/// copied through the result twice more on its way to its consumer.
#[inline(always)]
pub(crate) fn take_unpinned<T: Object>(bits: u64) -> Result<Option<T>> {
    if bits == 0 {
        return Ok(None);
    }
    let (tables, raw) = tables_for::<T>(bits)?;
    take_unpinned_in(tables, raw, bits).map(Some)
}

/// [`take_unpinned`] of a handle already decoded as `raw` (by
/// [`handle::expect`]), in its seat's `tables` (a caller that looked them
/// up for another object of the seat: each lookup and decode done once).
#[inline(always)]
pub(crate) fn take_unpinned_in<T: Object>(tables: &'static Tables, raw: Raw, bits: u64) -> Result<T> {
    let table = T::table(tables);
    loop {
        match table.try_take(raw.key()) {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => std::thread::yield_now(),
            Err(m) => return Err(Error::miss(m, T::KIND, bits)),
        }
    }
}

/// [`take_unpinned_in`] for a caller that would change the object and
/// drop it (`SlotTable::try_take_drop`): `then` runs on it in its slot,
/// which drops it there, with no move.
#[inline(always)]
pub(crate) fn take_unpinned_drop_in<T: Object>(
    tables: &'static Tables,
    raw: Raw,
    bits: u64,
    then: impl FnOnce(&mut T),
) -> Result<()> {
    let table = T::table(tables);
    let mut then = then;
    loop {
        match table.try_take_drop(raw.key(), then) {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(back)) => {
                then = back;
                std::thread::yield_now();
            }
            Err(m) => return Err(Error::miss(m, T::KIND, bits)),
        }
    }
}

/// Runs `f` with exclusive use of the object named by `bits`, for the few
/// calls that must change an object in place (recording UCX work on an
/// allocation): pins of it wait until `f` returns, and a free meanwhile
/// makes the handle stale at once and drops the object after `f`.
pub(crate) fn exclusive<T: Object, R>(bits: u64, f: impl FnOnce(&mut T) -> R) -> Result<R> {
    let (table, raw) = table_for::<T>(bits)?;
    table.with_exclusive(raw.key(), f).map_err(|m| Error::miss(m, T::KIND, bits))
}

/// Removes and drops the object named by `bits` (the zero handle: no-op).
#[inline]
pub(crate) fn remove_drop<T: Object>(bits: u64) -> Result<()> {
    if bits == 0 {
        return Ok(());
    }
    let (table, raw) = table_for::<T>(bits)?;
    table.remove_drop(raw.key()).map_err(|m| Error::miss(m, T::KIND, bits))
}

#[cold]
fn full(kind: Kind) -> Error {
    Error::new(S::LimitReached, format!("this manager has too many live {} handles", kind.name()))
}

/// Pins a manager; returns it and its seat.
pub(crate) fn pin_manager(bits: u64) -> Result<(Pinned<ManagerState>, u32)> {
    let raw = handle::expect(bits, Kind::Manager)?;
    match managers().pin(raw.key()) {
        Ok(p) => Ok((p, raw.manager)),
        Err(m) => Err(Error::miss(m, Kind::Manager, bits)),
    }
}

/// Refuses a handle of another manager than the one in seat `seat`.
#[inline]
pub(crate) fn same_manager(seat: u32, bits: u64, kind: Kind) -> Result<()> {
    let raw = handle::decode(bits);
    if raw.manager != seat {
        return Err(wrong_manager(bits, kind));
    }
    Ok(())
}

/// [`same_manager`]'s refusal.
#[cold]
pub(crate) fn wrong_manager(bits: u64, kind: Kind) -> Error {
    Error::new(S::WrongManager, format!("the {} handle {bits:#018x} belongs to another manager", kind.name()))
}
