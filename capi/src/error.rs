//! Errors, the per-thread last error message, and the panic boundary that
//! wraps the body of every exported function.

use crate::handle::{Kind, WrongKind};
use crate::slot_table::Miss;
use crate::status::MemplugHostStatus;
use crate::status::MemplugHostStatus as S;
use memplug_host_dep::governor::GovernorError;
use memplug_host_dep::registry::RegistryError;
use memplug_host_dep::{
    BindingError, CallError, LifeState, LifecycleError, LoadError, ManagerError, TerminateError,
};
use std::cell::RefCell;
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A failure: the code returned to C and the message kept for
/// `memplug_host_last_error_message`.
#[derive(Debug)]
pub(crate) struct Error {
    pub status: S,
    pub message: String,
}

pub(crate) type Result<T> = std::result::Result<T, Error>;

impl Error {
    #[cold]
    pub(crate) fn new(status: S, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }

    #[cold]
    pub(crate) fn null(what: &str) -> Error {
        Error::new(S::NullArgument, format!("{what} is NULL"))
    }

    #[cold]
    pub(crate) fn miss(miss: Miss, kind: Kind, bits: u64) -> Error {
        match miss {
            Miss::Stale => Error::new(
                S::StaleHandle,
                format!("{} handle {bits:#018x} was freed or destroyed", kind.name()),
            ),
            Miss::Invalid => {
                Error::new(S::InvalidHandle, format!("{} handle {bits:#018x} was never issued", kind.name()))
            }
        }
    }
}

impl From<WrongKind> for Error {
    #[cold]
    fn from(w: WrongKind) -> Self {
        let WrongKind { bits, expected } = w;
        if bits == 0 {
            return Error::new(
                S::InvalidHandle,
                format!("the {} handle is the zero handle", expected.name()),
            );
        }
        let found = crate::handle::decode(bits).kind;
        let what = Kind::from_bits(found).map_or("no kind of", Kind::with_article);
        Error::new(
            S::InvalidHandle,
            format!("{bits:#018x} is not a valid {} handle (it is {what} handle)", expected.name()),
        )
    }
}

impl From<CallError> for Error {
    #[cold]
    fn from(e: CallError) -> Self {
        Error::new(S::from_plugin(e.status), e.to_string())
    }
}

impl From<GovernorError> for Error {
    #[cold]
    fn from(e: GovernorError) -> Self {
        let status = match &e {
            GovernorError::OutOfBudget(_) => S::OutOfBudget,
            GovernorError::UnknownHolder { .. } => S::InvalidState,
            GovernorError::DuplicatePool { .. } => S::AlreadyExists,
            GovernorError::CapacityTooLarge { .. } => S::OutOfRange,
            _ => S::Internal,
        };
        Error::new(status, e.to_string())
    }
}

impl From<BindingError> for Error {
    #[cold]
    fn from(e: BindingError) -> Self {
        match e {
            BindingError::Budget(g) => g.into(),
            BindingError::Plugin(c) => c.into(),
            BindingError::Unsupported { .. } => Error::new(S::Unsupported, e.to_string()),
            BindingError::Invalid(m) => Error::new(S::InvalidArgument, m),
            BindingError::State(m) => Error::new(S::InvalidState, m),
        }
    }
}

impl From<ManagerError> for Error {
    #[cold]
    fn from(e: ManagerError) -> Self {
        let status = match &e {
            ManagerError::Load(LoadError::VersionMismatch { .. }) => S::VersionMismatch,
            ManagerError::Load(_) => S::LoadFailed,
            ManagerError::Registry(r) => match r {
                RegistryError::DuplicatePlugin(_) => S::AlreadyExists,
                RegistryError::UnknownPlugin(_)
                | RegistryError::UnknownMechanism(_)
                | RegistryError::NoDevice { .. } => S::NotFound,
                RegistryError::MissingCapability { .. } => S::Unsupported,
                RegistryError::UnloadRefused { .. } => S::Busy,
            },
            ManagerError::Governor(g) => return Error::from(g.clone()),
            ManagerError::HolderNotInPool { .. }
            | ManagerError::CacheHolder { .. }
            | ManagerError::Cache(_) => S::InvalidArgument,
            // Neither the context nor a successor makes new bindings: gone
            // with its device, or ended in order.
            ManagerError::ContextEnded { state, .. } => match state {
                LifeState::Lost => S::DeviceLost,
                _ => S::InvalidState,
            },
            ManagerError::Lifecycle(l) => return Error::from(l.clone()),
            ManagerError::Terminate(t) => return Error::from(t.clone()),
        };
        Error::new(status, e.to_string())
    }
}

impl From<LifecycleError> for Error {
    #[cold]
    fn from(e: LifecycleError) -> Self {
        let status = match &e {
            LifecycleError::NotActive { .. } => S::InvalidState,
            LifecycleError::WrongDevice { .. } => S::WrongDevice,
            LifecycleError::SameContext(_) => S::InvalidArgument,
        };
        Error::new(status, e.to_string())
    }
}

impl From<TerminateError> for Error {
    #[cold]
    fn from(e: TerminateError) -> Self {
        let status = match &e {
            TerminateError::Active { .. } | TerminateError::AlreadyTerminated { .. } => S::InvalidState,
            TerminateError::InFlight { .. } => S::Timeout,
            TerminateError::StillLive { .. } => S::Busy,
        };
        Error::new(status, e.to_string())
    }
}

struct LastError {
    status: S,
    /// NUL-free UTF-8.
    message: String,
}

thread_local! {
    static LAST: RefCell<LastError> = const {
        RefCell::new(LastError { status: S::Ok, message: String::new() })
    };
}

#[cold]
pub(crate) fn set_last(status: S, message: String) {
    let message = message.replace('\0', "\\0");
    let _ = LAST.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            l.status = status;
            l.message = message;
        }
    });
}

#[cold]
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".into()
    }
}

/// Why a call made from inside a plugin slot is refused.
const REENTERED_FROM_PLUGIN: &str =
    "called from inside a plugin slot on this thread: a plugin may not call back into the host C API";

/// The panic boundary: runs an exported function's body, turns `Err` into
/// its code (recording the message) and a panic into
/// `MEMPLUG_HOST_STATUS_PANIC`. No unwind leaves (invariant 8). Refuses
/// with `MEMPLUG_HOST_STATUS_REENTRANT` when called from inside a plugin
/// slot on this thread.
#[inline(always)]
pub(crate) fn boundary(name: &'static str, body: impl FnOnce() -> Result<()>) -> S {
    // A plugin slot that calls back into the C API on the thread the host
    // called it from could destroy what the outer call is using (the
    // manager, the binding) and make that call return a dead handle: refused
    // as re-entrant, as from a callback that may not re-enter.
    if memplug_host_dep::inside_plugin_call() {
        return fail(name, Error::new(S::Reentrant, REENTERED_FROM_PLUGIN));
    }
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => S::Ok,
        Ok(Err(e)) => fail(name, e),
        Err(p) => panicked(name, p),
    }
}

#[cold]
#[inline(never)]
fn fail(name: &'static str, e: Error) -> S {
    set_last(e.status, format!("{name}: {}", e.message));
    e.status
}

#[cold]
#[inline(never)]
fn panicked(name: &'static str, p: Box<dyn std::any::Any + Send>) -> S {
    let msg = panic_message(&*p);
    // Dropping a payload can itself panic; never let that unwind out.
    let _ = catch_unwind(AssertUnwindSafe(move || drop(p)));
    set_last(S::Panic, format!("{name}: the host panicked: {msg}"));
    S::Panic
}

/// Like [`boundary`] for functions that return a value rather than a
/// status: `fallback` is returned when the body panics.
pub(crate) fn boundary_value<T>(name: &'static str, fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(p) => {
            let _ = panicked(name, p);
            fallback
        }
    }
}

/// Copies this thread's last error message into `buf` (at most `len - 1`
/// bytes, then a NUL; nothing when `buf` is NULL or `len` is 0) and returns
/// the message's full length in bytes, without the NUL — like `snprintf`,
/// so a caller can size a buffer and ask again. Returns 0 when no call on
/// this thread has failed yet.
///
/// The message is set by every failing call on this thread and kept until
/// the next failing call on this thread; successful calls leave it alone.
/// It names the function that failed and why (for a plugin's refusal, the
/// plugin's own message). It is UTF-8; truncation may cut a character.
///
/// Ownership: `buf` is the caller's. Thread-safety: reads this thread's
/// message only. Never fails.
///
/// # Safety
/// `buf`, when not NULL, must be writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_last_error_message(buf: *mut c_char, len: usize) -> usize {
    boundary_value("memplug_host_last_error_message", 0, || {
        LAST.try_with(|l| {
            let l = l.borrow();
            let m = l.message.as_bytes();
            if !buf.is_null() && len > 0 {
                let n = m.len().min(len - 1);
                // SAFETY: the caller gives `len` writable bytes at `buf`.
                unsafe {
                    std::ptr::copy_nonoverlapping(m.as_ptr(), buf.cast::<u8>(), n);
                    *buf.add(n) = 0;
                }
            }
            m.len()
        })
        .unwrap_or(0)
    })
}

/// The status of this thread's last failing call (`MEMPLUG_HOST_STATUS_OK`
/// when none failed yet). Thread-safety: this thread's only. Never fails.
#[no_mangle]
pub extern "C" fn memplug_host_last_error_status() -> MemplugHostStatus {
    boundary_value("memplug_host_last_error_status", S::Internal, || {
        LAST.try_with(|l| l.borrow().status).unwrap_or(S::Ok)
    })
}

/// Refuses a NULL pointer argument (`MEMPLUG_HOST_STATUS_NULL_ARGUMENT`,
/// "`what` is NULL").
#[inline]
pub(crate) fn require_non_null<T>(p: *const T, what: &str) -> Result<()> {
    if p.is_null() {
        Err(Error::null(what))
    } else {
        Ok(())
    }
}

/// Reads a NUL-terminated UTF-8 string argument.
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string.
pub(crate) unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    require_non_null(p, what)?;
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    let s = unsafe { std::ffi::CStr::from_ptr(p) };
    s.to_str().map_err(|e| Error::new(S::InvalidArgument, format!("{what} is not UTF-8: {e}")))
}

/// Writes a value to the caller's out-parameter (called last, only on
/// success).
///
/// # Safety
/// `out` must be valid for writes (checked non-NULL by the caller).
#[inline]
pub(crate) unsafe fn write_out<T>(out: *mut T, v: T) {
    // SAFETY: see above.
    unsafe { out.write(v) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        let n = unsafe { memplug_host_last_error_message(std::ptr::null_mut(), 0) };
        let mut buf = vec![0 as c_char; n + 1];
        let m = unsafe { memplug_host_last_error_message(buf.as_mut_ptr(), buf.len()) };
        assert_eq!(m, n);
        let bytes: Vec<u8> = buf[..n].iter().map(|c| *c as u8).collect();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn errors_set_the_message_and_successes_keep_it() {
        let s = boundary("f", || Err(Error::new(S::InvalidArgument, "bad size")));
        assert_eq!(s, S::InvalidArgument);
        assert_eq!(last(), "f: bad size");
        assert_eq!(memplug_host_last_error_status(), S::InvalidArgument);
        assert_eq!(boundary("g", || Ok(())), S::Ok);
        assert_eq!(last(), "f: bad size");
    }

    #[test]
    fn panics_are_contained() {
        let s = boundary("h", || panic!("boom {}", 7));
        assert_eq!(s, S::Panic);
        assert!(last().contains("boom 7"), "{}", last());
        assert_eq!(boundary_value("v", 5u32, || panic!("x")), 5);
    }

    #[test]
    fn truncation_keeps_a_nul_and_reports_the_full_length() {
        let _ = boundary("t", || Err(Error::new(S::Internal, "0123456789")));
        let mut buf = [1 as c_char; 4];
        let n = unsafe { memplug_host_last_error_message(buf.as_mut_ptr(), buf.len()) };
        assert_eq!(n, "t: 0123456789".len());
        assert_eq!(buf.map(|c| c as u8), *b"t: \0");
    }
}
