//! Statistics as text tools read (JSON and Prometheus) and the manager's
//! event and log callbacks (API 1.2).
//!
//! Text goes into the caller's buffer with one protocol for all four text
//! functions: on success the text and a NUL are written and `*written` is
//! the text's length (without the NUL); when `cap` is too small nothing is
//! written to `buf`, the call returns `MEMPLUG_HOST_STATUS_BUFFER_TOO_SMALL`
//! and `*written` is the capacity needed (the NUL included). `buf` may be
//! NULL when `cap` is 0: the way to ask for the size. The figures may
//! change between two calls, so a caller asks again with a larger buffer
//! when the second call is still short.

use crate::callbacks::{CallbackScope, UserData};
use crate::common::{MemplugHostManager, MemplugHostPool};
use crate::error::{boundary, require_non_null, Error, Result};
use crate::manager_tables::{pin, pin_manager, PoolEntry};
use crate::status::MemplugHostStatus;
use crate::status::MemplugHostStatus as S;
use memplug_host_dep::mechanism::class_tag;
use memplug_host_dep::observe::{to_json, to_prometheus, Event, StatsReport};
use std::cell::RefCell;
use std::ffi::{c_char, c_void};

/// `MemplugHostEvent::kind`: a grant was made (`bytes` charged to the
/// pool for the holder and class). Sent only while a callback is set.
pub const MEMPLUG_HOST_EVENT_GRANT: u32 = 1;
/// A request of `bytes` was refused; `detail` names the pool that was
/// short (the pool asked, or an ancestor).
pub const MEMPLUG_HOST_EVENT_OUT_OF_BUDGET: u32 = 2;
/// A pressure ticket is about to go to `holder_id`: `pool` is the short
/// pool, `bytes` the bytes wanted, `alloc_class` the request's class.
pub const MEMPLUG_HOST_EVENT_PRESSURE_TICKET: u32 = 3;
/// A ticket was answered with `bytes` released (the holder's answer).
pub const MEMPLUG_HOST_EVENT_EVICTION: u32 = 4;
/// `bytes` of a lease were quarantined: charged for good.
pub const MEMPLUG_HOST_EVENT_QUARANTINE: u32 = 5;
/// A free through the deferred-free queue was retired: `bytes` freed.
pub const MEMPLUG_HOST_EVENT_RETIRED: u32 = 6;
/// A context was lost: one event per binding that held something (`count`
/// objects of `bytes`), or one without a pool; `detail` is the context.
pub const MEMPLUG_HOST_EVENT_CONTEXT_LOST: u32 = 7;
/// `MemplugHostEvent::alloc_class` of an event about no class.
pub const MEMPLUG_HOST_EVENT_NO_CLASS: u32 = 0xFFFF_FFFF;

/// Log level of a plugin message: the context was lost (the message is why).
pub const MEMPLUG_HOST_LOG_ERROR: u32 = 1;
/// A call failed; the message is the plugin's explanation (the failing
/// call's last error message carries it too).
pub const MEMPLUG_HOST_LOG_WARN: u32 = 2;
/// The plugin wrote a message during a call that succeeded.
pub const MEMPLUG_HOST_LOG_INFO: u32 = 3;

/// One event (`memplug_host_set_event_callback`). Valid for the callback's
/// call only, strings included; fields a kind does not have are 0, NULL or
/// `MEMPLUG_HOST_EVENT_NO_CLASS`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugHostEvent {
    /// `sizeof(MemplugHostEvent)` as this library knows it; later versions
    /// only append fields.
    pub struct_size: u32,
    /// One of `MEMPLUG_HOST_EVENT_*` (a number this header does not know:
    /// ignore the event).
    pub kind: u32,
    /// `MEMPLUG_HOST_CLASS_*`, or `MEMPLUG_HOST_EVENT_NO_CLASS`.
    pub alloc_class: u32,
    /// Zero.
    pub reserved0: u32,
    /// The pool's governor id (`MemplugHostPoolInfo::pool_id`); 0: none.
    pub pool_id: u64,
    /// The holder's id (`memplug_host_holder_id`); 0: no holder.
    pub holder_id: u64,
    /// The bytes the event is about (see `MEMPLUG_HOST_EVENT_*`).
    pub bytes: u64,
    /// Objects involved (1 but for a context loss).
    pub count: u64,
    /// The pool's name, NUL-terminated, or NULL; `pool_name_len` bytes
    /// before the NUL.
    pub pool_name: *const c_char,
    /// Bytes of `pool_name` before its NUL (0 when NULL).
    pub pool_name_len: usize,
    /// The short pool (OUT_OF_BUDGET) or the context (CONTEXT_LOST),
    /// NUL-terminated, or NULL.
    pub detail: *const c_char,
    /// Bytes of `detail` before its NUL (0 when NULL).
    pub detail_len: usize,
}

/// Receives each event of a manager (see `memplug_host_set_event_callback`;
/// NULL removes).
pub type MemplugHostEventCallback =
    Option<unsafe extern "C" fn(userdata: *mut c_void, event: *const MemplugHostEvent)>;

/// Receives each plugin message of a manager: its `MEMPLUG_HOST_LOG_*`
/// level, its source (`plugin/mechanism`) and the message; both strings
/// NUL-terminated (their lengths without the NUL), valid for the call.
/// NULL removes.
pub type MemplugHostLogCallback = Option<
    unsafe extern "C" fn(
        userdata: *mut c_void,
        level: u32,
        source: *const c_char,
        source_len: usize,
        message: *const c_char,
        message_len: usize,
    ),
>;

/// The function of a set event callback.
type EventFn = unsafe extern "C" fn(*mut c_void, *const MemplugHostEvent);

thread_local! {
    /// The NUL-terminated strings of the event being delivered: reused, so
    /// an event costs no allocation once the buffer has grown. (A thread
    /// delivers one event at a time: the host drops events raised inside
    /// a callback.)
    static TEXT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with `parts` as NUL-terminated strings (NULL for `None`).
fn with_c_strings<const N: usize>(parts: [Option<&str>; N], f: impl FnOnce([(*const c_char, usize); N])) {
    let fill = |buf: &mut Vec<u8>| {
        buf.clear();
        let mut at = [None; N];
        for (slot, p) in at.iter_mut().zip(parts) {
            if let Some(s) = p {
                *slot = Some((buf.len(), s.len()));
                buf.extend_from_slice(s.as_bytes());
                buf.push(0);
            }
        }
        at
    };
    let run = |buf: &Vec<u8>, at: [Option<(usize, usize)>; N]| {
        f(at.map(|a| a.map_or((std::ptr::null(), 0), |(i, n)| (buf[i..].as_ptr().cast(), n))))
    };
    let mut spare = Vec::new();
    let _ = TEXT.try_with(|t| match t.try_borrow_mut() {
        Ok(mut buf) => {
            let at = fill(&mut buf);
            run(&buf, at);
        }
        Err(_) => {
            let at = fill(&mut spare);
            run(&spare, at);
        }
    });
}

fn deliver_event(callback: EventFn, ud: UserData, e: &Event<'_>) {
    with_c_strings([e.pool_name, e.detail], |[(pool_name, pool_name_len), (detail, detail_len)]| {
        let event = MemplugHostEvent {
            struct_size: std::mem::size_of::<MemplugHostEvent>() as u32,
            kind: e.kind as u32,
            alloc_class: e.class.map_or(MEMPLUG_HOST_EVENT_NO_CLASS, class_tag),
            reserved0: 0,
            pool_id: e.pool.map_or(0, |p| p.get()),
            holder_id: e.holder.map_or(0, |h| h.get()),
            bytes: e.bytes,
            count: e.count,
            pool_name,
            pool_name_len,
            detail,
            detail_len,
        };
        let _scope = CallbackScope::enter();
        // SAFETY: the caller set this function and userdata for exactly
        // this call; the event and its strings live across it.
        unsafe { callback(ud.0, &event) };
    });
}

/// Calls `callback(userdata, event)` with every later event of `manager`:
/// grants, OutOfBudget refusals, pressure tickets, evictions,
/// quarantines, retired frees, context losses (`MEMPLUG_HOST_EVENT_*`).
/// A NULL `callback` removes the one set before. Setting replaces the
/// previous callback, and returns once no call of the old one runs on
/// another thread, so its userdata may be freed right after.
///
/// The callback runs synchronously, on the thread where the event
/// happened (inside the call that caused it: an allocation, a poll, a
/// declared loss), after the host's books were updated, with no host lock
/// held. It must not call this API: the host drops (does not deliver)
/// events the callback itself causes, and calls refused inside callbacks
/// (`MEMPLUG_HOST_STATUS_REENTRANT`) are refused there too. While no
/// callback is set, grants build no event at all (the allocation path
/// reads one word); while one is set, every grant calls it.
///
/// Thread-safety: any thread; the callback may run on several threads at
/// once.
///
/// # Safety
/// `callback`, when not NULL, must be callable with `userdata` from any
/// thread until it is replaced, removed, or the manager destroyed.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_set_event_callback(
    manager: MemplugHostManager,
    callback: MemplugHostEventCallback,
    userdata: *mut c_void,
) -> MemplugHostStatus {
    boundary("memplug_host_set_event_callback", || {
        let (m, _) = pin_manager(manager.id)?;
        match callback {
            None => m.pm.hub().clear_event_listener(),
            Some(cb) => {
                let ud = UserData(userdata);
                m.pm.set_event_listener(move |e| deliver_event(cb, ud, e));
            }
        }
        Ok(())
    })
}

/// Calls `callback(userdata, level, source, ..., message, ...)` with
/// every later message of `manager`'s plugins (`MEMPLUG_HOST_LOG_*`):
/// what a plugin wrote into a call's message sink, and why a context was
/// lost. A NULL `callback` removes the one set before; setting and
/// removing wait for calls on other threads as
/// `memplug_host_set_event_callback` does, and the same rules hold
/// inside the callback.
///
/// Thread-safety: any thread.
///
/// # Safety
/// `callback`, when not NULL, must be callable with `userdata` from any
/// thread until it is replaced, removed, or the manager destroyed.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_set_log_callback(
    manager: MemplugHostManager,
    callback: MemplugHostLogCallback,
    userdata: *mut c_void,
) -> MemplugHostStatus {
    boundary("memplug_host_set_log_callback", || {
        let (m, _) = pin_manager(manager.id)?;
        match callback {
            None => m.pm.hub().clear_log_hook(),
            Some(cb) => {
                let ud = UserData(userdata);
                m.pm.set_log_hook(move |level, source, message| {
                    // The whole `UserData` (Send + Sync), not its raw field.
                    let ud = ud;
                    with_c_strings([Some(source), Some(message)], |[(s, sn), (msg, mn)]| {
                        let _scope = CallbackScope::enter();
                        // SAFETY: as for events.
                        unsafe { cb(ud.0, level as u32, s, sn, msg, mn) };
                    })
                });
            }
        }
        Ok(())
    })
}

/// Copies `text` and a NUL into `buf` under the protocol of the module
/// docs.
///
/// # Safety
/// `buf` must be NULL or writable for `cap` bytes; `written` non-NULL.
unsafe fn write_text(text: &str, buf: *mut c_char, cap: usize, written: *mut usize) -> Result<()> {
    let need = text.len() + 1;
    if buf.is_null() && cap != 0 {
        return Err(Error::null("buf (with a non-zero cap)"));
    }
    if cap < need {
        // SAFETY: non-NULL (checked by the caller); the size query's answer.
        unsafe { written.write(need) };
        return Err(Error::new(
            S::BufferTooSmall,
            format!("the text needs {need} bytes (its NUL included); the buffer has {cap}"),
        ));
    }
    // SAFETY: `buf` is writable for `cap >= need` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
        buf.add(text.len()).write(0);
        written.write(text.len());
    }
    Ok(())
}

/// The body of a text function: `make` the text, then copy it out.
///
/// # Safety
/// As [`write_text`]; `written` is checked here.
pub(crate) unsafe fn text_call(
    name: &'static str,
    buf: *mut c_char,
    cap: usize,
    written: *mut usize,
    make: impl FnOnce() -> Result<String>,
) -> MemplugHostStatus {
    boundary(name, || {
        require_non_null(written, "written")?;
        let text = make()?;
        // SAFETY: the caller's contract.
        unsafe { write_text(&text, buf, cap, written) }
    })
}

/// The report of a manager handle.
fn manager_report(manager: MemplugHostManager) -> Result<StatsReport> {
    let (m, _) = pin_manager(manager.id)?;
    Ok(m.pm.stats())
}

/// The report of one pool handle.
fn pool_report(pool: MemplugHostPool) -> Result<StatsReport> {
    let (e, _) = pin::<PoolEntry>(pool.id)?;
    Ok(StatsReport::of_pool(&e.pool))
}

/// Every figure of `manager` as one line of JSON: `schema_version`, every
/// pool (its figures, `classes` keyed by class name, `holder_stats`), the
/// deferred-free queue, the contexts. Names: docs/statistics.md.
///
/// Buffer protocol (shared by every statistics text function): on success
/// the text and a NUL are written to `buf` and `*written` is the text's
/// length (NUL not counted). A buffer too small for text and NUL gets
/// nothing, the status is `MEMPLUG_HOST_STATUS_BUFFER_TOO_SMALL`, and
/// `*written` is the capacity needed, NUL included. `buf = NULL, cap = 0`
/// asks for that capacity the same way. The text is made anew on each
/// call, so a second call may need more room than the first said.
///
/// Thread-safety: any thread; never blocks an allocation.
///
/// # Safety
/// `buf` must be NULL or writable for `cap` bytes; `written` writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_stats_json(
    manager: MemplugHostManager,
    buf: *mut c_char,
    cap: usize,
    written: *mut usize,
) -> MemplugHostStatus {
    // SAFETY: the caller's contract.
    unsafe {
        text_call("memplug_host_stats_json", buf, cap, written, || Ok(to_json(&manager_report(manager)?)))
    }
}

/// One pool's figures as JSON (the same layout, one pool, no queue or
/// contexts). As `memplug_host_stats_json` otherwise.
///
/// # Safety
/// `buf` must be NULL or writable for `cap` bytes; `written` writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_pool_stats_json(
    pool: MemplugHostPool,
    buf: *mut c_char,
    cap: usize,
    written: *mut usize,
) -> MemplugHostStatus {
    // SAFETY: the caller's contract.
    unsafe {
        text_call("memplug_host_pool_stats_json", buf, cap, written, || Ok(to_json(&pool_report(pool)?)))
    }
}

/// Every figure of `manager` as Prometheus text exposition
/// (`memplug_pool_used_bytes{pool="..",class=".."} 123`, with `# HELP` and
/// `# TYPE`; counters end in `_total`). Names: docs/statistics.md. Buffer
/// protocol as `memplug_host_stats_json`.
///
/// # Safety
/// `buf` must be NULL or writable for `cap` bytes; `written` writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_stats_prometheus(
    manager: MemplugHostManager,
    buf: *mut c_char,
    cap: usize,
    written: *mut usize,
) -> MemplugHostStatus {
    // SAFETY: the caller's contract.
    unsafe {
        text_call("memplug_host_stats_prometheus", buf, cap, written, || {
            Ok(to_prometheus(&manager_report(manager)?))
        })
    }
}

/// One pool's figures as Prometheus text. As
/// `memplug_host_stats_prometheus` otherwise.
///
/// # Safety
/// `buf` must be NULL or writable for `cap` bytes; `written` writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_pool_stats_prometheus(
    pool: MemplugHostPool,
    buf: *mut c_char,
    cap: usize,
    written: *mut usize,
) -> MemplugHostStatus {
    // SAFETY: the caller's contract.
    unsafe {
        text_call("memplug_host_pool_stats_prometheus", buf, cap, written, || {
            Ok(to_prometheus(&pool_report(pool)?))
        })
    }
}
