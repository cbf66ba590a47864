//! The host side of `MemplugMessageSink`: a sink usable only for the call
//! it was given to (ARCHITECTURE.md §3, Status and messages).
//!
//! A plugin may keep the sink (the struct, or a pointer to it) and write
//! into it after the slot returned, or from a thread of its own that
//! outlives the call; the contract forbids it, and the host must survive
//! it (§2, invariant 12). So a sink's `ctx` is not a pointer to anything on
//! a stack: it names a slot of a process-wide table that is never freed,
//! and the generation of the call using that slot now. Each thread owns
//! one slot per call depth (calls nest: a host function a plugin runs
//! inline may call another slot). The owner of a slot, at the start of a
//! call, stores into the slot's sink a `ctx` naming the slot and a fresh
//! odd generation, and at the end the next (even) one: a plain load and
//! two plain stores, no lock and no read-modify-write (issue 32 counts
//! atomics per call). It reads the slot's message only when a writer set
//! `pending`.
//!
//! A writer locks the slot's inbox, checks that the generation it was
//! given is the one running now, stores the message and sets `pending`.
//! A write whose generation is not running (the call returned) is dropped
//! and counted, as is a message a racing writer left for a call that had
//! returned (found stale by the slot's next call). A write from another
//! thread that the plugin joins before the slot returns is kept: the join
//! orders it before the return.
//!
//! The sink struct handed to the plugin lives in the slot too, so a plugin
//! that keeps the pointer instead of a copy reads a valid struct later;
//! its `ctx` then names whatever call uses the slot by then (an idle slot
//! drops the write: its `ctx` is even; a busy one takes it as that call's
//! message, which the host cannot tell from a legal one).
//!
//! The bytes of a message are read with `process_vm_readv` on the own
//! process (a pipe if that is refused), so a `len` that runs past readable
//! memory truncates the message and is counted, instead of faulting.

use core::ffi::{c_char, c_void};
use memplug_sdk::abi::{MemplugMessageSink, MEMPLUG_MESSAGE_MAX};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Collects what a plugin wrote during one call (the last message kept,
/// bounded by [`bounded_message`]), or what the host says itself.
#[derive(Default)]
pub(crate) struct Capture {
    message: Option<String>,
    /// The message is the host's own (a call it refused), not the plugin's.
    by_host: bool,
}

impl Capture {
    /// A message the host writes itself (a call it refused).
    pub(crate) fn set(&mut self, message: String) {
        self.message = Some(message);
        self.by_host = true;
    }

    pub(crate) fn take(&mut self) -> Option<String> {
        self.message.take()
    }

    /// Whether anything was written (the one test a successful call pays
    /// for routing plugin messages to the log hook).
    #[inline(always)]
    pub(crate) fn has_message(&self) -> bool {
        self.message.is_some()
    }

    /// The plugin's message, if it wrote one (not the host's).
    pub(crate) fn plugin_message(&self) -> Option<&str> {
        self.message.as_deref().filter(|_| !self.by_host)
    }
}

// ---------------------------------------------------------------------------
// The table of slots
// ---------------------------------------------------------------------------

/// Bits of a `ctx` that name the slot; the rest carry the generation.
const INDEX_BITS: u32 = if usize::BITS >= 64 { 20 } else { 10 };
const GEN_BITS: u32 = usize::BITS - INDEX_BITS;
const GEN_MASK: usize = (1 << GEN_BITS) - 1;
/// Slots per chunk (allocated together, never freed).
const CHUNK: usize = 64;
const MAX_SLOTS: usize = 1 << INDEX_BITS;
const CHUNKS: usize = MAX_SLOTS / CHUNK;

/// The `MemplugMessageSink` as the host keeps it in a slot: the same
/// layout, with `ctx` written atomically (a plugin holding a pointer to it
/// may read it from another thread at any time).
#[repr(C)]
struct SlotSink {
    ctx: AtomicPtr<c_void>,
    write: Option<unsafe extern "C" fn(ctx: *mut c_void, msg: *const c_char, len: usize)>,
}

const _: () = {
    assert!(core::mem::size_of::<SlotSink>() == core::mem::size_of::<MemplugMessageSink>());
    assert!(core::mem::align_of::<SlotSink>() == core::mem::align_of::<MemplugMessageSink>());
    assert!(core::mem::offset_of!(SlotSink, write) == core::mem::offset_of!(MemplugMessageSink, write));
};

/// What writers leave for the owner.
struct Inbox {
    /// The `ctx` the message was written with.
    ctx: usize,
    message: Option<String>,
}

/// One thread's sink at one call depth. Never freed; given to another
/// thread when its owner exits.
#[repr(align(64))]
pub(crate) struct SinkSlot {
    /// `sink.ctx` is the slot's index (high bits) and a generation (low
    /// bits): odd while a call runs in the slot, and then the `ctx` that
    /// call's sink carries; even when idle. Written only by the owner (a
    /// load and a store, never an RMW). A write whose `ctx` is not the
    /// current one is late.
    sink: SlotSink,
    /// `index << GEN_BITS | GEN_MASK >> 1`: what a generation is masked
    /// with when a call begins, so it wraps before it could carry into the
    /// index.
    keep: usize,
    /// A writer stored a message in `inbox` (set under its lock).
    pending: AtomicBool,
    inbox: Mutex<Inbox>,
    index: usize,
}

type Chunk = [SinkSlot; CHUNK];

static TABLE: [AtomicPtr<Chunk>; CHUNKS] = [const { AtomicPtr::new(core::ptr::null_mut()) }; CHUNKS];

/// Slots handed out and returned; touched only when a thread first calls
/// at a depth, and when it exits.
struct Alloc {
    /// Slots ever made.
    made: usize,
    /// Slots of exited threads.
    free: Vec<usize>,
}

static ALLOC: Mutex<Alloc> = Mutex::new(Alloc { made: 0, free: Vec::new() });

/// The slot of every call the table cannot serve: a million threads
/// calling plugins at once, a call from a thread's exit after its slots
/// went back. Shared, so calls using it at once may see each other's
/// messages (or lose one), but never unsafe.
static OVERFLOW: SinkSlot = SinkSlot::new(usize::MAX >> GEN_BITS);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SinkSlot {
    const fn new(index: usize) -> SinkSlot {
        SinkSlot {
            sink: SlotSink {
                ctx: AtomicPtr::new((index << GEN_BITS) as *mut c_void),
                write: Some(sink_write),
            },
            keep: (index << GEN_BITS) | (GEN_MASK >> 1),
            pending: AtomicBool::new(false),
            inbox: Mutex::new(Inbox { ctx: 0, message: None }),
            index,
        }
    }

    /// A slot for the calling thread, from the free list or new.
    #[cold]
    pub(crate) fn acquire() -> &'static SinkSlot {
        let mut a = lock(&ALLOC);
        let index = match a.free.pop() {
            Some(i) => i,
            None if a.made < MAX_SLOTS - 1 => {
                // The last index is OVERFLOW's.
                let i = a.made;
                a.made += 1;
                if i % CHUNK == 0 {
                    let chunk: Box<Chunk> = Box::new(core::array::from_fn(|k| SinkSlot::new(i + k)));
                    TABLE[i / CHUNK].store(Box::into_raw(chunk), Ordering::Release);
                }
                i
            }
            None => return &OVERFLOW,
        };
        drop(a);
        slot_at(index).unwrap_or(&OVERFLOW)
    }

    /// The shared slot of calls the table cannot serve.
    #[cold]
    pub(crate) fn overflow() -> &'static SinkSlot {
        &OVERFLOW
    }

    /// Gives the slot back (its owner thread exits). Its generation goes on rising, so a sink of an earlier owner
    /// never matches a later one's call.
    #[cold]
    pub(crate) fn give_back(&'static self) {
        if core::ptr::eq(self, &OVERFLOW) {
            return;
        }
        lock(&ALLOC).free.push(self.index);
    }

    /// Starts a call in this slot: its sink, for this call only.
    #[inline(always)]
    pub(crate) fn begin(&'static self) -> CallSink {
        // Idle (even) + 1: odd, the call's (`| 1` keeps it odd in the
        // shared overflow slot, which may be busy); masked so that the
        // end's + 1 never carries into the index.
        let ctx = ((self.sink.ctx.load(Ordering::Relaxed) as usize).wrapping_add(1) | 1) & self.keep;
        self.sink.ctx.store(ctx as *mut c_void, Ordering::Relaxed);
        CallSink { slot: self, ctx }
    }
}

/// The slot named by the index part of a `ctx`, if the table has it.
#[inline]
fn slot_at(index: usize) -> Option<&'static SinkSlot> {
    if index == OVERFLOW.index {
        return Some(&OVERFLOW);
    }
    let chunk = TABLE.get(index / CHUNK)?.load(Ordering::Acquire);
    // SAFETY: a chunk, once published, is never freed or moved.
    unsafe { chunk.as_ref() }.map(|c| &c[index % CHUNK])
}

/// One call's use of a slot: from [`SinkSlot::begin`] to
/// [`finish`](Self::finish).
pub(crate) struct CallSink {
    slot: &'static SinkSlot,
    /// The `ctx` of this call's sink.
    ctx: usize,
}

impl CallSink {
    /// The sink to pass to the plugin (it lives in the slot, forever).
    #[inline(always)]
    pub(crate) fn abi(&self) -> *const MemplugMessageSink {
        (&self.slot.sink as *const SlotSink).cast()
    }

    /// Ends the call: a later write through its sink is dropped. The
    /// message written during it, if any, goes to `cap`.
    #[inline(always)]
    pub(crate) fn finish(self, cap: &mut Capture) {
        self.slot.sink.ctx.store(self.ctx.wrapping_add(1) as *mut c_void, Ordering::Relaxed);
        if self.slot.pending.load(Ordering::Acquire) {
            self.collect(cap);
        }
    }

    #[cold]
    #[inline(never)]
    fn collect(&self, cap: &mut Capture) {
        let mut inbox = lock(&self.slot.inbox);
        self.slot.pending.store(false, Ordering::Relaxed);
        let Some(message) = inbox.message.take() else {
            return;
        };
        if inbox.ctx == self.ctx {
            cap.message = Some(message);
            cap.by_host = false;
        } else {
            // Written for a call of this slot that had returned.
            drop(inbox);
            late_write("a message written for an earlier call was found in its sink");
        }
    }
}

// ---------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------

use crate::faults::{count, LATE_SINK_WRITES as LATE_WRITES, UNREADABLE_MESSAGES};

/// Writes into a message sink that were dropped because the call the sink
/// was given to had returned (or it was never a sink of this host's): a
/// plugin breaking the sink's lifetime rule. Process-wide, since a late
/// write can no longer be told apart by mechanism.
pub fn late_sink_writes() -> u64 {
    LATE_WRITES.load(Ordering::Relaxed)
}

/// Plugin messages (and reasons) whose `len` ran past readable memory: kept
/// up to the first unreadable byte. Process-wide.
pub fn unreadable_plugin_messages() -> u64 {
    UNREADABLE_MESSAGES.load(Ordering::Relaxed)
}

#[cold]
fn late_write(what: &str) {
    let n = count(&LATE_WRITES);
    // One line at the 1st, 2nd, 4th, 8th... drop: a plugin writing late
    // in a loop does not flood the log.
    if n.is_power_of_two() {
        crate::events::plugin_message(
            None,
            crate::events::Level::Warn,
            "memplug-host",
            &format!(
                "{what}: a plugin wrote into a message sink after the call it was given to returned \
                 (or into one that is not this host's); dropped ({n} such writes in this process so far)"
            ),
        );
    }
}

unsafe extern "C" fn sink_write(ctx: *mut c_void, msg: *const c_char, len: usize) {
    // Called by plugin code: nothing may unwind back into it.
    let _ = catch_unwind(AssertUnwindSafe(|| write(ctx as usize, msg.cast(), len)));
}

fn write(ctx: usize, msg: *const u8, len: usize) {
    let slot = match slot_at(ctx >> GEN_BITS) {
        Some(s) if ctx & 1 == 1 => s,
        _ => return late_write("a write with a context no call of this host gave out"),
    };
    let running = |s: &SinkSlot| s.sink.ctx.load(Ordering::Relaxed) as usize == ctx;
    if !running(slot) {
        return late_write("a write after its call returned");
    }
    if msg.is_null() {
        return;
    }
    let text = read_message(msg, len);
    let mut inbox = lock(&slot.inbox);
    if !running(slot) {
        drop(inbox);
        return late_write("a write after its call returned");
    }
    if inbox.message.is_some() && inbox.ctx != ctx {
        // A stale message, replaced before anyone saw it.
        count(&LATE_WRITES);
    }
    inbox.ctx = ctx;
    inbox.message = Some(text);
    slot.pending.store(true, Ordering::Release);
}

/// A plugin's message of `len` bytes at `msg`: at most
/// `MEMPLUG_MESSAGE_MAX` bytes are read, up to the first unreadable one
/// (then the message says so and the fault is counted), and bounded by
/// [`bounded_message`].
pub(crate) fn read_message(msg: *const u8, len: usize) -> String {
    let n = len.min(MEMPLUG_MESSAGE_MAX as usize);
    let mut buf = [0u8; MEMPLUG_MESSAGE_MAX as usize];
    let got = read_plugin_bytes(msg, &mut buf[..n]);
    let mut text = bounded_message(&buf[..got]);
    if got < n {
        count(&UNREADABLE_MESSAGES);
        text.push_str(&format!(
            " [message cut by the host: the plugin said {len} bytes at {msg:p}, byte {got} is not readable]"
        ));
    }
    text
}

/// Copies `out.len()` bytes from `src` into `out`, up to the first byte
/// that is not readable; returns how many were copied. Never faults.
fn read_plugin_bytes(src: *const u8, out: &mut [u8]) -> usize {
    if out.is_empty() {
        return 0;
    }
    // Pieces that do not cross a 4 KiB boundary (every page boundary is
    // one): the kernel stops at the first piece it cannot read.
    let mut remote = [libc::iovec { iov_base: core::ptr::null_mut(), iov_len: 0 }; 4];
    let mut pieces = 0;
    let mut at = src as usize;
    let end = at.saturating_add(out.len());
    while at < end && pieces < remote.len() {
        let next = ((at / 4096) + 1).saturating_mul(4096).min(end);
        remote[pieces] = libc::iovec { iov_base: at as *mut c_void, iov_len: next - at };
        pieces += 1;
        at = next;
    }
    let wanted: usize = remote[..pieces].iter().map(|v| v.iov_len).sum();
    let local = libc::iovec { iov_base: out.as_mut_ptr().cast(), iov_len: wanted };
    // SAFETY: `local` is `out` (writable, `wanted` <= its length); the
    // kernel reads the remote ranges from this process's memory and
    // reports what it could not read instead of faulting.
    let r = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, remote.as_ptr(), pieces as _, 0) };
    if r >= 0 {
        return r as usize;
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EFAULT) => 0,
        // Refused (a seccomp filter, an old kernel): through a pipe.
        _ => read_through_pipe(&remote[..pieces], out),
    }
}

/// [`read_plugin_bytes`] where `process_vm_readv` is refused: `write()`
/// into a pipe answers `EFAULT` for an unreadable source, and what went in
/// is read back.
fn read_through_pipe(pieces: &[libc::iovec], out: &mut [u8]) -> usize {
    let mut p = [0i32; 2];
    // SAFETY: `p` is writable for two descriptors.
    if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return 0;
    }
    let mut written = 0usize;
    for v in pieces {
        // SAFETY: the kernel reads the source and answers EFAULT where it
        // cannot; the pipe (64 KiB) takes a whole message.
        let w = unsafe { libc::write(p[1], v.iov_base, v.iov_len) };
        if w <= 0 {
            break;
        }
        written += w as usize;
        if (w as usize) < v.iov_len {
            break;
        }
    }
    let mut got = 0usize;
    while got < written {
        // SAFETY: `out[got..written]` is writable.
        let r = unsafe { libc::read(p[0], out[got..].as_mut_ptr().cast(), written - got) };
        if r <= 0 {
            break;
        }
        got += r as usize;
    }
    // SAFETY: both ends are this function's.
    unsafe {
        libc::close(p[0]);
        libc::close(p[1]);
    }
    got
}

/// Bounds a plugin message: lossy UTF-8, at most `MEMPLUG_MESSAGE_MAX`
/// bytes, cut on a character boundary, control characters other than
/// newline and tab replaced (messages end up in logs and terminals).
pub(crate) fn bounded_message(bytes: &[u8]) -> String {
    let max = MEMPLUG_MESSAGE_MAX as usize;
    let bytes = &bytes[..bytes.len().min(max)];
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(text.len().min(max));
    for c in text.chars().map(|c| if c.is_control() && c != '\n' && c != '\t' { '\u{fffd}' } else { c }) {
        // Replacement characters are 3 bytes: bound the result, not only
        // the input, and cut on a character boundary.
        if out.len() + c.len_utf8() > max {
            break;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_and_invalid_messages_are_bounded() {
        let long = vec![b'x'; 5000];
        assert_eq!(bounded_message(&long).len(), MEMPLUG_MESSAGE_MAX as usize);
        assert_eq!(bounded_message(b"a\xffb\x1b"), "a\u{fffd}b\u{fffd}");
        // Invalid bytes grow when replaced; the result stays bounded.
        assert!(bounded_message(&[0xff; 2000]).len() <= MEMPLUG_MESSAGE_MAX as usize);
    }

    fn say(sink: *const MemplugMessageSink, text: &[u8]) {
        let s = unsafe { &*sink };
        unsafe { (s.write.unwrap())(s.ctx, text.as_ptr().cast(), text.len()) };
    }

    #[test]
    fn sink_keeps_last_message_and_drops_late_writes() {
        let slot = SinkSlot::acquire();
        let mut cap = Capture::default();
        let call = slot.begin();
        let sink = call.abi();
        let kept = unsafe { *sink };
        say(sink, b"first");
        say(sink, b"second!");
        call.finish(&mut cap);
        assert_eq!(cap.take().as_deref(), Some("second!"));
        // The copy kept by a plugin, written after the call: dropped.
        let before = late_sink_writes();
        unsafe { (kept.write.unwrap())(kept.ctx, b"late".as_ptr().cast(), 4) };
        assert_eq!(late_sink_writes(), before + 1);
        // The next call of the slot does not see it either.
        let call = slot.begin();
        call.finish(&mut cap);
        assert!(cap.take().is_none());
        slot.give_back();
    }

    /// The slot of a call entered the way the door enters it.
    fn door_call(text: Option<&[u8]>, inner: impl FnOnce()) -> Option<String> {
        let (_inside, _, sink) = crate::reentry::InPluginCall::enter_call();
        let call = sink.begin();
        let abi = call.abi();
        inner();
        if let Some(t) = text {
            say(abi, t);
        }
        let mut cap = Capture::default();
        call.finish(&mut cap);
        cap.take()
    }

    #[test]
    fn nested_calls_keep_their_own_messages() {
        // A call whose plugin runs a host function inline, which calls
        // another slot: each keeps what was written into its own sink.
        let mut inner = None;
        let outer = door_call(Some(b"outer"), || {
            inner = door_call(Some(b"inner"), || {});
        });
        assert_eq!((outer.as_deref(), inner.as_deref()), (Some("outer"), Some("inner")));
        // Deeper than a thread keeps slots for: still each call's own.
        fn deep(n: usize) -> Option<String> {
            if n == 0 {
                return door_call(Some(b"deepest"), || {});
            }
            let mut below = None;
            let mine = door_call(None, || below = deep(n - 1));
            assert_eq!(mine, None, "a call that wrote nothing has no message");
            below
        }
        assert_eq!(deep(12).as_deref(), Some("deepest"));
        let mut inner = None;
        let outer = door_call(Some(b"outer at depth 0"), || inner = deep(11));
        assert_eq!((outer.as_deref(), inner.as_deref()), (Some("outer at depth 0"), Some("deepest")));
    }

    #[test]
    fn an_exited_threads_slots_are_reused() {
        // Counted alone, in a child process running only this test: in
        // this process the harness runs other tests beside it, whose
        // threads take slots of their own meanwhile (a bound loose enough
        // for them failed on a loaded machine).
        const CHILD: &str = "MEMPLUG_SINK_SLOTS_ALONE";
        if std::env::var_os(CHILD).is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "sink::tests::an_exited_threads_slots_are_reused", "--test-threads=1"])
                .env(CHILD, "1")
                .output()
                .unwrap();
            let said =
                String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success() && said.contains("1 passed"), "the child run failed:\n{said}");
            return;
        }
        let made = |()| lock(&ALLOC).made;
        // Warm up: this thread and one worker.
        std::thread::spawn(|| door_call(Some(b"x"), || {})).join().unwrap();
        let before = made(());
        for _ in 0..50 {
            let m =
                std::thread::spawn(|| door_call(Some(b"from a short-lived thread"), || {})).join().unwrap();
            assert_eq!(m.as_deref(), Some("from a short-lived thread"));
        }
        assert!(made(()) - before <= 1, "{} slots made for 50 threads one after another", made(()) - before);
    }

    #[test]
    fn foreign_contexts_are_dropped() {
        let before = late_sink_writes();
        unsafe { sink_write(core::ptr::null_mut(), b"x".as_ptr().cast(), 1) };
        unsafe { sink_write(usize::MAX as *mut c_void, b"x".as_ptr().cast(), 1) };
        unsafe { sink_write(0x1234_5678 as *mut c_void, b"x".as_ptr().cast(), 1) };
        assert!(late_sink_writes() >= before + 3);
    }

    #[test]
    fn an_unreadable_tail_truncates_the_message() {
        let page = 4096usize;
        // SAFETY: plain anonymous mappings, unmapped below.
        let base = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let base = base.cast::<u8>();
        unsafe { libc::mprotect(base.add(page).cast(), page, libc::PROT_NONE) };
        let start = unsafe { base.add(page - 5) };
        unsafe { core::ptr::copy_nonoverlapping(b"hello".as_ptr(), start, 5) };
        let before = unreadable_plugin_messages();
        let text = read_message(start, 900);
        assert!(text.starts_with("hello [message cut by the host"), "{text}");
        assert!(text.contains("byte 5 is not readable"), "{text}");
        assert_eq!(unreadable_plugin_messages(), before + 1);
        let mut buf = [0u8; 900];
        let pieces = [
            libc::iovec { iov_base: start.cast(), iov_len: 5 },
            libc::iovec { iov_base: unsafe { base.add(page) }.cast(), iov_len: 895 },
        ];
        assert_eq!(read_through_pipe(&pieces, &mut buf), 5);
        assert_eq!(&buf[..5], b"hello");
        assert_eq!(read_message(start, 5), "hello");
        unsafe { libc::munmap(base.cast(), 2 * page) };
    }
}
