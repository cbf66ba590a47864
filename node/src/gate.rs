//! The link's in-process rule for changing a joined pool's capacity, kept
//! apart from the sockets so that loom can explore it
//! (`tests/link_loom.rs`, built with `--cfg loom`).
//!
//! Four things change a joined pool's capacity from inside the process: a
//! lease the authority granted (a raise), a ticket answered (a lowering),
//! idle budget given back (a lowering), and a join, which declares the
//! capacity to a new authority. The rule that keeps the next authority's
//! books equal to the pool's capacity — every byte counted once, none it
//! did not see:
//!
//! * a join, under every device's lock, moves the **generation** on and
//!   reads the capacities it declares (the locks are held for that only,
//!   never across the socket I/O);
//! * a grant is applied, under its device's lock, only if no join happened
//!   since its lease was sent: one that arrives later was granted by an
//!   authority that is gone, and the new one never counted it;
//! * a ticket lowers the capacity, under the lock, only if it came in the
//!   current generation; a ticket of a gone authority changes nothing (what
//!   its holders freed is idle, and goes back to the new authority as idle
//!   budget does);
//! * idle budget is given back under the lock, but only if the lock is
//!   free and no ticket is being answered on the device (what a ticket's
//!   holders free is its answer): the caller's tick also rejoins, and
//!   must not wait.
//!
//! Holders are asked before any of this, outside the lock (they may take
//! long).

use crate::sync::{lock, AtomicU64, Mutex, SeqCst};

/// A pool's capacity as the gate sees it (the link's pools; a model in the
/// loom test).
pub trait Capacity {
    fn capacity(&self) -> u64;
    fn used(&self) -> u64;
    /// Sets the capacity; false when refused (below what is live).
    fn set(&self, capacity: u64) -> bool;
}

impl Capacity for memplug_host::governor::Pool {
    fn capacity(&self) -> u64 {
        memplug_host::governor::Pool::capacity(self)
    }
    fn used(&self) -> u64 {
        memplug_host::governor::Pool::used(self)
    }
    fn set(&self, capacity: u64) -> bool {
        self.set_capacity(capacity).is_ok()
    }
}

/// One link's gates: a lock per device, the tickets being answered per
/// device, and the join generation.
pub struct Gates {
    devs: Vec<Mutex<()>>,
    answering: Vec<AtomicU64>,
    generation: AtomicU64,
}

impl Gates {
    pub fn new(devices: usize) -> Gates {
        Gates {
            devs: (0..devices).map(|_| Mutex::new(())).collect(),
            answering: (0..devices).map(|_| AtomicU64::new(0)).collect(),
            generation: AtomicU64::new(0),
        }
    }

    /// The current generation (read when a lease is sent or a ticket comes).
    pub fn generation(&self) -> u64 {
        self.generation.load(SeqCst)
    }

    /// A join: moves the generation on and returns the capacities to
    /// declare, read under every device's lock.
    pub fn join(&self, caps: &[&dyn Capacity]) -> Vec<u64> {
        let _all: Vec<_> = self.devs.iter().map(lock).collect();
        self.generation.fetch_add(1, SeqCst);
        caps.iter().map(|c| c.capacity()).collect()
    }

    /// Applies a grant of `bytes` for device `dev` whose lease was sent in
    /// `generation`: true when the capacity was raised by it; false when a
    /// join came since (the grant is dropped) or the raise was refused.
    pub fn grant(&self, dev: usize, cap: &dyn Capacity, generation: u64, bytes: u64) -> Result<(), Stale> {
        let _g = lock(&self.devs[dev]);
        if self.generation.load(SeqCst) != generation {
            return Err(Stale::Generation);
        }
        if cap.set(cap.capacity().saturating_add(bytes)) {
            Ok(())
        } else {
            Err(Stale::Refused)
        }
    }

    /// Answers a ticket of `generation` for device `dev`: `relieve` asks
    /// the holders (outside the lock: they may take long), then the
    /// capacity is lowered by up to `bytes`, no lower than what is live;
    /// returns the bytes released, or None for a ticket of a gone
    /// authority (nothing changes, nothing is answered). While it runs, the
    /// idle return leaves the device alone, so what the holders free goes
    /// back as the ticket's answer, not as idle budget.
    pub fn ticket(
        &self,
        dev: usize,
        cap: &dyn Capacity,
        generation: u64,
        bytes: u64,
        relieve: impl FnOnce(),
    ) -> Option<u64> {
        self.answering[dev].fetch_add(1, SeqCst);
        relieve();
        let released = {
            let _g = lock(&self.devs[dev]);
            if self.generation.load(SeqCst) != generation {
                None
            } else {
                let now = cap.capacity();
                let new = now.saturating_sub(bytes).max(cap.used());
                Some(if new < now && cap.set(new) { now - new } else { 0 })
            }
        };
        self.answering[dev].fetch_sub(1, SeqCst);
        released
    }

    /// Gives back idle budget of device `dev` above `keep_chunks` chunks
    /// (all of it for 0), in whole chunks: the bytes to return, unless the
    /// device's capacity is being changed by another thread or a ticket is
    /// being answered on it (None: try at the next tick).
    pub fn idle(&self, dev: usize, cap: &dyn Capacity, keep_chunks: u64, chunk: u64) -> Option<u64> {
        let _g = match self.devs[dev].try_lock() {
            Ok(g) => g,
            Err(crate::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(crate::sync::TryLockError::WouldBlock) => return None,
        };
        let now = cap.capacity();
        let used = cap.used();
        // Read after the use: a ticket whose holders freed what was read
        // had already said so (it counts before it asks them).
        if self.answering[dev].load(SeqCst) > 0 {
            return None;
        }
        let idle = now.saturating_sub(used);
        let keep = keep_chunks * chunk;
        if idle <= keep {
            return Some(0);
        }
        let r = if keep_chunks == 0 { idle } else { (idle - keep) / chunk * chunk };
        Some(if r > 0 && cap.set(now - r) { r } else { 0 })
    }
}

/// Why a grant was not applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stale {
    /// A join came since its lease was sent.
    Generation,
    /// The pool refused the raise.
    Refused,
}
