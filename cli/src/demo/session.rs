//! What the story's steps share: the [`State`] every step writes to, the
//! requirements it selects its context with, the [`Session`] the serving
//! steps leave to the device loss and the teardown. Apart from the story so
//! that the steps it calls (the loss scene) need not import it.

use super::measure::{HostCopies, Kernel, Measurement, Stranded};
use super::serving::{Request, Tally, Weights};
use super::timeline::{Checks, Recorder};
use memplug_host::governor::{HolderRegistration, Pool};
use memplug_host::{MemoryBinding, Requirements};
use std::sync::Arc;

/// What every step writes to: the timeline, the checks, the measurements.
pub(super) struct State<'a> {
    pub(super) rec: Arc<Recorder>,
    pub(super) kernel: &'a Kernel,
    pub(super) pool: Arc<Pool>,
    pub(super) checks: Checks,
    pub(super) measurements: Vec<Measurement>,
    pub(super) tally: Tally,
    /// What the lost context left behind (nothing until the loss).
    pub(super) stranded: Stranded,
    /// Host copies of offloaded objects (the offload scene).
    pub(super) host: HostCopies,
}

impl State<'_> {
    /// Governor vs kernel now ([`Kernel::measure`]), kept for the report.
    pub(super) fn measure(&mut self, label: &str, weights: &[(u64, u64)], kv: &[(u64, u64)]) {
        let m = self.kernel.measure(&self.pool, &self.rec, label, weights, kv, &self.stranded, &self.host);
        self.measurements.push(m);
    }
}

/// The requirements the story selects its context with.
pub(super) const NEEDS: Requirements =
    Requirements { virtual_backing: true, shared_mapping: true, sync: true };

/// What the serving steps leave to the device loss and the teardown: the
/// holders, the weights holder (its pinned shards still loaded), and the
/// bindings the holders charge through.
pub(super) struct Session {
    pub(super) weights: Arc<Weights>,
    pub(super) weights_reg: HolderRegistration,
    pub(super) kv_reg: HolderRegistration,
    pub(super) weights_b: MemoryBinding,
    pub(super) kv_b: MemoryBinding,
}

/// The live KV address ranges of `reqs`: the prefix once (through the
/// first region), each region's private part, and `extra`.
pub(super) fn kv_ranges(reqs: &[Request], extra: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = reqs.first().map(|r| r.prefix_range()).into_iter().collect();
    v.extend(reqs.iter().map(Request::private_range));
    v.extend_from_slice(extra);
    v
}
