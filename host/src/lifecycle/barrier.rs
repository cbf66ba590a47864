//! The asymmetric fence pair of the operation gate: a [`light`] one on
//! every call (no instruction at all where the kernel helps) and a
//! [`heavy`] one when a gate closes (a system call).
//!
//! A caller enters by writing its seat's count, then fencing, then reading
//! whether the gate is closed; a closer writes "closed", fences, then reads
//! every count. With a full fence on both sides, at least one of them sees
//! the other's write (Dekker's argument): the caller sees "closed" and
//! backs out, or the closer sees the count and waits. Linux's
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` runs a full memory
//! barrier on every CPU that is running a thread of this process (and a
//! thread that is not running passed one when it was switched out), so
//! the closer can pay for both fences, and the caller's needs only to keep
//! the compiler from moving its read above its write.
//!
//! Where the kernel refuses (before Linux 4.14, or a seccomp policy
//! without the call), both sides use a full fence: `MEMBARRIER_WORKS` is
//! decided once, before the first gate exists, and never changes, so a
//! caller and a closer of one gate always agree. Under loom both sides are
//! `fence(SeqCst)`, which loom models exactly.

#[cfg(not(loom))]
use std::sync::atomic::{compiler_fence, fence, AtomicBool, Ordering::Relaxed, Ordering::SeqCst};
#[cfg(not(loom))]
use std::sync::OnceLock;

#[cfg(not(loom))]
const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
#[cfg(not(loom))]
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
#[cfg(not(loom))]
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

/// Whether the heavy side is `membarrier` (else both sides are fences).
#[cfg(not(loom))]
static MEMBARRIER_WORKS: AtomicBool = AtomicBool::new(false);
#[cfg(not(loom))]
static DECIDED: OnceLock<()> = OnceLock::new();

/// Decides, once per process, whether the kernel's barrier can be used:
/// called by every gate as it is made, before any caller or closer can use
/// it. `MEMPLUG_NO_MEMBARRIER=1` forces the full fences (to test them).
#[cfg(not(loom))]
pub(crate) fn prepare() {
    DECIDED.get_or_init(|| {
        if std::env::var_os("MEMPLUG_NO_MEMBARRIER").is_some_and(|v| v == "1") {
            return;
        }
        // SAFETY: membarrier takes three integers and touches no memory
        // of ours.
        let supported = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0) };
        if supported < 0 || supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED == 0 {
            return;
        }
        // SAFETY: as above.
        let registered =
            unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) };
        MEMBARRIER_WORKS.store(registered == 0, Relaxed);
    });
}

#[cfg(loom)]
pub(crate) fn prepare() {}

/// Under loom both sides are fences.
#[cfg(loom)]
pub fn uses_membarrier() -> bool {
    false
}

/// Whether closers use the kernel's barrier (for reports and tests).
#[cfg(not(loom))]
pub fn uses_membarrier() -> bool {
    prepare();
    MEMBARRIER_WORKS.load(Relaxed)
}

/// The caller's side: between its count's write and its read of "closed".
#[cfg(not(loom))]
#[inline(always)]
pub(crate) fn light() {
    if MEMBARRIER_WORKS.load(Relaxed) {
        compiler_fence(SeqCst);
    } else {
        fence(SeqCst);
    }
}

/// The closer's side: between its write of "closed" and its reads of the
/// counts.
#[cfg(not(loom))]
pub(crate) fn heavy() {
    fence(SeqCst);
    if MEMBARRIER_WORKS.load(Relaxed) {
        // SAFETY: as in `prepare`; the process registered for this command.
        let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) };
        // Registered at `prepare`, so it cannot fail but for a kernel
        // bug; callers rely on it, so a failure must not pass silently.
        assert_eq!(r, 0, "membarrier(PRIVATE_EXPEDITED) failed after registration");
    }
}

#[cfg(loom)]
#[inline(always)]
pub(crate) fn light() {
    loom::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

#[cfg(loom)]
pub(crate) fn heavy() {
    loom::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}
