//! The process's registry of plugins and their mechanisms, selection by
//! device and required capabilities, and pinned contexts.
//!
//! A [`Context`] (`crate::context`) is a mechanism pinned for use:
//! bindings, allocations and queued frees hold it, and a plugin whose
//! contexts are pinned cannot be unloaded (the unload is refused and says
//! what holds it) — unless every context of the plugin has terminated:
//! then what still holds one is inert, and the plugin is unregistered (its
//! library closes when the last inert handle is gone).

pub use crate::context::Context;
use crate::events::Hub;
use crate::lifecycle::LifeState;
use crate::mechanism::{Device, Location, Mechanism};
use crate::plugin::{LiveReport, Plugin};
use crate::sync::{lock, Mutex};
use memplug_sdk::abi::MemplugDevice;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long an unload waits for the host's own sweeps of the contexts (a
/// reaper turn, a stats report) to let go of them before it reports what
/// it still sees as pins. A sweep is short; the bound is for a sweep that
/// itself asks for the unload (a fence callback run by the reaper).
const SWEEP_WAIT: Duration = Duration::from_secs(1);

/// Capabilities a caller needs from a mechanism. Asking for one the
/// mechanism lacks is an error, never a silent fallback (invariant 3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Requirements {
    /// Reserve/commit/decommit (`MEMPLUG_CAP_VIRTUAL_BACKING`): needed for
    /// [`MemoryBinding::reserve_virtual`](crate::MemoryBinding::reserve_virtual).
    pub virtual_backing: bool,
    /// Physical objects mapped into reservations
    /// (`MEMPLUG_CAP_SHARED_MAPPING`): needed, with virtual backing, for
    /// shared prefixes.
    pub shared_mapping: bool,
    /// Streams and fences (`MEMPLUG_CAP_SYNC`).
    pub sync: bool,
}

impl Requirements {
    /// Nothing beyond the allocator every mechanism has: any mechanism on
    /// the device qualifies.
    pub const ALLOCATOR_ONLY: Requirements =
        Requirements { virtual_backing: false, shared_mapping: false, sync: false };

    fn missing(&self, m: &Mechanism) -> Vec<String> {
        let c = m.capabilities();
        [
            (self.virtual_backing && !c.virtual_backing(), "virtual_backing"),
            (self.shared_mapping && !c.shared_mapping(), "shared_mapping"),
            (self.sync && !c.sync(), "sync"),
        ]
        .iter()
        .filter(|(m, _)| *m)
        .map(|(_, n)| n.to_string())
        .collect()
    }

    fn wanted(&self) -> Vec<String> {
        [
            (self.virtual_backing, "virtual_backing"),
            (self.shared_mapping, "shared_mapping"),
            (self.sync, "sync"),
        ]
        .iter()
        .filter(|(w, _)| *w)
        .map(|(_, n)| n.to_string())
        .collect()
    }
}

/// What a caller needs of a mechanism's memory (ABI 1.2's descriptor):
/// attributes, a location, a page size. A mechanism that agreed on an
/// older minor says nothing of them, so it meets no such need.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryNeeds {
    /// `MEMPLUG_ATTR_*` bits the mechanism must claim, all of them.
    pub attributes: u32,
    /// Where its memory must live (exactly this kind and id).
    pub location: Option<Location>,
    /// A page size (a power of two) it must publish.
    pub page_size: Option<u64>,
}

impl MemoryNeeds {
    fn missing(&self, m: &Mechanism) -> Vec<String> {
        let d = m.properties().descriptor;
        let mut v = Vec::new();
        let lacking = self.attributes & !d.attributes;
        if lacking != 0 {
            v.push(format!("attributes {lacking:#x}"));
        }
        if let Some(l) = self.location {
            if d.location != l {
                v.push(format!(
                    "location {}:{} (it has {}:{})",
                    l.kind, l.id, d.location.kind, d.location.id
                ));
            }
        }
        if let Some(p) = self.page_size {
            if p == 0 || !d.accepts_page_size(p) {
                v.push(format!("page size {p:#x}"));
            }
        }
        v
    }

    fn wanted(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.attributes != 0 {
            w.push(format!("attributes {:#x}", self.attributes));
        }
        if let Some(l) = self.location {
            w.push(format!("location {}:{}", l.kind, l.id));
        }
        if let Some(p) = self.page_size {
            w.push(format!("page size {p:#x}"));
        }
        w
    }
}

/// Why a registry operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A plugin of this name is registered already (a second copy of one
    /// plugin, or two plugins that chose one name); the new one was not
    /// registered and is dropped (unloaded) with the error's caller.
    #[error("a plugin named '{0}' is already registered")]
    DuplicatePlugin(String),
    /// No registered plugin has this name.
    #[error("no plugin named '{0}' is registered")]
    UnknownPlugin(String),
    /// No active mechanism serves the device asked for (none registered,
    /// or every one retiring, lost or terminated).
    #[error("no mechanism serves device {device}")]
    NoDevice {
        /// The device, as the host names devices (e.g. `cpu:0`).
        device: String,
    },
    /// Mechanisms serve the device, but none has everything required.
    #[error("no mechanism on device {device} has {wanted}; candidates: {candidates}")]
    MissingCapability {
        /// The device, as the host names devices.
        device: String,
        /// Everything that was required, joined with `+`.
        wanted: String,
        /// Each candidate and what it lacks, joined with `; `.
        candidates: String,
    },
    /// No mechanism has this `plugin/mechanism` or mechanism name.
    #[error("no mechanism named '{0}'")]
    UnknownMechanism(String),
    /// The plugin is still in use; it stays registered and loaded, as it
    /// was.
    #[error("plugin '{name}' cannot unload: {detail}")]
    UnloadRefused {
        /// The plugin's name.
        name: String,
        /// What holds it: pinned mechanisms with their object and handle
        /// counts, or the plugin's own live-object report.
        detail: String,
    },
}

struct Entry {
    plugin: Plugin,
    contexts: Vec<Arc<Context>>,
}

impl Entry {
    fn new(plugin: Plugin) -> Entry {
        let contexts = plugin.mechanisms().iter().map(|m| Arc::new(Context::new(m.clone()))).collect();
        Entry { plugin, contexts }
    }
}

/// Plugins, mechanisms, contexts. Thread-safe; no lock is held while a
/// plugin is called.
pub struct Registry {
    entries: Mutex<Vec<Entry>>,
    /// Sweeps alive now (see [`Sweep`]). Raised under `entries`, lowered
    /// only after the sweep's handles are dropped: under `entries` with
    /// zero here, every handle beyond the registry's own is a caller's.
    sweeps: AtomicUsize,
    /// Where its plugins' messages and its contexts' losses go.
    hub: Arc<Hub>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::with_hub(Hub::new())
    }
}

impl Registry {
    /// An empty registry whose plugins' messages and contexts' losses go
    /// to `hub`.
    pub fn with_hub(hub: Arc<Hub>) -> Self {
        Registry { entries: Mutex::new(Vec::new()), sweeps: AtomicUsize::new(0), hub }
    }

    /// Registers a loaded plugin; names must be unique.
    pub fn register(&self, plugin: Plugin) -> Result<(), RegistryError> {
        let mut e = lock(&self.entries);
        if e.iter().any(|x| x.plugin.name() == plugin.name()) {
            return Err(RegistryError::DuplicatePlugin(plugin.name().into()));
        }
        plugin.attach_hub(&self.hub);
        e.push(Entry::new(plugin));
        Ok(())
    }

    /// Every registered mechanism, in registration order.
    pub fn mechanisms(&self) -> Vec<Mechanism> {
        let e = lock(&self.entries);
        e.iter().flat_map(|x| x.plugin.mechanisms().iter().cloned()).collect()
    }

    /// Names of the registered plugins.
    pub fn plugins(&self) -> Vec<String> {
        let e = lock(&self.entries);
        e.iter().map(|x| x.plugin.name().to_string()).collect()
    }

    /// The context of a mechanism, by `plugin/mechanism` or bare mechanism
    /// name (first match).
    pub fn context_named(&self, name: &str) -> Result<Arc<Context>, RegistryError> {
        let e = lock(&self.entries);
        let (plugin, mech) = match name.split_once('/') {
            Some((p, m)) => (Some(p), m),
            None => (None, name),
        };
        e.iter()
            .filter(|x| plugin.is_none_or(|p| x.plugin.name() == p))
            .flat_map(|x| x.contexts.iter())
            .find(|c| c.mechanism().name() == mech)
            .cloned()
            .ok_or_else(|| RegistryError::UnknownMechanism(name.into()))
    }

    /// The first mechanism (in registration order) on `device` that has
    /// every required capability; an error naming what is missing
    /// otherwise.
    pub fn select(&self, device: MemplugDevice, req: Requirements) -> Result<Arc<Context>, RegistryError> {
        self.select_needing(device, req, &MemoryNeeds::default())
    }

    /// [`select`](Self::select), also requiring what `needs` says of the
    /// memory (ABI 1.2 descriptor: attributes, location, page size).
    pub fn select_needing(
        &self,
        device: MemplugDevice,
        req: Requirements,
        needs: &MemoryNeeds,
    ) -> Result<Arc<Context>, RegistryError> {
        let e = lock(&self.entries);
        // Only active contexts are chosen: a retiring or lost one makes no
        // new objects.
        let on_device: Vec<&Arc<Context>> = e
            .iter()
            .flat_map(|x| x.contexts.iter())
            .filter(|c| c.mechanism().device().0 == device && c.state() == LifeState::Active)
            .collect();
        if on_device.is_empty() {
            return Err(RegistryError::NoDevice { device: Device(device).to_string() });
        }
        let missing = |c: &Context| {
            let mut v = req.missing(c.mechanism());
            v.extend(needs.missing(c.mechanism()));
            v
        };
        if let Some(c) = on_device.iter().find(|c| missing(c).is_empty()) {
            return Ok((*c).clone());
        }
        let mut wanted = req.wanted();
        wanted.extend(needs.wanted());
        let candidates: Vec<String> = on_device
            .iter()
            .map(|c| {
                format!(
                    "{}/{} lacks {}",
                    c.mechanism().plugin_name(),
                    c.mechanism().name(),
                    missing(c).join("+")
                )
            })
            .collect();
        Err(RegistryError::MissingCapability {
            device: Device(device).to_string(),
            wanted: wanted.join("+"),
            candidates: candidates.join("; "),
        })
    }

    /// Unregisters and unloads a plugin, or refuses — leaving it registered
    /// — when a context is pinned or the plugin has live objects.
    ///
    /// The host's own sweeps hold every context for a moment; they are not
    /// pins. An unload that sees handles while a sweep is alive waits for
    /// it to end (at most a second) and looks again.
    pub fn unload(&self, name: &str) -> Result<(), RegistryError> {
        let deadline = Instant::now() + SWEEP_WAIT;
        let entry = loop {
            let mut e = lock(&self.entries);
            let i = e
                .iter()
                .position(|x| x.plugin.name() == name)
                .ok_or_else(|| RegistryError::UnknownPlugin(name.into()))?;
            if e[i].contexts.iter().all(|c| c.state() == LifeState::Terminated) {
                // Everything still holding a context is inert: unregister
                // now; the library closes with the last handle.
                drop(e.remove(i));
                return Ok(());
            }
            // Read before the counts: a sweep lowers it only after its
            // handles are gone, and none starts while `entries` is held, so
            // with none alive every count below is a caller's.
            let sweeping = self.sweeps.load(SeqCst);
            let pinned: Vec<String> = e[i]
                .contexts
                .iter()
                .filter_map(|c| {
                    let handles = Arc::strong_count(c) - 1;
                    (handles > 0).then(|| {
                        format!(
                            "mechanism '{}' is pinned by {} object(s) and {handles} handle(s)",
                            c.mechanism().name(),
                            c.pins(),
                        )
                    })
                })
                .collect();
            if pinned.is_empty() {
                break (i, e.remove(i));
            }
            if sweeping > 0 && Instant::now() < deadline {
                drop(e);
                std::thread::sleep(Duration::from_micros(50));
                continue;
            }
            let during = if sweeping > 0 {
                format!(" (the host's own sweep of the contexts still held them after {SWEEP_WAIT:?})")
            } else {
                String::new()
            };
            return Err(RegistryError::UnloadRefused {
                name: name.into(),
                detail: pinned.join(", ") + &during,
            });
        };
        let (at, Entry { plugin, contexts }) = entry;
        drop(contexts);
        // Outside the lock: unloading calls into the plugin.
        plugin.unload().map_err(|refused| {
            let detail = refused.report.to_string();
            // Put it back where it was: a refused unload leaves everything
            // as it was, selection order included. (Never dropped, even if
            // its name was taken meanwhile: it still has live objects.)
            let mut e = lock(&self.entries);
            let at = at.min(e.len());
            e.insert(at, Entry::new(refused.plugin));
            RegistryError::UnloadRefused { name: name.into(), detail }
        })
    }

    /// Every context, in registration order. The handles are the
    /// caller's: while one is held, its plugin does not unload.
    pub fn contexts(&self) -> Vec<Arc<Context>> {
        let e = lock(&self.entries);
        e.iter().flat_map(|x| x.contexts.iter().cloned()).collect()
    }

    /// Every context, in registration order, for one look by the host
    /// itself (see [`Sweep`]).
    pub(crate) fn sweep(&self) -> Sweep<'_> {
        let e = lock(&self.entries);
        self.sweeps.fetch_add(1, SeqCst);
        Sweep { contexts: e.iter().flat_map(|x| x.contexts.iter().cloned()).collect(), sweeps: &self.sweeps }
    }

    /// The name of the plugin that published `context`.
    pub fn plugin_of(&self, context: &Context) -> Option<String> {
        let e = lock(&self.entries);
        e.iter()
            .find(|x| x.contexts.iter().any(|c| std::ptr::eq(Arc::as_ptr(c), context)))
            .map(|x| x.plugin.name().to_string())
    }

    /// Whether every context of plugin `name` has terminated.
    pub fn all_terminated(&self, name: &str) -> bool {
        let e = lock(&self.entries);
        e.iter()
            .find(|x| x.plugin.name() == name)
            .is_some_and(|x| x.contexts.iter().all(|c| c.state() == LifeState::Terminated))
    }

    /// What keeps each plugin loaded.
    pub fn live_reports(&self) -> Vec<(String, LiveReport)> {
        let e = lock(&self.entries);
        e.iter().map(|x| (x.plugin.name().to_string(), x.plugin.live_report())).collect()
    }
}

/// The host's own short look at every context (a reaper turn, a stats
/// report, a replace): its handles keep the contexts alive while it looks
/// but do not count as pins, since an unload that meets them waits for the
/// sweep to end (see [`Registry::unload`]).
pub(crate) struct Sweep<'a> {
    contexts: Vec<Arc<Context>>,
    sweeps: &'a AtomicUsize,
}

impl std::ops::Deref for Sweep<'_> {
    type Target = [Arc<Context>];
    fn deref(&self) -> &[Arc<Context>] {
        &self.contexts
    }
}

impl Drop for Sweep<'_> {
    fn drop(&mut self) {
        // Handles first, then the count: an unload that sees no sweep sees
        // none of its handles either.
        self.contexts.clear();
        self.sweeps.fetch_sub(1, SeqCst);
    }
}
