//! Ending leases: release, quarantine, their partial forms, splitting a
//! lease, and discharging what a lost context held.

use super::*;

impl Pool {
    /// Ends a lease after its memory was physically freed: refunds its
    /// bytes (waking waiters). No lock on the fast path.
    ///
    /// A lease of another pool is handed back in the error, untouched.
    #[inline]
    pub fn release(&self, lease: Lease) -> Result<(), Rejected<Lease>> {
        if lease.pool != self.id {
            let error = GovernorError::WrongPool { pool: self.id, lease_pool: lease.pool };
            return Err(Rejected { value: lease, error });
        }
        let (account, class, bytes) = lease.disarm();
        // `move`, and `prev` returned rather than assigned: see `try_grant`.
        let taken = self.with_shard(account, move |s| {
            let c = s.cells_at(class);
            s.sub(&c.leased, bytes);
            s.sub(&c.leases, 1);
            let prev = self.level.take(bytes);
            s.hint.store(prev.wrapping_sub(bytes), Relaxed);
            prev
        });
        debug_assert!(taken.is_ok(), "a lease of {} names an account the pool does not have", self.id);
        let prev = taken.unwrap_or_else(|()| self.level.take(bytes));
        self.level.after_refund(prev, bytes);
        if let Some(parent) = self.level.parent() {
            parent.refund_chain(bytes);
        }
        Ok(())
    }

    /// Refunds `bytes` of a lease whose memory shrank (e.g. a decommitted
    /// part of a virtual range); the lease keeps the rest. More than the
    /// lease holds is [`GovernorError::OverRelease`], and nothing changes.
    pub fn release_part(&self, lease: &mut Lease, bytes: u64) -> Result<(), GovernorError> {
        self.check_part(lease, bytes)?;
        self.on_shard(lease.account, |s| s.sub(&s.cells_at(lease.class).leased, bytes));
        lease.bytes -= bytes;
        self.refund(bytes);
        Ok(())
    }

    /// Ends a lease whose release the plugin could not complete
    /// (invariant 7): its bytes stay charged, now reported as quarantined,
    /// and are never refunded.
    pub fn quarantine(&self, lease: Lease) -> Result<(), Rejected<Lease>> {
        if lease.pool != self.id {
            let error = GovernorError::WrongPool { pool: self.id, lease_pool: lease.pool };
            return Err(Rejected { value: lease, error });
        }
        let (account, class, bytes) = lease.disarm();
        self.on_shard(account, |s| {
            let c = s.cells_at(class);
            s.sub(&c.leased, bytes);
            s.sub(&c.leases, 1);
            s.add(&c.quarantined, bytes);
            s.add(&c.quarantines, 1);
        });
        self.observe_quarantine(self.holder_of(account), AllocationClass::ALL[class], bytes);
        Ok(())
    }

    /// Quarantines `bytes` of a lease (a part whose decommit failed); the
    /// lease keeps the rest. More than the lease holds is
    /// [`GovernorError::OverRelease`], and nothing changes.
    pub fn quarantine_part(&self, lease: &mut Lease, bytes: u64) -> Result<(), GovernorError> {
        self.check_part(lease, bytes)?;
        self.on_shard(lease.account, |s| {
            let c = s.cells_at(lease.class);
            s.sub(&c.leased, bytes);
            s.add(&c.quarantined, bytes);
            s.add(&c.quarantines, 1);
        });
        lease.bytes -= bytes;
        self.observe_quarantine(lease.holder(), lease.class(), bytes);
        Ok(())
    }

    /// Moves `bytes` of a lease into a new lease (same pool, class and
    /// holder); nothing is charged or refunded. For a part that will be
    /// freed later than the rest — e.g. a decommitted tail waiting for its
    /// fences — so each lease covers exactly the bytes it will release.
    /// More than the lease holds is [`GovernorError::OverRelease`], and
    /// nothing changes.
    pub fn split_lease(&self, lease: &mut Lease, bytes: u64) -> Result<Lease, GovernorError> {
        self.check_part(lease, bytes)?;
        self.on_shard(lease.account, |s| s.add(&s.cells_at(lease.class).leases, 1));
        lease.bytes -= bytes;
        Ok(Lease { pool: self.id, account: lease.account, class: lease.class, bytes })
    }

    pub(super) fn check_part(&self, lease: &Lease, bytes: u64) -> Result<(), GovernorError> {
        if lease.pool != self.id {
            return Err(GovernorError::WrongPool { pool: self.id, lease_pool: lease.pool });
        }
        if bytes > lease.bytes {
            return Err(GovernorError::OverRelease { requested: bytes, held: lease.bytes });
        }
        Ok(())
    }

    /// Settles, in one step, every charge a binding of a lost context
    /// still holds in the account of `holder` and `class`: `leased` bytes
    /// in `leases` leases and `quarantined` bytes in `quarantines`
    /// quarantines, as its ledger counted them. The bytes come back to the
    /// pool and every ancestor (waking waiters); the leases' tokens are
    /// ended by their owners with `Lease::settled_elsewhere`, or never.
    /// Called once per binding, by the termination that settles it.
    pub(crate) fn discharge(&self, holder: Option<HolderId>, class: AllocationClass, d: Discharge) {
        self.on_shard(self.account_uid(holder), |s| {
            let c = s.cells(class);
            s.sub(&c.leased, d.leased);
            s.sub(&c.leases, d.leases);
            s.sub(&c.quarantined, d.quarantined);
        });
        self.discharged.fetch_add(d.leased + d.quarantined, Relaxed);
        self.refund(d.leased + d.quarantined);
    }

    /// Bytes settled so far by the terminations of lost or retired
    /// contexts whose bindings charged this pool (live and quarantined
    /// charges together; see [`Settlement`](crate::Settlement)).
    pub fn discharged(&self) -> u64 {
        self.discharged.load(Relaxed)
    }
}
