//! The process memory manager: registers plugins and devices, selects
//! mechanisms, pins contexts, creates pools, and issues bindings — the only
//! way to allocate (DESIGN.md §1).

use crate::binding::MemoryBinding;
use crate::deferred::{DeferredFreeQueue, DrainReport, Reaper};
use crate::governor::{AllocationClass, Governor, GovernorError, HolderId, Pool};
use crate::mechanism::Mechanism;
use crate::plugin::{LoadOptions, Plugin};
use crate::registry::{Context, Registry, RegistryError, Requirements};
use crate::sync::{lock, Mutex};
use crate::LoadError;
use memplug_sdk::abi::MemplugDevice;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Why the manager refused.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Governor(#[from] GovernorError),
    #[error("holder {holder} is not registered with pool '{pool}'")]
    HolderNotInPool { holder: HolderId, pool: String },
}

/// What a binding is for.
#[derive(Clone, Debug)]
pub struct BindingSpec {
    pub class: AllocationClass,
    pub holder: Option<HolderId>,
    /// How long an allocation may wait for pressure to free room; `None`
    /// fails at once after the pressure tickets.
    pub wait: Option<Duration>,
}

impl BindingSpec {
    pub fn new(class: AllocationClass) -> Self {
        BindingSpec { class, holder: None, wait: None }
    }
    pub fn holder(mut self, h: HolderId) -> Self {
        self.holder = Some(h);
        self
    }
    pub fn wait(mut self, d: Duration) -> Self {
        self.wait = Some(d);
        self
    }
}

/// One per process (or per embedding). Thread-safe.
pub struct ProcessMemoryManager {
    registry: Registry,
    governor: Arc<Governor>,
    queue: Arc<DeferredFreeQueue>,
    reaper: Mutex<Option<Reaper>>,
}

impl Default for ProcessMemoryManager {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessMemoryManager {
    pub fn new() -> Self {
        ProcessMemoryManager {
            registry: Registry::default(),
            governor: Governor::new(),
            queue: DeferredFreeQueue::new(),
            reaper: Mutex::new(None),
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }
    pub fn governor(&self) -> &Arc<Governor> {
        &self.governor
    }
    pub fn queue(&self) -> &Arc<DeferredFreeQueue> {
        &self.queue
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

    /// Issues a binding: the only way to allocate.
    pub fn bind(
        &self,
        context: &Arc<Context>,
        pool: &Arc<Pool>,
        spec: BindingSpec,
    ) -> Result<MemoryBinding, ManagerError> {
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
        ))
    }

    /// Starts the background reaper of the deferred-free queue (idempotent).
    pub fn start_reaper(&self, interval: Duration) {
        let mut r = lock(&self.reaper);
        if r.is_none() {
            *r = Some(self.queue.spawn_reaper(interval));
        }
    }

    /// Retires what the queue can now (explicit polling).
    pub fn poll(&self) -> crate::deferred::PollReport {
        self.queue.poll()
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

impl Drop for ProcessMemoryManager {
    fn drop(&mut self) {
        // Best effort: whatever is left stays allocated (never freed on a
        // guess) and keeps its plugin mapped.
        let _ = self.drain(Duration::from_secs(1));
    }
}
