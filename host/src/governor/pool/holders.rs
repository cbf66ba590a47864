//! Holders of a pool: registering one (with its pressure callback) and
//! unregistering it.

use super::*;

impl Pool {
    /// Registers a holder: an owner of bytes in this pool that answers
    /// pressure tickets with `callback` (see
    /// [`PressureCallback`](crate::governor::PressureCallback)). Dropping the
    /// returned registration unregisters it.
    ///
    /// A holder decides what to give up; the governor never frees anyone's
    /// memory. Here a weights cache evicts its oldest entries when another
    /// binding's allocation does not fit:
    ///
    /// ```
    /// # use memplug_host::{governor::AllocationClass, *};
    /// # use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
    /// # let mgr = ProcessMemoryManager::new();
    /// # // SAFETY: the reference CPU plugin's entry, built against this ABI.
    /// # let cpu = unsafe { Plugin::from_entry(memplug_plugin_cpu::cpu_plugin_entry, "cpu", &LoadOptions::default()) }?;
    /// # mgr.register_plugin(cpu)?;
    /// # let cpu0 = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };
    /// # let ctx = mgr.select(cpu0, Requirements::ALLOCATOR_ONLY)?;
    /// use memplug_host::governor::{PressureTicket, Priority};
    /// use std::sync::{Arc, Mutex};
    ///
    /// let pool = mgr.create_pool("cpu0", 8 << 20)?;
    /// let cache: Arc<Mutex<Vec<OwnedAllocation>>> = Arc::default();
    /// let held = cache.clone();
    /// let weights = pool.register_holder("weights", Priority(10), move |t: &PressureTicket| {
    ///     let mut evicted = Vec::new();
    ///     let mut released = 0;
    ///     let mut held = held.lock().unwrap();
    ///     while released < t.bytes_wanted && !held.is_empty() {
    ///         let oldest = held.remove(0);
    ///         released += oldest.charged();
    ///         evicted.push(oldest);
    ///     }
    ///     drop(held);
    ///     drop(evicted); // freed and refunded before the answer, outside the lock
    ///     released // the bytes it gave back (0 is a legal answer)
    /// });
    ///
    /// let w = mgr.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Weights).holder(weights.id()))?;
    /// for _ in 0..8 {
    ///     cache.lock().unwrap().push(w.allocate(1 << 20, 4096)?);
    /// }
    /// assert_eq!(pool.free(), 0);
    ///
    /// // A request at a higher priority (no holder: the highest) makes room.
    /// let act = mgr.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Activations))?;
    /// let a = act.allocate(2 << 20, 4096)?;
    /// assert_eq!(cache.lock().unwrap().len(), 6); // two experts evicted
    /// assert_eq!(pool.holder_stats(weights.id()).unwrap().pressure.tickets, 1);
    /// # drop(a); cache.lock().unwrap().clear();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn register_holder<F>(
        self: &Arc<Self>,
        name: &str,
        priority: Priority,
        callback: F,
    ) -> HolderRegistration
    where
        F: Fn(&PressureTicket) -> u64 + Send + Sync + 'static,
    {
        let id = HolderId(next_uid());
        let meta = HolderMeta { id, name: name.into(), priority };
        let account = Arc::new(Account::new(id.get(), self.id, Some(meta)));
        let core = account.core.clone();
        lock(&self.accounts).insert(id.get(), account);
        // Ids grow with every registration in the process, so they order
        // holders of different pools too (the tie-break among equal
        // priorities when a short ancestor asks several pools' holders).
        let entry = Arc::new(HolderEntry::new(core, id.get(), Box::new(callback)));
        lock(&self.holders).push(entry.clone());
        HolderRegistration { pool: self.clone(), entry }
    }

    pub(crate) fn unregister_holder(&self, entry: &Arc<HolderEntry>) {
        entry.core.registered.store(false, Relaxed);
        lock(&self.holders).retain(|e| !Arc::ptr_eq(e, entry));
        entry.close();
    }
}
