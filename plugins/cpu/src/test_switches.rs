//! Test-only switches: ways for a test to make the CPU plugin report things a
//! real device would, on a machine that has none. **Off unless**
//! `MEMPLUG_CPU_TEST_SWITCHES=1` is in the environment when a plugin
//! instance is built (its first negotiation, or the first after an unload);
//! an instance built without it refuses every switch, whatever the
//! environment says later.
//!
//! One switch today, exported from the library so that a host's tests can
//! reach it with `dlsym` on the library they loaded (`dlopen` of the same
//! file returns the same library, hence the same instance):
//!
//! ```c
//! MemplugStatus memplug_cpu_test_report_loss(uint64_t mechanism_id);
//! ```
//!
//! It reports mechanism `mechanism_id` lost through the plugin's
//! [`HostLink`], exactly as a device plugin reports a dead device: the SDK
//! latches the mechanism (every slot of it then answers
//! `MEMPLUG_STATUS_DEVICE_LOST` without reaching the CPU code) and every
//! host that agreed on ABI 1.2 or newer is told (`report_device_lost`, with
//! the reason `"test switch"`). Answers:
//!
//! * `MEMPLUG_STATUS_OK` — reported (latched; told every 1.2 host holding
//!   the plugin, if any);
//! * `MEMPLUG_STATUS_INVALID_STATE` — switches are off (no instance built
//!   with `MEMPLUG_CPU_TEST_SWITCHES=1` is alive): nothing happened;
//! * `MEMPLUG_STATUS_WRONG_MECHANISM` — switches are on but no mechanism
//!   has that id: nothing happened.
//!
//! Every live instance of this copy of the code built with switches on is
//! addressed (the exported entry's and the in-process entry's, when both
//! were negotiated); `OK` when at least one knew the id.

use memplug_sdk::abi::{
    MemplugStatus, MEMPLUG_STATUS_INTERNAL, MEMPLUG_STATUS_INVALID_STATE, MEMPLUG_STATUS_OK,
    MEMPLUG_STATUS_WRONG_MECHANISM,
};
use memplug_sdk::HostLink;
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// The environment variable that turns the switches on (value `1`), read
/// when a plugin instance is built.
pub const SWITCHES_ENV: &str = "MEMPLUG_CPU_TEST_SWITCHES";

/// The reason a switched loss carries to the host.
pub const LOSS_REASON: &str = "test switch";

/// One plugin instance's switches: held (strongly) by the instance, so
/// they go with it at unload; the registry keeps only a weak reference.
pub(crate) struct Switches {
    link: HostLink,
    enabled: bool,
}

static INSTANCES: Mutex<Vec<Weak<Switches>>> = Mutex::new(Vec::new());

impl Drop for Switches {
    /// Leaves the registry, and frees its buffer when it empties: a static
    /// is never dropped, so a buffer left at unload would be lost with the
    /// library (once per load and unload).
    fn drop(&mut self) {
        let me: *const Switches = self;
        let mut all = INSTANCES.lock().unwrap_or_else(PoisonError::into_inner);
        all.retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), me));
        if all.is_empty() {
            *all = Vec::new();
        }
    }
}

impl Switches {
    /// The switches of an instance being built now: enabled when
    /// [`SWITCHES_ENV`] is `1` at this moment. Registered for
    /// [`memplug_cpu_test_report_loss`] while the answer lives.
    pub(crate) fn for_new_instance(link: &HostLink) -> Arc<Switches> {
        let enabled = std::env::var_os(SWITCHES_ENV).is_some_and(|v| v == "1");
        let s = Arc::new(Switches { link: link.clone(), enabled });
        let mut all = INSTANCES.lock().unwrap_or_else(PoisonError::into_inner);
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&s));
        s
    }
}

/// What the switch does, outside the panic boundary.
fn report_loss(mechanism_id: u64) -> MemplugStatus {
    // Upgraded under the lock, used outside it: no lock of ours is held
    // while a host is called.
    let live: Vec<Arc<Switches>> = INSTANCES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|s| s.enabled)
        .collect();
    if live.is_empty() {
        return MEMPLUG_STATUS_INVALID_STATE;
    }
    let mut known = false;
    for s in &live {
        known |= s.link.report_device_lost(mechanism_id, LOSS_REASON).known;
    }
    if known {
        MEMPLUG_STATUS_OK
    } else {
        MEMPLUG_STATUS_WRONG_MECHANISM
    }
}

/// Test switch: reports mechanism `mechanism_id` lost (see the module
/// documentation). Refused with `MEMPLUG_STATUS_INVALID_STATE` unless the
/// plugin was built with `MEMPLUG_CPU_TEST_SWITCHES=1`.
#[no_mangle]
pub extern "C" fn memplug_cpu_test_report_loss(mechanism_id: u64) -> MemplugStatus {
    std::panic::catch_unwind(|| report_loss(mechanism_id)).unwrap_or(MEMPLUG_STATUS_INTERNAL)
}
