//! The kit as an ABI 1.2 host: the `MemplugHostServices` table it puts in
//! a 1.2-sized `MemplugHostInfo`, and what the plugin reported through it.
//!
//! One table per negotiation the kit makes with services (the ordinary
//! `negotiation.accepts_host` one, and each fresh instance of the `loss.*`
//! checks), leaked: a plugin may keep the pointer on a thread of its own,
//! and the check's process ends soon anyway.
//!
//! It answers as the host does (`host/src/services.rs`): `INVALID_STATE`
//! until the kit has read the descriptor the negotiation returned (during
//! the entry call no mechanism exists yet) and at an agreed minor below 2,
//! `INVALID_ARGUMENT` for a NULL reason with a non-zero length,
//! `WRONG_MECHANISM` for an id the plugin did not publish, `OK` otherwise
//! (a repeat too). Every report is recorded, refused or not, with its
//! reason's bytes (at most `MEMPLUG_MESSAGE_MAX` read, the rest counted)
//! and the thread it came from. Nothing blocks: one short lock.

use core::ffi::{c_char, c_void};
use memplug_sdk::abi::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// When, relative to the negotiation, a report came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Inside the entry call (`memplug_plugin_v1` had not returned).
    Entry,
    /// After the entry returned, before the kit had read the mechanisms.
    BeforePublish,
    /// After the kit had read the mechanisms.
    Open,
}

/// The reason a report carried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    /// NULL with length 0: no reason given (allowed).
    Absent,
    /// NULL with a non-zero length (a contract violation; not read).
    NullWithLength(usize),
    /// `len` bytes at a non-NULL pointer: the first `MEMPLUG_MESSAGE_MAX`
    /// of them (a zero length reads nothing).
    Text { len: usize, bytes: Vec<u8> },
}

impl Reason {
    /// Whether the bytes read are UTF-8 (a character cut at the bound
    /// counts as UTF-8).
    pub(crate) fn is_utf8(&self) -> bool {
        match self {
            Reason::Text { len, bytes } => match std::str::from_utf8(bytes) {
                Ok(_) => true,
                Err(e) => e.error_len().is_none() && bytes.len() < *len,
            },
            _ => true,
        }
    }

    /// The reason for a detail: quoted text, or what it was instead.
    pub(crate) fn describe(&self) -> String {
        match self {
            Reason::Absent => "no reason (NULL, length 0)".into(),
            Reason::NullWithLength(n) => format!("reason NULL with reason_len {n}"),
            Reason::Text { len, bytes } => {
                let text = crate::printable(&String::from_utf8_lossy(bytes));
                if *len > bytes.len() {
                    format!("reason {text:?}… ({len} bytes, the first {} read)", bytes.len())
                } else {
                    format!("reason {text:?} ({len} bytes)")
                }
            }
        }
    }
}

/// One call of `report_device_lost` the plugin made.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub mechanism_id: u64,
    pub reason: Reason,
    /// Made on the thread that created the table (the check's thread,
    /// which makes every call into the plugin).
    pub on_kit_thread: bool,
    /// The name of the thread it came from, when it has one.
    pub thread_name: Option<String>,
    pub phase: Phase,
    /// What the kit answered.
    pub answer: MemplugStatus,
}

impl Seen {
    /// Where it came from, for a detail.
    pub(crate) fn thread(&self) -> String {
        if self.on_kit_thread {
            "on the thread that called the plugin".into()
        } else {
            match &self.thread_name {
                Some(n) => format!("from another thread ({})", crate::printable(n)),
                None => "from another thread".into(),
            }
        }
    }
}

#[derive(Default)]
struct State {
    phase: Option<Phase>,
    /// The agreed minor and the published mechanism ids, once read.
    published: Option<(u32, Vec<u64>)>,
    seen: Vec<Seen>,
}

/// A services table and what came through it.
pub(crate) struct KitServices {
    table: MemplugHostServices,
    kit_thread: ThreadId,
    state: Mutex<State>,
    arrived: Condvar,
}

// SAFETY: the table's `ctx` points at this (immutable after `leak`)
// struct, whose state is behind a mutex: callable from any thread, as the
// ABI makes every service.
unsafe impl Send for KitServices {}
unsafe impl Sync for KitServices {}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl KitServices {
    /// A new table for one negotiation, answering `INVALID_STATE` until
    /// [`publish`](Self::publish). The calling thread is the kit's.
    pub(crate) fn leak() -> &'static KitServices {
        let s: &'static mut KitServices = Box::leak(Box::new(KitServices {
            table: MemplugHostServices {
                struct_size: MEMPLUG_HOST_SERVICES_SIZE_1_2,
                reserved0: 0,
                ctx: core::ptr::null_mut(),
                report_device_lost: Some(report_device_lost),
            },
            kit_thread: std::thread::current().id(),
            state: Mutex::new(State::default()),
            arrived: Condvar::new(),
        }));
        s.table.ctx = (s as *mut KitServices).cast();
        s
    }

    /// The pointer for `MemplugHostInfo::services`.
    pub(crate) fn table(&'static self) -> *const MemplugHostServices {
        &self.table
    }

    /// The entry is about to be called (`true`) or has returned (`false`).
    pub(crate) fn in_entry(&self, inside: bool) {
        let mut st = lock(&self.state);
        if st.published.is_none() {
            st.phase = Some(if inside { Phase::Entry } else { Phase::BeforePublish });
        }
    }

    /// The negotiation agreed on `agreed_minor` and the plugin publishes
    /// `ids`: reports are taken from now on (at 1.2 or newer).
    pub(crate) fn publish(&self, agreed_minor: u32, ids: Vec<u64>) {
        let mut st = lock(&self.state);
        st.published = Some((agreed_minor, ids));
        st.phase = Some(Phase::Open);
    }

    /// Every report so far.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        lock(&self.state).seen.clone()
    }

    pub(crate) fn count(&self) -> usize {
        lock(&self.state).seen.len()
    }

    /// Waits up to `limit` for a report that `want` accepts; whether one
    /// came.
    pub(crate) fn wait_for(&self, limit: Duration, want: impl Fn(&Seen) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        let mut st = lock(&self.state);
        loop {
            if st.seen.iter().any(&want) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            st = self.arrived.wait_timeout(st, deadline - now).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// # Safety
    /// `reason` points at `len` readable bytes, or is NULL.
    unsafe fn report(&self, id: u64, reason: *const c_char, len: usize) -> MemplugStatus {
        let reason = if reason.is_null() {
            if len == 0 {
                Reason::Absent
            } else {
                Reason::NullWithLength(len)
            }
        } else {
            let n = len.min(MEMPLUG_MESSAGE_MAX as usize);
            Reason::Text { len, bytes: core::slice::from_raw_parts(reason.cast::<u8>(), n).to_vec() }
        };
        let thread = std::thread::current();
        let mut st = lock(&self.state);
        let phase = st.phase.unwrap_or(Phase::Entry);
        let answer = match &st.published {
            None => MEMPLUG_STATUS_INVALID_STATE,
            Some((minor, _)) if *minor < 2 => MEMPLUG_STATUS_INVALID_STATE,
            Some(_) if matches!(reason, Reason::NullWithLength(_)) => MEMPLUG_STATUS_INVALID_ARGUMENT,
            Some((_, ids)) if !ids.contains(&id) => MEMPLUG_STATUS_WRONG_MECHANISM,
            Some(_) => MEMPLUG_STATUS_OK,
        };
        st.seen.push(Seen {
            mechanism_id: id,
            reason,
            on_kit_thread: thread.id() == self.kit_thread,
            thread_name: thread.name().map(str::to_string),
            phase,
            answer,
        });
        drop(st);
        self.arrived.notify_all();
        answer
    }
}

/// `MemplugHostServices::report_device_lost` of the kit. Nothing unwinds
/// into the plugin.
unsafe extern "C" fn report_device_lost(
    ctx: *mut c_void,
    mechanism_id: u64,
    reason: *const c_char,
    reason_len: usize,
) -> MemplugStatus {
    let Some(s) = ctx.cast::<KitServices>().cast_const().as_ref() else {
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    };
    catch_unwind(AssertUnwindSafe(|| s.report(mechanism_id, reason, reason_len)))
        .unwrap_or(MEMPLUG_STATUS_INTERNAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(s: &'static KitServices, id: u64, reason: Option<&[u8]>, len: usize) -> MemplugStatus {
        let t = s.table;
        let p = reason.map_or(core::ptr::null(), |r| r.as_ptr().cast::<c_char>());
        // SAFETY: the kit's own table, a valid (pointer, length) pair or a
        // deliberately NULL one (never read).
        unsafe { t.report_device_lost.unwrap()(t.ctx, id, p, len) }
    }

    #[test]
    fn answers_as_the_host_does_and_records_everything() {
        let s = KitServices::leak();
        assert_eq!(s.table.struct_size, MEMPLUG_HOST_SERVICES_SIZE_1_2);
        s.in_entry(true);
        assert_eq!(call(s, 1, Some(b"early"), 5), MEMPLUG_STATUS_INVALID_STATE);
        s.in_entry(false);
        assert_eq!(call(s, 1, None, 0), MEMPLUG_STATUS_INVALID_STATE);
        s.publish(2, vec![1, 7]);
        assert_eq!(call(s, 1, Some(b"gone"), 4), MEMPLUG_STATUS_OK);
        assert_eq!(call(s, 1, Some(b"gone"), 4), MEMPLUG_STATUS_OK, "a repeat is OK");
        assert_eq!(call(s, 9, None, 0), MEMPLUG_STATUS_WRONG_MECHANISM);
        assert_eq!(call(s, 7, None, 3), MEMPLUG_STATUS_INVALID_ARGUMENT);
        let seen = s.seen();
        let phases: Vec<Phase> = seen.iter().map(|r| r.phase).collect();
        assert_eq!(
            phases,
            [Phase::Entry, Phase::BeforePublish, Phase::Open, Phase::Open, Phase::Open, Phase::Open]
        );
        assert_eq!(seen[0].reason, Reason::Text { len: 5, bytes: b"early".to_vec() });
        assert_eq!(seen[1].reason, Reason::Absent);
        assert_eq!(seen[5].reason, Reason::NullWithLength(3));
        assert!(seen.iter().all(|r| r.on_kit_thread));
        // From another thread, and waited for.
        let h = std::thread::Builder::new()
            .name("vendor-watchdog".into())
            .spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                call(s, 7, Some(b"late"), 4)
            })
            .unwrap();
        assert!(s.wait_for(Duration::from_secs(5), |r| r.mechanism_id == 7 && r.answer == MEMPLUG_STATUS_OK));
        assert_eq!(h.join().unwrap(), MEMPLUG_STATUS_OK);
        let last = s.seen().pop().unwrap();
        assert!(!last.on_kit_thread);
        assert_eq!(last.thread(), "from another thread (vendor-watchdog)");
        assert!(!s.wait_for(Duration::from_millis(10), |r| r.mechanism_id == 42));
    }

    #[test]
    fn below_1_2_every_report_is_refused() {
        let s = KitServices::leak();
        s.publish(1, vec![1]);
        assert_eq!(call(s, 1, Some(b"x"), 1), MEMPLUG_STATUS_INVALID_STATE);
    }

    #[test]
    fn reasons_are_bounded_and_judged_as_utf8() {
        let long = vec![b'a'; MEMPLUG_MESSAGE_MAX as usize + 10];
        let s = KitServices::leak();
        s.publish(2, vec![1]);
        call(s, 1, Some(&long), long.len());
        call(s, 1, Some(b"\xff\xfe"), 2);
        let seen = s.seen();
        match &seen[0].reason {
            Reason::Text { len, bytes } => {
                assert_eq!(*len, long.len());
                assert_eq!(bytes.len(), MEMPLUG_MESSAGE_MAX as usize);
            }
            other => panic!("{other:?}"),
        }
        assert!(seen[0].reason.is_utf8());
        assert!(seen[0].reason.describe().contains("the first 1024 read"), "{}", seen[0].reason.describe());
        assert!(!seen[1].reason.is_utf8());
    }
}
