//! The process memory manager: registers plugins and devices, selects
//! mechanisms, pins contexts, creates pools, and issues bindings — the only
//! way to allocate (ARCHITECTURE.md §1).

use crate::binding::MemoryBinding;
use crate::cache::{CacheConfig, CachingBinding};
use crate::context::{Context, LifecycleError, Settlement, TerminateError};
use crate::deferred::{DeferredFreeQueue, DrainReport, Reaper};
use crate::error::LoadError;
use crate::events::{Event, Hub, Level};
use crate::governor::{AllocationClass, Governor, GovernorError, HolderId, Pool, PressureCallback};
use crate::lifecycle::LifeState;
use crate::mechanism::{Location, Mechanism, Placement};
use crate::observe::StatsReport;
use crate::plugin::{LoadOptions, Plugin};
use crate::registry::{MemoryNeeds, Registry, RegistryError, Requirements};
use crate::sync::{lock, Mutex};
use memplug_sdk::abi::MemplugDevice;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Why the manager refused.
#[derive(Debug, thiserror::Error)]
///
/// Every refusal leaves the manager as it was: nothing half-registered,
/// half-created or half-bound.
pub enum ManagerError {
    /// [`load_plugin`](ProcessMemoryManager::load_plugin): the plugin could
    /// not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// Registering, selecting, naming or unloading was refused.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// Creating a pool was refused (a taken name, a capacity too large, a
    /// parent of another manager).
    #[error(transparent)]
    Governor(#[from] GovernorError),
    /// [`bind`](ProcessMemoryManager::bind): the spec names a holder that
    /// was never registered with the pool being bound.
    #[error("holder {holder} is not registered with pool '{pool}'")]
    HolderNotInPool {
        /// The holder in the spec.
        holder: HolderId,
        /// The pool's name.
        pool: String,
    },
    /// The context (and every successor) is not active: it makes no new
    /// bindings.
    #[error("context {context} is {state} and has no active successor: it makes no new bindings")]
    ContextEnded {
        /// The context asked, as `plugin/mechanism`.
        context: String,
        /// Its state.
        state: crate::lifecycle::LifeState,
    },
    /// Retiring or replacing a context was refused.
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    /// [`terminate`](ProcessMemoryManager::terminate) did not terminate.
    #[error(transparent)]
    Terminate(#[from] TerminateError),
    /// A caching binding was asked for with a holder of the caller's: the
    /// cache registers its own.
    #[error("a caching binding registers its own holder; the spec names {holder}")]
    CacheHolder {
        /// The holder the spec named.
        holder: HolderId,
    },
    /// The cache's configuration is refused.
    #[error("cache configuration: {0}")]
    Cache(String),
}

/// What a binding is for.
#[derive(Clone, Debug)]
pub struct BindingSpec {
    /// What the memory is for: its charges are counted under this class,
    /// and the plugin sees its tag in each request.
    pub class: AllocationClass,
    /// The pressure holder its charges belong to (registered with the pool
    /// being bound); `None` charges the pool's anonymous account.
    pub holder: Option<HolderId>,
    /// How long an allocation may wait for pressure to free room; `None`
    /// fails at once after the pressure tickets.
    pub wait: Option<Duration>,
    /// How its memory is asked for (ABI 1.2: hints, page size, location,
    /// export kinds); a plugin of an older minor is sent none of it.
    pub placement: Placement,
}

impl BindingSpec {
    /// A spec of `class` with no holder, no waiting and no placement.
    pub fn new(class: AllocationClass) -> Self {
        BindingSpec { class, holder: None, wait: None, placement: Placement::default() }
    }
    /// Charges belong to holder `h` (see the `holder` field).
    pub fn holder(mut self, h: HolderId) -> Self {
        self.holder = Some(h);
        self
    }
    /// An allocation that does not fit after the pressure tickets waits up
    /// to `d` for room (a refund, a capacity raise) before it fails.
    pub fn wait(mut self, d: Duration) -> Self {
        self.wait = Some(d);
        self
    }
    /// The binding's memory need not be zeroed
    /// (`MEMPLUG_HINT_UNINITIALIZED_OK`): a zero-filling mechanism may skip
    /// the fill. Only for memory the caller overwrites before reading.
    pub fn uninitialized_ok(mut self) -> Self {
        self.placement.hints |= memplug_sdk::abi::MEMPLUG_HINT_UNINITIALIZED_OK;
        self
    }
    /// Pages of `bytes` (a power of two the mechanism publishes; a plugin
    /// refuses another).
    pub fn page_size(mut self, bytes: u64) -> Self {
        self.placement.page_size = bytes;
        self
    }
    /// Where the memory should live (a plugin that cannot place it there
    /// refuses).
    pub fn location(mut self, l: Location) -> Self {
        self.placement.location = l;
        self
    }
    /// The `MEMPLUG_HANDLE_*` kinds its memory will be exported as.
    pub fn export_types(mut self, types: u32) -> Self {
        self.placement.export_types = types;
        self
    }
}

/// One per process (or per embedding). Thread-safe.
///
/// Load (or register) plugins, select a mechanism's context by device and
/// capabilities, create pools with hard capacities, and bind: a
/// [`MemoryBinding`] is the only way to memory. Dropping the manager drains
/// its deferred-free queue for up to a second.
///
/// ```
/// use memplug_host::governor::AllocationClass;
/// use memplug_host::{BindingSpec, LoadOptions, Plugin, ProcessMemoryManager, Requirements};
/// use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
///
/// let mgr = ProcessMemoryManager::new();
/// // A plugin library loads by path: `mgr.load_plugin("./libmemplug_plugin_cpu.so", &opts)`.
/// // Here the reference CPU plugin is linked in, and goes through the same checks.
/// // SAFETY: its entry is built against this ABI.
/// let cpu = unsafe { Plugin::from_entry(memplug_plugin_cpu::cpu_plugin_entry, "cpu", &LoadOptions::default()) }?;
/// let plugin = cpu.name().to_string();
/// mgr.register_plugin(cpu)?;
///
/// let cpu0 = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };
/// let ctx = mgr.select(cpu0, Requirements::ALLOCATOR_ONLY)?;
/// let pool = mgr.create_pool("cpu0", 64 << 20)?;
/// let scratch = mgr.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Workspace))?;
///
/// let buf = scratch.allocate(4096, 64)?; // grant → allocate → charge
/// assert_eq!(buf.addr() % 64, 0);
/// assert_eq!(pool.used(), buf.charged());
/// drop(buf); // no fence recorded: freed through its mechanism and refunded now
/// assert_eq!(pool.used(), 0);
///
/// // Over budget is an error, never a silent overcommit.
/// assert!(scratch.allocate(128 << 20, 64).is_err());
///
/// // A plugin unloads once nothing it made is alive.
/// drop((scratch, ctx));
/// mgr.unload_plugin(&plugin)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ProcessMemoryManager {
    registry: Arc<Registry>,
    governor: Arc<Governor>,
    queue: Arc<DeferredFreeQueue>,
    reaper: Mutex<Option<Reaper>>,
    /// Plugins to unload once every context of theirs has terminated
    /// (replaced by another plugin).
    unload_when_settled: Arc<Mutex<Vec<String>>>,
}

impl Default for ProcessMemoryManager {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessMemoryManager {
    /// An empty manager: no plugin, no pool, no reaper thread (see
    /// [`start_reaper`](Self::start_reaper); without one, call
    /// [`poll`](Self::poll)).
    pub fn new() -> Self {
        let hub = Hub::new();
        ProcessMemoryManager {
            registry: Arc::new(Registry::with_hub(hub.clone())),
            queue: DeferredFreeQueue::with_hub(hub.clone()),
            governor: Governor::with_hub(hub),
            reaper: Mutex::new(None),
            unload_when_settled: Arc::default(),
        }
    }

    /// Its plugins, mechanisms and contexts.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }
    /// Its pools (every pool of [`create_pool`](Self::create_pool)).
    pub fn governor(&self) -> &Arc<Governor> {
        &self.governor
    }
    /// The deferred-free queue every binding of this manager releases
    /// through.
    pub fn queue(&self) -> &Arc<DeferredFreeQueue> {
        &self.queue
    }

    /// Where this manager's events and its plugins' messages go
    /// (`crate::events`).
    pub fn hub(&self) -> &Arc<Hub> {
        self.governor.hub()
    }

    /// Calls `f` with every later event of this manager: grants, refusals,
    /// tickets, evictions, quarantines, retired frees, context losses
    /// (see [`Hub`] for when and on which thread). Replaces the listener
    /// set before.
    pub fn set_event_listener(&self, f: impl Fn(&Event<'_>) + Send + Sync + 'static) {
        self.hub().set_event_listener(f);
    }

    /// Calls `f(level, source, message)` with every later message of this
    /// manager's plugins; `source` is `plugin/mechanism`. Replaces the hook
    /// set before.
    pub fn set_log_hook(&self, f: impl Fn(Level, &str, &str) + Send + Sync + 'static) {
        self.hub().set_log_hook(f);
    }

    /// Every figure of this manager now: pools and their holders, the
    /// deferred-free queue, contexts (see [`StatsReport`]).
    pub fn stats(&self) -> StatsReport {
        StatsReport::gather(&self.governor, self.queue.stats(), &self.registry)
    }

    /// Loads and registers a plugin library; returns its name.
    pub fn load_plugin(&self, path: impl AsRef<Path>, opts: &LoadOptions) -> Result<String, ManagerError> {
        let p = Plugin::load_with(path, opts)?;
        let name = p.name().to_string();
        self.registry.register(p)?;
        Ok(name)
    }

    /// Registers an already loaded plugin (e.g. an in-process entry).
    pub fn register_plugin(&self, plugin: Plugin) -> Result<(), ManagerError> {
        Ok(self.registry.register(plugin)?)
    }

    /// Every registered mechanism.
    pub fn mechanisms(&self) -> Vec<Mechanism> {
        self.registry.mechanisms()
    }

    /// The first mechanism on `device` with every required capability.
    pub fn select(&self, device: MemplugDevice, req: Requirements) -> Result<Arc<Context>, ManagerError> {
        Ok(self.registry.select(device, req)?)
    }

    /// [`select`](Self::select), also requiring what `needs` says of the
    /// memory (ABI 1.2: attributes, location, page size).
    pub fn select_needing(
        &self,
        device: MemplugDevice,
        req: Requirements,
        needs: &MemoryNeeds,
    ) -> Result<Arc<Context>, ManagerError> {
        Ok(self.registry.select_needing(device, req, needs)?)
    }

    /// Where [`Region::offload_to`](crate::binding::Region::offload_to) sends `from`'s
    /// bytes by default: the page-locked host memory of the same device
    /// where a plugin publishes it (`MEMPLUG_DEVICE_CUDA_HOST` or
    /// `MEMPLUG_DEVICE_ROCM_HOST` with the device's ordinal: the memory
    /// DMA copies want), else CPU 0's memory. Selected with an allocator
    /// only; bind it to a host pool to offload into.
    pub fn offload_context(&self, from: &Context) -> Result<Arc<Context>, ManagerError> {
        use memplug_sdk::abi::{
            MEMPLUG_DEVICE_CPU, MEMPLUG_DEVICE_CUDA, MEMPLUG_DEVICE_CUDA_HOST, MEMPLUG_DEVICE_ROCM,
            MEMPLUG_DEVICE_ROCM_HOST,
        };
        let device = from.mechanism().device().0;
        let pinned = match device.kind {
            MEMPLUG_DEVICE_CUDA => Some(MEMPLUG_DEVICE_CUDA_HOST),
            MEMPLUG_DEVICE_ROCM => Some(MEMPLUG_DEVICE_ROCM_HOST),
            _ => None,
        };
        if let Some(kind) = pinned {
            let companion = MemplugDevice { kind, ordinal: device.ordinal };
            if let Ok(ctx) = self.select(companion, Requirements::ALLOCATOR_ONLY) {
                return Ok(ctx);
            }
        }
        self.select(MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 }, Requirements::ALLOCATOR_ONLY)
    }

    /// A mechanism's context by `plugin/mechanism` or mechanism name.
    pub fn context(&self, name: &str) -> Result<Arc<Context>, ManagerError> {
        Ok(self.registry.context_named(name)?)
    }

    /// Creates a pool of `capacity` bytes for one physical memory domain.
    pub fn create_pool(&self, name: &str, capacity: u64) -> Result<Arc<Pool>, ManagerError> {
        let id = self.governor.create_pool(name, capacity)?;
        Ok(self.governor.pool(id).expect("just created"))
    }

    /// Creates a pool of `capacity` bytes under `parent` (a pool of this
    /// manager): every charge made in it must fit in it and in every
    /// ancestor, and is charged at each (see
    /// [`Governor::create_child_pool`]). A parent of another manager is
    /// [`GovernorError::UnknownPool`]. Thread-safe.
    pub fn create_child_pool(
        &self,
        name: &str,
        parent: &Pool,
        capacity: u64,
    ) -> Result<Arc<Pool>, ManagerError> {
        let id = self.governor.create_child_pool(name, parent, capacity)?;
        Ok(self.governor.pool(id).expect("just created"))
    }

    /// Issues a binding: the only way to allocate. A context that is not
    /// active routes the binding to its newest active successor (see
    /// [`replace`](Self::replace)); without one the binding is refused.
    pub fn bind(
        &self,
        context: &Arc<Context>,
        pool: &Arc<Pool>,
        spec: BindingSpec,
    ) -> Result<MemoryBinding, ManagerError> {
        let context = &context.active_or_successor().ok_or_else(|| ManagerError::ContextEnded {
            context: context.label().into(),
            state: context.state(),
        })?;
        if let Some(h) = spec.holder {
            if pool.holder_stats(h).is_none() {
                return Err(ManagerError::HolderNotInPool { holder: h, pool: pool.name().into() });
            }
        }
        Ok(MemoryBinding::new(
            context.clone(),
            pool.clone(),
            spec.holder,
            spec.class,
            self.queue.clone(),
            spec.wait,
            spec.placement,
        ))
    }

    /// Issues a [`CachingBinding`]: a binding whose freed blocks are kept,
    /// charged, for reuse by later requests of the same size class (see
    /// [`crate::cache`]). The cache registers its own holder in `pool`
    /// (named and prioritised by `config`), so `spec.holder` must be
    /// `None`: its bytes are the cache's, and it answers that holder's
    /// pressure tickets with idle blocks.
    pub fn bind_caching(
        &self,
        context: &Arc<Context>,
        pool: &Arc<Pool>,
        spec: BindingSpec,
        config: CacheConfig,
    ) -> Result<CachingBinding, ManagerError> {
        if let Some(holder) = spec.holder {
            return Err(ManagerError::CacheHolder { holder });
        }
        config.validate().map_err(ManagerError::Cache)?;
        // The cache's answer is installed once the cache exists; until then
        // (only this call knows the holder) a ticket finds nothing to give.
        let answer: Arc<OnceLock<Box<PressureCallback>>> = Arc::default();
        let installed = answer.clone();
        let registration = pool.register_holder(&config.holder_name, config.priority, move |t| {
            installed.get().map_or(0, |f| f(t))
        });
        let binding = self.bind(context, pool, spec.holder(registration.id()))?;
        Ok(CachingBinding::new(binding, config, registration, &answer))
    }

    /// Starts the background reaper (idempotent): every `interval` it
    /// retires what the queue can and drives the contexts' lives (as
    /// [`poll`](Self::poll) does).
    pub fn start_reaper(&self, interval: Duration) {
        let mut r = lock(&self.reaper);
        if r.is_none() {
            let (registry, unload) = (Arc::downgrade(&self.registry), self.unload_when_settled.clone());
            let queue = Arc::downgrade(&self.queue);
            *r = Some(self.queue.spawn_reaper_with(interval, move || {
                if let (Some(registry), Some(queue)) = (registry.upgrade(), queue.upgrade()) {
                    drive_lives(&registry, &queue, &unload);
                }
            }));
        }
    }

    /// Retires what the queue can now (explicit polling), then drives the
    /// contexts' lives: delivers pending lifecycle events, terminates lost
    /// contexts with nothing in flight and retiring ones whose last object
    /// is gone (settling each exactly once), and unloads plugins that were
    /// replaced once all their contexts have terminated.
    pub fn poll(&self) -> crate::deferred::PollReport {
        let report = self.queue.poll();
        drive_lives(&self.registry, &self.queue, &self.unload_when_settled);
        report
    }

    /// Retires `context`: no new bindings or objects; existing objects keep
    /// working; it terminates (on a later `poll`) once the last is gone.
    pub fn retire(&self, context: &Arc<Context>, reason: &str) -> Result<(), ManagerError> {
        Ok(context.retire(reason)?)
    }

    /// Replaces `old` by `new` (same device): `old` retires (or, lost,
    /// stays lost), new bindings on `old` go to `new`, and neither is ever
    /// asked to free the other's memory. With `unload_old_plugin`, the
    /// plugin of `old` goes as a whole: its other contexts still active
    /// retire too (without a successor: replace them first to keep them
    /// served), and the plugin is unloaded once every context of it has
    /// terminated (a later `poll`, or the reaper).
    pub fn replace(
        &self,
        old: &Arc<Context>,
        new: &Arc<Context>,
        reason: &str,
        unload_old_plugin: bool,
    ) -> Result<(), ManagerError> {
        old.replace_with(new, reason)?;
        if unload_old_plugin {
            if let Some(name) = self.registry.plugin_of(old) {
                let why = format!("its plugin {name} is unloaded: {reason}");
                for other in self.registry.sweep().iter() {
                    let same_plugin = self.registry.plugin_of(other).as_deref() == Some(&*name);
                    if same_plugin && !Arc::ptr_eq(other, old) && other.state() == LifeState::Active {
                        // Only an active context can retire; one that went
                        // meanwhile needs nothing.
                        let _ = other.retire(&why);
                    }
                }
                lock(&self.unload_when_settled).push(name);
            }
        }
        Ok(())
    }

    /// Terminates a lost or retiring context (see [`Context::terminate`]),
    /// retiring queued frees while it waits so that a retiring context's
    /// last objects can go.
    pub fn terminate(&self, context: &Arc<Context>, timeout: Duration) -> Result<Settlement, ManagerError> {
        let settlement = context.terminate_polling(timeout, || {
            self.queue.poll();
        })?;
        // What is still queued for it is settled now, once (see
        // `drive_lives`).
        self.queue.settle_lost();
        Ok(settlement)
    }

    /// Unloads a plugin, or refuses and says what is live. Retires what it
    /// can first, so frees whose fences completed do not hold it.
    pub fn unload_plugin(&self, name: &str) -> Result<(), ManagerError> {
        self.queue.poll();
        Ok(self.registry.unload(name)?)
    }

    /// Teardown: stops the reaper and drains the queue within `timeout`;
    /// the report lists what could not be retired.
    pub fn drain(&self, timeout: Duration) -> DrainReport {
        lock(&self.reaper).take();
        self.queue.drain(timeout)
    }
}

/// One turn of the contexts' lives (see [`ProcessMemoryManager::poll`]).
/// Non-blocking: a context with calls in flight waits for the next turn.
fn drive_lives(registry: &Registry, queue: &DeferredFreeQueue, unload: &Mutex<Vec<String>>) {
    for c in registry.sweep().iter() {
        c.dispatch();
        if c.ready_to_terminate() {
            let terminated = c.terminate_polling(Duration::ZERO, || {
                queue.poll();
            });
            if terminated.is_ok() {
                // Termination settles whatever is still queued for the
                // context, exactly once: its entries leave the queue now
                // instead of waiting for fences a lost device may never
                // answer (and pinning the plugin while they wait).
                queue.settle_lost();
            }
        }
    }
    let names: Vec<String> = lock(unload).clone();
    for name in names {
        if registry.all_terminated(&name) && registry.unload(&name).is_ok() {
            lock(unload).retain(|n| *n != name);
        }
    }
}

impl Drop for ProcessMemoryManager {
    fn drop(&mut self) {
        // Best effort: whatever is left stays allocated (never freed on a
        // guess) and keeps its plugin mapped.
        let _ = self.drain(Duration::from_secs(1));
    }
}
