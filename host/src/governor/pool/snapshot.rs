//! A pool's statistics: its snapshot, its holders' figures, and the
//! sampled per-class peaks.

use super::*;

impl Pool {
    /// The pool's figures now (see [`stats`](crate::governor::stats) for exactness).
    /// Takes the pool's account locks briefly; never blocks a fast path.
    pub fn snapshot(&self) -> PoolSnapshot {
        let accounts: Vec<Arc<Account>> = lock(&self.accounts).values().cloned().collect();
        let mut raw = self.anon.raw();
        for a in &accounts {
            for (r, o) in raw.iter_mut().zip(a.raw().iter()) {
                r.add(o);
            }
        }
        let mut classes: [ClassStats; AllocationClass::COUNT] = raw.map(RawClass::to_stats);
        if let Some(table) = leaks().get(&self.id.get()) {
            for (&(_, class), &(count, bytes)) in table {
                classes[class].leaked_leases += count;
                classes[class].leaked_bytes += bytes;
            }
        }
        self.pressure.fill(&mut classes);
        self.class_peaks.sample(&mut classes, self.level.peak());
        let totals = crate::governor::stats::total(&classes);
        let (used, capacity) = self.level.read();
        let children = self.children();
        let children_used = children.iter().map(|c| c.used()).fold(0u64, u64::saturating_add);
        PoolSnapshot {
            pool: self.id,
            name: self.name.clone(),
            parent: self.level.parent().map(|p| p.id),
            parent_name: self.level.parent().map(|p| p.name.clone()),
            depth: self.depth(),
            capacity,
            used,
            free: capacity - used,
            peak: self.level.peak(),
            reserved: totals.reserved,
            leased: totals.leased,
            quarantined: totals.quarantined,
            children: children.len(),
            children_used,
            classes,
            pressure: self.pressure.get(),
            waits: self.waits.load(Relaxed),
            wait_timeouts: self.wait_timeouts.load(Relaxed),
            holders: lock(&self.holders).len(),
        }
    }

    /// One holder's figures, registered or not; `None` if the holder never
    /// belonged to this pool.
    pub fn holder_stats(&self, holder: HolderId) -> Option<HolderStats> {
        let account = lock(&self.accounts).get(&holder.get()).cloned()?;
        Some(self.stats_of(&account))
    }

    /// Every holder this pool ever had, in registration order.
    pub fn holders(&self) -> Vec<HolderStats> {
        let accounts: Vec<Arc<Account>> = lock(&self.accounts).values().cloned().collect();
        accounts.iter().map(|a| self.stats_of(a)).collect()
    }

    pub(crate) fn account_stats(&self, core: &AccountCore) -> Option<HolderStats> {
        let account = lock(&self.accounts).get(&core.uid).cloned()?;
        Some(self.stats_of(&account))
    }

    /// Samples the per-class peaks of the pool and of each account (see
    /// [`stats`](crate::governor::stats)), without building a snapshot.
    pub(super) fn sample_peaks(&self) {
        let accounts: Vec<Arc<Account>> = lock(&self.accounts).values().cloned().collect();
        let cap = self.level.peak();
        let mut pool = self.anon.raw();
        for a in &accounts {
            let raw = a.raw();
            for (r, o) in pool.iter_mut().zip(raw.iter()) {
                r.add(o);
            }
            a.core.peaks.sample(&mut raw.map(RawClass::to_stats), cap);
        }
        self.class_peaks.sample(&mut pool.map(RawClass::to_stats), cap);
    }

    pub(super) fn stats_of(&self, account: &Account) -> HolderStats {
        let core = &account.core;
        let mut classes: [ClassStats; AllocationClass::COUNT] = account.raw().map(RawClass::to_stats);
        if let Some(table) = leaks().get(&self.id.get()) {
            for (&(acct, class), &(count, bytes)) in table {
                if acct == core.uid {
                    classes[class].leaked_leases += count;
                    classes[class].leaked_bytes += bytes;
                }
            }
        }
        core.pressure.fill(&mut classes);
        core.peaks.sample(&mut classes, self.level.peak());
        let meta = core.holder.as_ref().expect("holder account without metadata");
        HolderStats {
            holder: meta.id,
            pool: self.id,
            name: meta.name.clone(),
            priority: meta.priority,
            registered: core.registered.load(Relaxed),
            classes,
            pressure: core.pressure.get(),
        }
    }
}
