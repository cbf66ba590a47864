//! Fences: "is the device done with it?". A fence comes from a plugin's sync
//! capability ([`PluginFence`]) or from the runtime (anything implementing
//! [`FenceSource`], e.g. [`FnFence`] over a query/wait pair).

use crate::error::CallError;
use crate::mechanism::Mechanism;
use crate::tokens::{Fence, Stream};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Something that completes when the work before it has run.
/// Implementations must be callable from any thread.
pub trait FenceSource: Send + Sync {
    /// `true` when complete; never blocks.
    fn query(&self) -> Result<bool, CallError>;
    /// Blocks up to `timeout`; `true` when complete.
    fn wait(&self, timeout: Duration) -> Result<bool, CallError>;
    /// For reports of what could not be retired.
    fn describe(&self) -> String;
    /// For fences known to complete in the order they were recorded on one
    /// stream: `(mechanism key, stream handle, sequence)`, the sequence
    /// increasing in recording order on that stream. The deferred-free
    /// queue then looks only at the oldest pending fence of each stream.
    /// The order only schedules queries — nothing retires without its own
    /// fences reporting completion — so a wrong order can delay a free,
    /// never advance one. `None` (the default): no order known.
    fn order_key(&self) -> Option<(u64, u64, u64)> {
        None
    }
}

/// A shareable fence: several frees may wait on the same one.
pub type SharedFence = Arc<dyn FenceSource>;

/// What a fence's query says for the frees waiting on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Completion {
    /// The work before it has run.
    Complete,
    /// Its device is lost: it never completes, and the work it guarded went
    /// with the device, so a free need not wait for it.
    Lost,
    /// Not yet.
    Pending,
    /// The query failed otherwise: counted as not complete (never free on
    /// a guess).
    Failed,
}

impl Completion {
    /// Queries `f`.
    #[inline]
    pub(crate) fn of(f: &SharedFence) -> Completion {
        match f.query() {
            Ok(true) => Completion::Complete,
            Ok(false) => Completion::Pending,
            Err(e) if e.status == memplug_sdk::Status::DeviceLost => Completion::Lost,
            Err(_) => Completion::Failed,
        }
    }

    /// Whether a free waiting on the fence may go ahead.
    #[inline]
    pub(crate) fn frees(self) -> bool {
        matches!(self, Completion::Complete | Completion::Lost)
    }
}

/// A fence recorded by a plugin on one of its streams; destroyed (through
/// the plugin) when the last holder drops it.
pub struct PluginFence {
    mechanism: Mechanism,
    fence: Option<Fence>,
    /// The stream it was recorded on.
    stream: u64,
    /// Recording order, process-wide (see [`FenceSource::order_key`]).
    sequence: u64,
}

/// Sequence numbers of recorded plugin fences. Taken after the plugin's
/// record returns: two threads recording on one stream at once may get
/// numbers in the other order, which can only delay a free (the queue
/// queries every fence before retiring behind it).
static NEXT_SEQUENCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl PluginFence {
    /// Records a fence on `stream` of `mechanism`'s sync capability.
    pub fn record(mechanism: &Mechanism, stream: &Stream) -> Result<SharedFence, CallError> {
        Ok(Self::record_typed(mechanism, stream)?)
    }

    /// [`record`](Self::record), keeping the type: for a caller that also
    /// needs the plugin's fence token ([`token`](Self::token)), to order
    /// another stream behind it (`SyncApi::stream_wait_fence`).
    pub fn record_typed(mechanism: &Mechanism, stream: &Stream) -> Result<Arc<PluginFence>, CallError> {
        let sync = mechanism.sync().ok_or_else(|| no_sync(mechanism))?;
        let fence = sync.fence_record(stream)?;
        let sequence = NEXT_SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Arc::new(PluginFence {
            mechanism: mechanism.clone(),
            fence: Some(fence),
            stream: stream.handle(),
            sequence,
        }))
    }

    /// Takes ownership of a fence a queued operation returned on `stream`
    /// (`commit_on`, `decommit_on`, `map_on`, `unmap_on`): destroyed
    /// through the plugin when the last holder drops it, like a recorded
    /// one. A queued operation is work on its stream, so the fence is
    /// ordered with the fences recorded there. The mechanism has the sync
    /// capability (queued binding requires it; the caller checked).
    pub(crate) fn from_queued(mechanism: &Mechanism, fence: Fence, stream: &Stream) -> Arc<PluginFence> {
        debug_assert!(mechanism.sync().is_some(), "queued binding requires the sync capability");
        let sequence = NEXT_SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Arc::new(PluginFence {
            mechanism: mechanism.clone(),
            fence: Some(fence),
            stream: stream.handle(),
            sequence,
        })
    }

    /// The plugin's fence token (valid while this lives).
    pub fn token(&self) -> &Fence {
        self.fence()
    }

    fn fence(&self) -> &Fence {
        self.fence.as_ref().expect("present until drop")
    }
}

#[cold]
fn no_sync(m: &Mechanism) -> CallError {
    m.refusal("sync", memplug_sdk::Status::Unsupported, "the mechanism has no sync capability".into())
}

impl FenceSource for PluginFence {
    fn query(&self) -> Result<bool, CallError> {
        self.mechanism.sync().expect("checked at record").fence_query(self.fence())
    }
    fn wait(&self, timeout: Duration) -> Result<bool, CallError> {
        self.mechanism.sync().expect("checked at record").fence_wait(self.fence(), timeout)
    }
    fn describe(&self) -> String {
        format!("fence {} of {}", self.fence().handle(), self.mechanism.label())
    }
    /// Fences recorded on one stream complete in recording order.
    fn order_key(&self) -> Option<(u64, u64, u64)> {
        Some((self.mechanism.key(), self.stream, self.sequence))
    }
}

impl Drop for PluginFence {
    fn drop(&mut self) {
        if let Some(f) = self.fence.take() {
            // A fence the plugin will not destroy stays counted live on the
            // mechanism, which keeps the plugin from unloading: visible, not
            // silently dropped.
            let _ = self.mechanism.sync().expect("checked at record").fence_destroy(f);
        }
    }
}

impl fmt::Debug for PluginFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

type QueryFn = dyn Fn() -> bool + Send + Sync;
type WaitFn = dyn Fn(Duration) -> bool + Send + Sync;

/// A runtime-supplied fence made of a query function and a wait function
/// (the shape a C runtime passes through the C API).
pub struct FnFence {
    name: String,
    query: Box<QueryFn>,
    wait: Box<WaitFn>,
}

impl FnFence {
    /// Returns the shared handle directly: a fence is only ever used shared.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(
        name: impl Into<String>,
        query: impl Fn() -> bool + Send + Sync + 'static,
        wait: impl Fn(Duration) -> bool + Send + Sync + 'static,
    ) -> SharedFence {
        Arc::new(FnFence { name: name.into(), query: Box::new(query), wait: Box::new(wait) })
    }
}

impl FenceSource for FnFence {
    fn query(&self) -> Result<bool, CallError> {
        Ok((self.query)())
    }
    fn wait(&self, timeout: Duration) -> Result<bool, CallError> {
        Ok((self.wait)(timeout))
    }
    fn describe(&self) -> String {
        format!("runtime fence '{}'", self.name)
    }
}

/// A fence of a mechanism's work that the host cannot ask the plugin
/// about: a host function enqueued behind a copy (`done` reads its flag),
/// or no fence at all (`done` never says yes) when the plugin refused to
/// place one behind work it accepted.
///
/// It answers `DEVICE_LOST` once the mechanism's context no longer admits
/// calls (lost or terminated), unless `done` already said yes: the work it
/// stands for went with the device, and nothing else would ever end a wait
/// on it (ARCHITECTURE.md §4, Deferred free and fences: a fence of a lost
/// mechanism counts as complete for freeing). Until then it is a fence
/// like any other: never complete on a guess.
pub(crate) struct MechanismFence {
    mechanism: Mechanism,
    name: String,
    done: Box<QueryFn>,
}

impl MechanismFence {
    /// Shared, as every fence is used.
    pub(crate) fn shared(
        mechanism: &Mechanism,
        name: String,
        done: impl Fn() -> bool + Send + Sync + 'static,
    ) -> SharedFence {
        Arc::new(MechanismFence { mechanism: mechanism.clone(), name, done: Box::new(done) })
    }
}

impl FenceSource for MechanismFence {
    fn query(&self) -> Result<bool, CallError> {
        if (self.done)() {
            return Ok(true);
        }
        let state = self.mechanism.life_state();
        if state.admits_calls() {
            return Ok(false);
        }
        let why = self.mechanism.life_reason().unwrap_or_else(|| "no reason was given".into());
        Err(self.mechanism.refusal(
            "fence",
            memplug_sdk::Status::DeviceLost,
            format!("{}: the context is {state} ({why}); the work it waited for went with it", self.name),
        ))
    }
    fn wait(&self, timeout: Duration) -> Result<bool, CallError> {
        poll_until(timeout, || self.query())
    }
    fn describe(&self) -> String {
        format!("{} on {}", self.name, self.mechanism.label())
    }
}

/// Polls `done` until it reports completion or `timeout` passes, sleeping
/// at most a millisecond between polls: the wait of a fence that has only a
/// query (a flag, a list that empties). A failed poll ends the wait.
pub(crate) fn poll_until(
    timeout: Duration,
    mut done: impl FnMut() -> Result<bool, CallError>,
) -> Result<bool, CallError> {
    let deadline = Instant::now() + timeout;
    loop {
        if done()? {
            return Ok(true);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(1)));
    }
}
