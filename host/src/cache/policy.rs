//! When a cache gives idle blocks back without being asked: the idle
//! policy. Pressure tickets and [`trim`](super::CachingBinding::trim) free
//! idle blocks on demand; this policy bounds what a cache keeps when nobody
//! asks, so a workload of many sizes does not leave a pool full of blocks
//! of sizes it will not ask for again.
//!
//! Three rules, each off when unset:
//!
//! * **A cap on idle bytes** ([`IdlePolicy::max_idle_bytes`]): a free that
//!   takes the cache's idle bytes past the cap gives idle blocks back
//!   (ready ones first, largest classes first, then pending ones behind
//!   their fences) until it is met. Checked where idle bytes grow — a free
//!   — so no other path pays for it.
//! * **An age** ([`IdlePolicy::max_idle_age`]): blocks idle longer are
//!   given back at the next miss (at most four times per age) and by
//!   [`collect`](super::CachingBinding::collect).
//! * **A usage threshold** ([`IdlePolicy::gc_threshold`], the model of
//!   PyTorch's `garbage_collection_threshold`): a miss that would take the
//!   pool's use past this fraction of its capacity first gives back idle
//!   blocks until it would not, so the pool stays below the point where a
//!   request must wait for pressure.

use std::time::{Duration, Instant};

/// The idle policy of a cache (see the module's documentation). The default
/// caps idle bytes at a quarter of the pool's capacity when the cache is
/// made, and sets no age and no threshold.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IdlePolicy {
    /// The most bytes kept idle. `None`: a quarter of the pool's capacity
    /// when the cache is made; `Some(u64::MAX)`: no cap; `Some(0)`: keep
    /// nothing (every free gives its block back).
    pub max_idle_bytes: Option<u64>,
    /// Blocks idle longer than this are given back (at misses and by
    /// `collect`); `None`: no age limit.
    pub max_idle_age: Option<Duration>,
    /// A fraction of the pool's capacity in (0, 1]: a miss that would take
    /// the pool's use past it gives idle blocks back first; `None`: never.
    pub gc_threshold: Option<f64>,
}

impl IdlePolicy {
    /// Why this policy cannot be used, if it cannot.
    pub(super) fn validate(&self) -> Result<(), String> {
        if let Some(t) = self.gc_threshold {
            if !(t > 0.0 && t <= 1.0) {
                return Err(format!("gc_threshold {t} is not in (0, 1]"));
            }
        }
        if self.max_idle_age == Some(Duration::ZERO) {
            return Err("max_idle_age 0 would give every block back at once: use max_idle_bytes 0".into());
        }
        Ok(())
    }
}

/// The policy as a cache applies it: the cap in bytes, and the clock the
/// ages are read on.
pub(super) struct Applied {
    /// The cap on idle bytes (`u64::MAX`: none).
    pub max_idle_bytes: u64,
    /// One shard's idle bytes above which a free sums every shard's: the
    /// cap divided by the shards, so a free whose shard is below it cannot
    /// have taken the sum past the cap unless another shard is above it.
    pub shard_check: u64,
    pub max_idle_age: Option<Duration>,
    pub gc_threshold: Option<f64>,
    /// Ages are counted from here (milliseconds fit in a `u64` stamp).
    origin: Instant,
}

impl Applied {
    pub fn new(policy: &IdlePolicy, pool_capacity: u64, shards: usize) -> Self {
        let max_idle_bytes = policy.max_idle_bytes.unwrap_or(pool_capacity / 4);
        Applied {
            max_idle_bytes,
            shard_check: if max_idle_bytes == u64::MAX { u64::MAX } else { max_idle_bytes / shards as u64 },
            max_idle_age: policy.max_idle_age,
            gc_threshold: policy.gc_threshold,
            origin: Instant::now(),
        }
    }

    /// The stamp of a block made idle now: milliseconds since the cache
    /// was made, or 0 when no age is set (no clock read on a free then).
    #[inline]
    pub fn stamp(&self) -> u64 {
        match self.max_idle_age {
            None => 0,
            Some(_) => self.now(),
        }
    }

    pub fn now(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// The stamp before which a block is too old, now; `None` when no age
    /// is set.
    pub fn cutoff(&self) -> Option<u64> {
        self.max_idle_age.map(|age| self.now().saturating_sub(age.as_millis() as u64))
    }

    /// The bytes to give back before a miss of `bytes` in a pool using
    /// `used` of `capacity` so that it stays under the threshold (0 when
    /// none is set or it stays under).
    pub fn over_threshold(&self, used: u64, bytes: u64, capacity: u64) -> u64 {
        match self.gc_threshold {
            None => 0,
            Some(t) => {
                let line = (capacity as f64 * t) as u64;
                used.saturating_add(bytes).saturating_sub(line)
            }
        }
    }
}
