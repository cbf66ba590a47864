//! The plugin's line to the hosts that loaded it (ABI 1.2 services): how a
//! vendor reports that a device or context is lost, from any thread.
//!
//! A [`HostLink`] is made by the vendor in its init function and given to
//! the [`PluginBuilder`](super::PluginBuilder) (and, cloned, to whatever
//! notices a loss: a driver callback, a worker, a slot). Reporting a loss
//! does two things: it latches the mechanism lost inside the SDK, so every
//! slot of it answers `MEMPLUG_STATUS_DEVICE_LOST` from then on without the
//! vendor's code running (the ABI's "every later call fails the same way"),
//! and it tells every host that negotiated 1.2 or newer and published its
//! services.

use crate::abi::{MemplugHostServices, MEMPLUG_STATUS_OK};
use crate::prefix;
use crate::status::Status;
use core::ffi::c_char;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// A mechanism's lost latch, shared by its slot context and the link.
pub(super) type LostFlag = Arc<AtomicBool>;

/// See the module documentation. Cheap to clone; `Send + Sync`.
#[derive(Clone, Default)]
pub struct HostLink {
    inner: Arc<LinkInner>,
}

#[derive(Default)]
struct LinkInner {
    /// The services tables of the hosts holding the plugin now.
    hosts: Mutex<Vec<Services>>,
    /// Every mechanism of the plugin built with this link: (id, latch).
    mechanisms: Mutex<Vec<(u64, LostFlag)>>,
}

/// A host's services table, as read at negotiation.
#[derive(Clone, Copy)]
struct Services(MemplugHostServices);

// SAFETY: the host's services are callable from any thread (ABI 1.2), and
// the table is host-owned and immutable while the host holds the plugin.
unsafe impl Send for Services {}

/// What [`HostLink::report_device_lost`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LossReport {
    /// False when no mechanism of this link has that id (nothing latched,
    /// no host told).
    pub known: bool,
    /// Hosts that accepted the report.
    pub accepted: usize,
    /// Hosts that refused it, with the status they answered.
    pub refused: Vec<Status>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl HostLink {
    /// A link with no host yet (hosts attach at negotiation).
    pub fn new() -> Self {
        HostLink::default()
    }

    /// Reports that the device or context behind mechanism `mechanism_id`
    /// is lost: latches it (every slot of it returns DEVICE_LOST from now
    /// on) and tells every host holding the plugin. A second report
    /// latches nothing new and tells the hosts again (they ignore it).
    /// Never blocks on a host; callable from any thread, inside a slot too.
    pub fn report_device_lost(&self, mechanism_id: u64, reason: &str) -> LossReport {
        let flag =
            lock(&self.inner.mechanisms).iter().find(|(id, _)| *id == mechanism_id).map(|(_, f)| f.clone());
        let Some(flag) = flag else {
            return LossReport { known: false, accepted: 0, refused: Vec::new() };
        };
        flag.store(true, Ordering::Release);
        // Copied out so no lock of ours is held across a call into a host.
        let hosts = lock(&self.inner.hosts).clone();
        let mut report = LossReport { known: true, accepted: 0, refused: Vec::new() };
        for Services(s) in hosts {
            let Some(f) = s.report_device_lost else { continue };
            // SAFETY: a published 1.2 service of a host that holds the
            // plugin, called with the host's own context and a valid
            // (pointer, length) pair.
            let raw = unsafe { f(s.ctx, mechanism_id, reason.as_ptr().cast::<c_char>(), reason.len()) };
            if raw == MEMPLUG_STATUS_OK {
                report.accepted += 1;
            } else {
                report.refused.push(Status::from_raw_conservative(raw));
            }
        }
        report
    }

    /// Whether mechanism `mechanism_id` was reported lost through this link.
    pub fn is_lost(&self, mechanism_id: u64) -> bool {
        lock(&self.inner.mechanisms).iter().any(|(id, f)| *id == mechanism_id && f.load(Ordering::Acquire))
    }

    /// Hosts attached now (for tests and diagnostics).
    pub fn hosts(&self) -> usize {
        lock(&self.inner.hosts).len()
    }

    pub(super) fn add_mechanism(&self, id: u64, flag: LostFlag) {
        lock(&self.inner.mechanisms).push((id, flag));
    }

    /// Attaches the services a host published at negotiation, when it
    /// agreed on 1.2 or newer and its table is long enough to hold the
    /// 1.2 slots; anything else is ignored (that host gets no reports).
    ///
    /// # Safety
    /// `services` is NULL or the host's table, valid while it holds the
    /// plugin.
    pub(super) unsafe fn attach(&self, services: *const MemplugHostServices) {
        match prefix::read(services) {
            Ok(s) if s.struct_size >= crate::abi::size_1_2::HOST_SERVICES => {
                lock(&self.inner.hosts).push(Services(s))
            }
            _ => {}
        }
    }

    /// Forgets every host (the last hold on the plugin was given back).
    pub(super) fn detach_all(&self) {
        lock(&self.inner.hosts).clear();
    }
}
