//! The one door into a plugin. Every slot call of every capability goes
//! through [`MechanismInner::call`]: it builds the message sink, calls the
//! slot, and maps the status. This is the only `unsafe` call into plugin
//! code on the host's hot paths, so the argument for its soundness is made
//! once, here, and anything every call must do (the operation gate of a
//! context, for example) has one place to go.
//!
//! The door also marks the calling thread as inside plugin code for the
//! length of the call ([`crate::inside_plugin_call`]), so a host entry point that
//! plugin code reaches on the same thread (a host function the plugin runs
//! inline, a C API call from inside a slot) can tell it is being re-entered.

use super::blocks::BlockIndex;
use super::MechanismInner;
use crate::error::{CallError, ReleaseError};
use crate::events::Level;
use crate::reentry::InPluginCall;
use crate::sink::Capture;
use crate::tokens::RawObject;
use memplug_sdk::abi::{
    MemplugHostFn, MemplugMessageSink, MemplugObjectRef, MemplugStatus, MEMPLUG_STATUS_OK,
};
use memplug_sdk::Status;
use std::ffi::c_void;

/// An argument a slot receives, in the safe form the host holds it in.
///
/// References become pointers that are valid, aligned and live for the
/// whole call (the borrow outlives it). An owned struct (an object
/// reference the host built for this call) is held by [`Slot::invoke`]'s
/// frame and passed by pointer, so it too lives until the call returns.
/// Plain values are passed as they are.
pub(crate) trait SlotArg {
    type Raw;
    fn as_raw(&mut self) -> Self::Raw;
}

impl<T> SlotArg for &T {
    type Raw = *const T;
    #[inline(always)]
    fn as_raw(&mut self) -> *const T {
        *self
    }
}

impl<T> SlotArg for &mut T {
    type Raw = *mut T;
    #[inline(always)]
    fn as_raw(&mut self) -> *mut T {
        &mut **self
    }
}

impl SlotArg for MemplugObjectRef {
    type Raw = *const MemplugObjectRef;
    #[inline(always)]
    fn as_raw(&mut self) -> *const MemplugObjectRef {
        self
    }
}

macro_rules! plain_arg {
    ($($t:ty),*) => {$(
        impl SlotArg for $t {
            type Raw = $t;
            #[inline(always)]
            fn as_raw(&mut self) -> $t {
                *self
            }
        }
    )*};
}
plain_arg!(u32, u64, i32, MemplugHostFn);

/// A pointer the plugin interprets and the host never dereferences: a
/// runtime's native stream (`stream_adopt`, whose caller vouches for it) or
/// the id of a host function (`enqueue_host_fn`), never host memory.
#[derive(Clone, Copy)]
pub(crate) struct Opaque(pub(crate) *mut c_void);

impl SlotArg for Opaque {
    type Raw = *mut c_void;
    #[inline(always)]
    fn as_raw(&mut self) -> *mut c_void {
        self.0
    }
}

/// Whether the caller of the door already holds a token of the
/// mechanism's gate (`Yes` carries the proof), or the door takes one.
#[derive(Clone, Copy)]
pub(crate) enum Held<'t> {
    No,
    // Never read: the borrow is the proof that the token lives for the call.
    Yes(#[allow(dead_code)] &'t crate::lifecycle::Token<'t>),
}

/// A slot function pointer of one ABI signature, callable with its
/// arguments in safe form. Implemented for every signature shape the ABI
/// has: `(ctx, args..., sink) -> status`.
pub(crate) trait Slot<Args> {
    /// # Safety
    /// `self` is a slot of a validated table of the mechanism whose `ctx`
    /// is passed, and its library is loaded for the duration of the call.
    unsafe fn invoke(self, ctx: *mut c_void, args: Args, sink: *const MemplugMessageSink) -> MemplugStatus;
}

macro_rules! slot_shape {
    ($($a:ident),*) => {
        impl<$($a: SlotArg),*> Slot<($($a,)*)>
            for unsafe extern "C" fn(*mut c_void, $($a::Raw,)* *const MemplugMessageSink) -> MemplugStatus
        {
            #[inline(always)]
            #[allow(non_snake_case)]
            unsafe fn invoke(
                self,
                ctx: *mut c_void,
                ($(mut $a,)*): ($($a,)*),
                sink: *const MemplugMessageSink,
            ) -> MemplugStatus {
                self(ctx, $($a.as_raw(),)* sink)
            }
        }
    };
}
slot_shape!();
slot_shape!(A);
slot_shape!(A, B);
slot_shape!(A, B, C);
slot_shape!(A, B, C, D);
slot_shape!(A, B, C, D, E);
slot_shape!(A, B, C, D, E, F);
slot_shape!(A, B, C, D, E, F, G, H);

impl MechanismInner {
    /// Calls `slot` of this mechanism with `args`: `Ok` on
    /// `MEMPLUG_STATUS_OK`, else a [`CallError`] carrying the plugin's
    /// message (an unknown code mapped to `Internal`, kept raw).
    #[inline(always)]
    pub(crate) fn call<A>(&self, name: &'static str, slot: impl Slot<A>, args: A) -> Result<(), CallError> {
        self.call_in(Held::No, name, slot, args)
    }

    /// [`call`](Self::call), for a caller that may already hold a token of
    /// this mechanism's gate (a binding transaction, `Held::Yes`): then the
    /// door takes none of its own.
    #[inline(always)]
    pub(crate) fn call_in<A>(
        &self,
        held: Held,
        name: &'static str,
        slot: impl Slot<A>,
        args: A,
    ) -> Result<(), CallError> {
        let mut cap = Capture::default();
        let raw = self.invoke(held, slot, args, &mut cap);
        if raw == MEMPLUG_STATUS_OK {
            if cap.has_message() {
                self.said(Level::Info, &cap);
            }
            Ok(())
        } else {
            self.said(Level::Warn, &cap);
            Err(self.failure(name, raw, cap.take()))
        }
    }

    /// [`call`](Self::call) for a slot one of whose failure codes is an
    /// answer: `Ok(true)` on success, `Ok(false)` when the plugin returned
    /// `answer` (no message is kept: polling stays cheap), else the error.
    #[inline(always)]
    pub(crate) fn call_answer<A>(
        &self,
        name: &'static str,
        slot: impl Slot<A>,
        args: A,
        answer: MemplugStatus,
    ) -> Result<bool, CallError> {
        let mut cap = Capture::default();
        let raw = self.invoke(Held::No, slot, args, &mut cap);
        if raw == MEMPLUG_STATUS_OK {
            if cap.has_message() {
                self.said(Level::Info, &cap);
            }
            Ok(true)
        } else if raw == answer {
            Ok(false)
        } else {
            self.said(Level::Warn, &cap);
            Err(self.failure(name, raw, cap.take()))
        }
    }

    #[inline(always)]
    fn invoke<A>(&self, held: Held, slot: impl Slot<A>, args: A, cap: &mut Capture) -> MemplugStatus {
        // The capture stays in the caller's frame (not moved out with the
        // status); the sink is the thread's slot for this call depth
        // (crate::sink), so a success costs its generation's stores and the
        // test of its `pending` flag.
        // SAFETY: every slot pointer the host holds was read from a table
        // the loader validated (non-NULL where called: required slots are
        // checked at load, optional ones are `Option`s matched by the
        // caller), and it is called with the `ctx` published beside that
        // table. The `*Api` types that reach here borrow this
        // `MechanismInner`, whose last field keeps the library loaded, so
        // the code and `ctx` are alive for the call. Pointer arguments come
        // from references (`SlotArg`), valid and live until the call
        // returns; structs the host passes carry the `struct_size` of the
        // type it allocated, so the plugin never reads or writes past them.
        // The sink lives in a slot that is never freed, and a write into
        // it after the call returned is dropped (crate::sink). The ABI
        // requires each slot to be callable from any thread and never to
        // unwind.
        let (_inside, stripe, sink) = InPluginCall::enter_call();
        // The operation gate (crate::lifecycle): a lost or terminated
        // context is not called; termination waits for this token (or for
        // the caller's, which covers this call).
        let _token = match held {
            Held::Yes(_) => None,
            Held::No => match self.life.gate.enter(stripe) {
                Ok(t) => Some(t),
                Err(state) => return self.closed_door(state, cap),
            },
        };
        let call = sink.begin();
        let raw = unsafe { slot.invoke(self.ctx, args, call.abi()) };
        call.finish(cap);
        raw
    }

    /// The door of a lost or terminated context: the plugin is not called;
    /// the caller gets DEVICE_LOST with the recorded reason, or
    /// INVALID_STATE where the context retired and terminated in order.
    #[cold]
    #[inline(never)]
    fn closed_door(&self, state: crate::lifecycle::LifeState, cap: &mut Capture) -> MemplugStatus {
        let why = self.life.reason().unwrap_or_else(|| "no reason was given".into());
        let status = self.life.refusal_status(state);
        let went = if status == Status::DeviceLost { "its objects went with it" } else { "it was retired" };
        cap.set(format!(
            "the host no longer calls mechanism {}: its context is {state} ({why}); {went}",
            self.label
        ));
        status.raw()
    }

    /// Gives an object back to its mechanism through `slot`: on success the
    /// object is counted dead; on failure it comes back to the caller in
    /// the error, still alive and counted (invariant 7: never forgotten).
    #[inline(always)]
    pub(crate) fn release_object<T: std::fmt::Debug, A>(
        &self,
        held: Held,
        name: &'static str,
        object: T,
        kind: crate::error::ObjectKind,
        slot: impl Slot<A>,
        args: impl FnOnce(&T) -> Result<A, CallError>,
    ) -> Result<(), ReleaseError<T>> {
        let args = match args(&object) {
            Ok(a) => a,
            Err(error) => return Err(ReleaseError { object, error }),
        };
        match self.call_in(held, name, slot, args) {
            Ok(()) => {
                self.died(kind);
                Ok(())
            }
            Err(error) => Err(ReleaseError { object, error }),
        }
    }

    /// [`release_object`](Self::release_object) for an object with an
    /// address (an allocation or a reservation): it leaves the index of
    /// live blocks before the plugin frees it, so the plugin may hand the
    /// address out again at once, and comes back if the plugin refuses.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn release_block<T: std::fmt::Debug, A>(
        &self,
        held: Held,
        name: &'static str,
        object: T,
        raw: fn(&T) -> &RawObject,
        kind: crate::error::ObjectKind,
        slot: impl Slot<A>,
        args: impl FnOnce(&T) -> Result<A, CallError>,
    ) -> Result<(), ReleaseError<T>> {
        match &self.blocks {
            Some(ix) if self.indexes(kind) => {
                self.release_indexed(held, ix, name, object, raw, kind, slot, args)
            }
            _ => self.release_object(held, name, object, kind, slot, args),
        }
    }

    // Out of line and marked cold: only a mechanism loaded with
    // `check_overlaps` goes here, and the unchecked path stays as it was.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn release_indexed<T: std::fmt::Debug, A>(
        &self,
        token: Held,
        ix: &BlockIndex,
        name: &'static str,
        object: T,
        raw: fn(&T) -> &RawObject,
        kind: crate::error::ObjectKind,
        slot: impl Slot<A>,
        args: impl FnOnce(&T) -> Result<A, CallError>,
    ) -> Result<(), ReleaseError<T>> {
        // A foreign object is refused below, before the plugin sees it; it
        // has no entry here (object ids are unique in the process).
        let held = if raw(&object).mechanism_key == self.key { ix.forget(raw(&object)) } else { None };
        let r = self.release_object(token, name, object, kind, slot, args);
        if let (Err(e), Some(b)) = (&r, held) {
            ix.restore(raw(&e.object), b);
        }
        r
    }

    /// Sends what the plugin wrote during a call (if it wrote anything) to
    /// the log hook of the manager its plugin is registered with.
    #[cold]
    #[inline(never)]
    fn said(&self, level: Level, cap: &Capture) {
        if let Some(m) = cap.plugin_message() {
            self.log(level, m);
        }
    }

    /// Logs `message` as this mechanism's (see `crate::events`).
    #[cold]
    pub(crate) fn log(&self, level: Level, message: &str) {
        let hub = self.plugin.hub.get();
        crate::events::plugin_message(hub.as_deref(), level, &self.label, message);
    }

    /// The plugin's failure as a [`CallError`]; an unknown code is mapped
    /// to `Internal` and kept raw.
    #[cold]
    pub(crate) fn failure(
        &self,
        slot: &'static str,
        raw: MemplugStatus,
        message: Option<String>,
    ) -> CallError {
        let mut status = Status::from_raw_conservative(raw);
        if status == Status::DeviceLost {
            // A code of 1.2: from a plugin that agreed on less, it is a
            // number that plugin cannot mean.
            if self.minor < 2 && self.life.state().admits_calls() {
                status = Status::Internal;
            } else {
                let text = message.as_deref().unwrap_or("no message");
                self.life.report_lost(format!("slot {slot} answered MEMPLUG_STATUS_DEVICE_LOST: {text}"));
            }
        }
        CallError {
            status,
            raw,
            slot,
            mechanism: self.label.clone(),
            message: message.unwrap_or_else(|| "the plugin gave no message".into()),
        }
    }

    /// Refuses a call that would make a new object (a stream) unless the
    /// context is `Active`: `INVALID_STATE` while it retires, `DEVICE_LOST`
    /// once it is lost (see [`Lifecycle::refusal_status`](crate::lifecycle::Lifecycle::refusal_status)).
    #[inline]
    pub(crate) fn refuse_unless_active(&self, slot: &'static str) -> Result<(), CallError> {
        let state = self.life.state();
        if state == crate::lifecycle::LifeState::Active {
            return Ok(());
        }
        let why = self.life.reason().unwrap_or_else(|| "no reason was given".into());
        Err(self.refuse(
            slot,
            self.life.refusal_status(state),
            format!("the context of {} is {state} ({why}): it makes no new objects", self.label),
        ))
    }

    /// A call the host refused on the plugin's behalf (the plugin was not
    /// called).
    #[cold]
    pub(crate) fn refuse(&self, slot: &'static str, status: Status, message: String) -> CallError {
        CallError { status, raw: status.raw(), slot, mechanism: self.label.clone(), message }
    }

    /// Refuses, before the plugin sees it, a range that is empty, not
    /// granularity-aligned, overflowing, or past the end of its object: the
    /// host knows the object's size and the granularity, so a plugin that
    /// forgets a check cannot be handed an address outside what it made.
    #[inline]
    pub(crate) fn check_range(
        &self,
        slot: &'static str,
        what: &str,
        size: u64,
        offset: u64,
        len: u64,
    ) -> Result<(), CallError> {
        let g = self.props.granularity.max(1);
        let fits = offset.checked_add(len).is_some_and(|end| end <= size);
        if len != 0 && offset % g == 0 && len % g == 0 && fits {
            return Ok(());
        }
        Err(self.bad_range(slot, what, size, offset, len))
    }

    /// How many bytes more than asked a block may say it has: its size
    /// rounded up to the largest of the granularity, `max_alignment`,
    /// 4096 and the requested page size, plus the larger of the
    /// granularity and 2 MiB (a size class or a huge page; never orders of
    /// magnitude). The rule of the conformance kit's
    /// `allocator.block_size_sane`.
    #[inline(always)]
    pub(crate) fn size_room(&self, page_size: u64) -> u64 {
        let p = &self.props;
        let unit = p.granularity.max(p.max_alignment).max(4096).max(page_size);
        unit.saturating_add(p.granularity.max(2 << 20))
    }

    /// Refuses a block (`Internal`, both sizes in the message) whose size
    /// is less than asked or more than the mechanism's published rounding
    /// allows ([`size_room`](Self::size_room)); `known` is a size the host
    /// learnt elsewhere that the block may have too (an imported file's
    /// length), or 0. A refused block is not counted, charged or freed:
    /// the host cannot know what the plugin made (§2, invariant 7).
    #[inline(always)]
    pub(crate) fn check_block_size(
        &self,
        slot: &'static str,
        what: &str,
        asked: u64,
        got: u64,
        page_size: u64,
        known: u64,
    ) -> Result<(), CallError> {
        // The room is never less than 2 MiB: most blocks pass here, at the
        // cost of a subtraction and a compare.
        if got >= asked && got - asked <= 2 << 20 {
            return Ok(());
        }
        self.check_block_size_slow(slot, what, asked, got, page_size, known)
    }

    #[cold]
    #[inline(never)]
    fn check_block_size_slow(
        &self,
        slot: &'static str,
        what: &str,
        asked: u64,
        got: u64,
        page_size: u64,
        known: u64,
    ) -> Result<(), CallError> {
        let room = self.size_room(page_size);
        if got >= asked && (got - asked <= room || (known != 0 && got <= known.saturating_add(room))) {
            return Ok(());
        }
        Err(self.bad_size(slot, what, asked, got, room, known))
    }

    #[cold]
    fn bad_size(
        &self,
        slot: &'static str,
        what: &str,
        asked: u64,
        got: u64,
        room: u64,
        known: u64,
    ) -> CallError {
        crate::faults::count(&crate::faults::REFUSED_BLOCK_SIZES);
        let rule = if got < asked {
            "fewer than asked".to_string()
        } else {
            let also =
                if known != 0 { format!(" (or of the {known} bytes the handle has)") } else { String::new() };
            format!(
                "more than its published rounding allows: at most {room} bytes over the request{also} \
                 (granularity {}, max_alignment {})",
                self.props.granularity, self.props.max_alignment
            )
        };
        self.refuse(
            slot,
            Status::Internal,
            format!(
                "plugin reported success but returned {what} of {got} bytes ({got:#x}) for a request of {asked} \
                 bytes: {rule}; the block is not trusted, not counted, not charged and not freed"
            ),
        )
    }

    #[cold]
    fn bad_range(&self, slot: &'static str, what: &str, size: u64, offset: u64, len: u64) -> CallError {
        let g = self.props.granularity;
        self.refuse(
            slot,
            Status::OutOfRange,
            format!(
                "range +{offset:#x} len {len:#x} of the {what} ({size:#x} bytes) is empty, not aligned to \
                 the granularity {g:#x}, overflowing, or out of bounds"
            ),
        )
    }

    /// The object's ABI reference, after checking that this mechanism made
    /// it (invariant 1): a foreign token is refused before the plugin sees
    /// it.
    #[inline]
    pub(crate) fn ref_if_made_here(
        &self,
        slot: &'static str,
        raw: &RawObject,
    ) -> Result<MemplugObjectRef, CallError> {
        if raw.mechanism_key != self.key {
            return Err(self.made_elsewhere(slot, raw));
        }
        Ok(raw.abi_ref())
    }

    /// The refusal of an object another mechanism made (invariant 1).
    #[cold]
    #[inline(never)]
    pub(crate) fn made_elsewhere(&self, slot: &'static str, raw: &RawObject) -> CallError {
        self.refuse(
            slot,
            Status::WrongMechanism,
            format!(
                "object {} was made by another mechanism (plugin id {}), not by this one",
                raw.object_id, raw.mechanism_id
            ),
        )
    }

    /// Checks that a stream or fence handle was issued by this mechanism.
    #[inline]
    pub(crate) fn check_handle_made_here(
        &self,
        slot: &'static str,
        key: u64,
        what: &str,
    ) -> Result<(), CallError> {
        if key != self.key {
            return Err(self.refuse(
                slot,
                Status::WrongMechanism,
                format!("{what} belongs to another mechanism"),
            ));
        }
        Ok(())
    }
}
