//! Whether the running thread is inside plugin code the host called: set by
//! every call into a plugin (the mechanism door, the entry point, the
//! plugin-level slots), read by host entry points that plugin code could
//! reach on the same thread (the C API refuses them as re-entrant).

use crate::sink::{CallSink, SinkSlot};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What the host keeps per thread: one thread-local, so the door into a
/// plugin pays for one thread-local access.
struct ThreadState {
    /// How many plugin calls the running thread is inside (nested when a
    /// plugin's code reaches the host, which calls a plugin again).
    depth: Cell<u32>,
    /// The thread's seat (`crate::lifecycle::seats`): an index no other
    /// live thread holds, taken the first time the thread needs one and
    /// given back when it exits. Counters kept per seat (the operation
    /// gate, the ledgers, the live-object counts) are written by their
    /// seat's thread only, without read-modify-writes; striped structures
    /// (the cache's shards, a binding's anchors) use it modulo their
    /// stripe count.
    stripe: Cell<u32>,
    /// The thread's message-sink slot at each call depth below
    /// [`SINK_DEPTHS`] (`crate::sink`), taken from the process-wide table
    /// the first time the thread calls at that depth and given back when
    /// it exits.
    sinks: [Cell<Option<&'static SinkSlot>>; SINK_DEPTHS],
    /// The thread's block of object ids: the next to hand out and the end
    /// of the block (`crate::tokens::next_object_id`). Here rather than in
    /// a thread-local of its own, because the allocate path reads this
    /// state anyway and a separate one cost a call per allocation.
    ids: Cell<(u64, u64)>,
}

/// Call depths whose sink slot a thread keeps in [`THREAD`]; deeper ones
/// are kept in [`SINKS_BACK`] (found on a slower path).
const SINK_DEPTHS: usize = 8;

const NO_STRIPE: u32 = u32::MAX;

std::thread_local! {
    static THREAD: ThreadState = const {
        ThreadState {
            depth: Cell::new(0),
            stripe: Cell::new(NO_STRIPE),
            sinks: [const { Cell::new(None) }; SINK_DEPTHS],
            ids: Cell::new((0, 0)),
        }
    };
    /// The thread's sink slots of depths from [`SINK_DEPTHS`] on, and the
    /// one that gives every slot of the thread back when it exits (touched
    /// only when a slot is taken, so that its destructor is registered).
    static SINKS_BACK: SinksBack = const { SinksBack(RefCell::new(Vec::new())) };
    /// Gives the thread's seat back when it exits (touched only when the
    /// seat is taken, so that its destructor is registered).
    static SEAT_BACK: SeatBack = const { SeatBack };
}

struct SeatBack;

impl Drop for SeatBack {
    fn drop(&mut self) {
        let _ = THREAD.try_with(|t| {
            let seat = t.stripe.replace(crate::lifecycle::SHARED_SEAT as u32);
            if seat != NO_STRIPE {
                crate::lifecycle::give_back_seat(seat as usize);
            }
        });
    }
}

struct SinksBack(RefCell<Vec<&'static SinkSlot>>);

impl Drop for SinksBack {
    fn drop(&mut self) {
        // THREAD has no destructor: it is still there.
        let _ = THREAD.try_with(|t| {
            for s in &t.sinks {
                if let Some(slot) = s.take() {
                    slot.give_back();
                }
            }
        });
        for slot in self.0.get_mut().drain(..) {
            slot.give_back();
        }
    }
}

/// The sink slot a call at `depth` uses when the thread has none cached
/// for it.
#[cold]
#[inline(never)]
fn sink_slot_cold(t: &ThreadState, depth: usize) -> &'static SinkSlot {
    // Kept only where the thread can give it back when it exits; from a
    // thread's exit, after its slots went back, the shared overflow slot.
    let kept = SINKS_BACK.try_with(|deep| {
        if depth < SINK_DEPTHS {
            let slot = SinkSlot::acquire();
            t.sinks[depth].set(Some(slot));
            return slot;
        }
        let mut deep = deep.0.borrow_mut();
        while deep.len() <= depth - SINK_DEPTHS {
            deep.push(SinkSlot::acquire());
        }
        deep[depth - SINK_DEPTHS]
    });
    kept.unwrap_or_else(|_| SinkSlot::overflow())
}

impl ThreadState {
    #[inline(always)]
    fn stripe(&self) -> usize {
        let s = self.stripe.get();
        if s != NO_STRIPE {
            return s as usize;
        }
        self.first_stripe()
    }

    /// Takes a seat for the thread, where it can give it back when it
    /// exits; a thread already exiting (its seat given back) shares the
    /// shared seat from then on.
    #[cold]
    fn first_stripe(&self) -> usize {
        let seat =
            SEAT_BACK.try_with(|_| crate::lifecycle::take_seat()).unwrap_or(crate::lifecycle::SHARED_SEAT);
        self.stripe.set(seat as u32);
        seat
    }
}

/// Process-unique object ids without a shared counter on the hot path:
/// each thread takes a block of ids at a time (`NEXT_BLOCK`), then counts
/// in its own state. Never 0.
#[inline(always)]
pub(crate) fn next_object_id() -> u64 {
    THREAD.with(|t| {
        let (next, end) = t.ids.get();
        if next != end {
            t.ids.set((next + 1, end));
            return next;
        }
        new_id_block(t)
    })
}

#[cold]
#[inline(never)]
fn new_id_block(t: &ThreadState) -> u64 {
    const BLOCK: u64 = 1 << 16;
    static NEXT_BLOCK: AtomicU64 = AtomicU64::new(1);
    let next = NEXT_BLOCK.fetch_add(BLOCK, Relaxed);
    t.ids.set((next + 1, next + BLOCK));
    next
}

/// The running thread's seat: unique among live threads, or
/// [`SHARED_SEAT`](crate::lifecycle::SHARED_SEAT) (see
/// `crate::lifecycle::seats`).
#[inline(always)]
pub(crate) fn thread_stripe() -> usize {
    THREAD.with(ThreadState::stripe)
}

/// Whether the running thread is inside a call into plugin code made by
/// this host: a slot of any mechanism or a plugin's entry point. True, for
/// example, in a host function a plugin runs inline inside
/// `enqueue_host_fn`, or in a C API function a plugin calls from a slot; false
/// on a plugin's own worker threads, which are not inside a call from the
/// host. One thread-local load.
#[inline]
pub fn inside_plugin_call() -> bool {
    THREAD.with(|t| t.depth.get() != 0)
}

/// Marks the running thread as inside plugin code while it lives.
pub(crate) struct InPluginCall(());

impl InPluginCall {
    #[inline(always)]
    pub(crate) fn enter() -> InPluginCall {
        // Cannot overflow: each level is a plugin call on this thread's
        // stack, which runs out long before u32 does.
        THREAD.with(|t| t.depth.set(t.depth.get().wrapping_add(1)));
        InPluginCall(())
    }
}

impl InPluginCall {
    /// [`enter`](Self::enter), also returning the thread's stripe and the
    /// message sink slot of the call (not yet begun): the door needs all
    /// three, for one thread-local access.
    #[inline(always)]
    pub(crate) fn enter_call() -> (InPluginCall, usize, SinkFor) {
        let (stripe, sink) = THREAD.with(|t| {
            let depth = t.depth.get();
            t.depth.set(depth.wrapping_add(1));
            let slot = match t.sinks.get(depth as usize).and_then(Cell::get) {
                Some(slot) => slot,
                None => sink_slot_cold(t, depth as usize),
            };
            (t.stripe(), SinkFor(slot))
        });
        (InPluginCall(()), stripe, sink)
    }
}

/// The sink slot of one call, before it begins.
pub(crate) struct SinkFor(&'static SinkSlot);

impl SinkFor {
    /// Starts the call's sink (see [`SinkSlot::begin`]).
    #[inline(always)]
    pub(crate) fn begin(self) -> CallSink {
        self.0.begin()
    }
}

impl Drop for InPluginCall {
    #[inline(always)]
    fn drop(&mut self) {
        THREAD.with(|t| t.depth.set(t.depth.get().wrapping_sub(1)));
    }
}
