//! The states of a context's life and what each admits.

use std::fmt;

/// Where a context is in its life. Transitions only go forward:
/// `Active` → `Retiring` → (`Lost`) → `Terminated`, or `Active` → `Lost` →
/// `Terminated`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum LifeState {
    /// Serving: new bindings, allocations and regions are made here.
    Active = 0,
    /// Orderly end (replaced, or retired by the runtime): no new binding
    /// or object; existing objects keep working, and it terminates once
    /// the last is gone.
    Retiring = 1,
    /// The device or context is gone (a reported loss, or a slot that
    /// answered DEVICE_LOST): the host calls the plugin no more; calls in
    /// flight finish or fail; the objects went with it.
    Lost = 2,
    /// Confirmed over: nothing in flight, and every charge of the context
    /// settled exactly once. Handles that outlive it are inert.
    Terminated = 3,
}

impl LifeState {
    pub(crate) const ALL: [LifeState; 4] =
        [LifeState::Active, LifeState::Retiring, LifeState::Lost, LifeState::Terminated];

    #[inline(always)]
    pub(crate) fn from_word(w: u64) -> LifeState {
        LifeState::ALL[(w as usize).min(3)]
    }

    /// Whether the door lets a call into the plugin through.
    #[inline(always)]
    pub fn admits_calls(self) -> bool {
        (self as u8) < LifeState::Lost as u8
    }

    /// Whether new bindings and new objects may be made.
    #[inline(always)]
    pub fn admits_new_work(self) -> bool {
        self == LifeState::Active
    }

    /// The state's lower-case name, as events, reports and the C API
    /// print it (`active`, `retiring`, `lost`, `terminated`).
    pub fn name(self) -> &'static str {
        match self {
            LifeState::Active => "active",
            LifeState::Retiring => "retiring",
            LifeState::Lost => "lost",
            LifeState::Terminated => "terminated",
        }
    }
}

impl fmt::Display for LifeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
