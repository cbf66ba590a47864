//! What the device-loss scene ([`super::loss`]) reports: its part of the
//! report and of `--json`. Apart from the scene so that the report, which
//! holds it, does not import the scene that fills it.

use serde::Serialize;

/// One binding, as a notice names it or a settlement settled it.
#[derive(Serialize, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct BindingLine {
    pub(super) pool: String,
    pub(super) holder: String,
    pub(super) class: &'static str,
    pub(super) objects: u64,
    pub(super) bytes: u64,
    pub(super) quarantined_bytes: u64,
}

/// What one holder was told.
#[derive(Serialize)]
pub(super) struct Delivery {
    pub(super) holder: &'static str,
    /// `from → to`, in order.
    pub(super) transitions: Vec<String>,
    pub(super) lost: u64,
    pub(super) terminated: u64,
}

/// One request of the batch, before and after the loss.
#[derive(Serialize)]
pub(super) struct Resumed {
    pub(super) request: String,
    /// Tokens decoded on the lost context (their KV went with it).
    pub(super) tokens_at_loss: u64,
    /// Tokens at the end, on the replacement.
    pub(super) tokens: u64,
    /// KV and prefix read back intact on the replacement.
    pub(super) intact: bool,
}

/// The scene in the report (`loss` in `--json`).
#[derive(Serialize, Default)]
pub(super) struct LossReport {
    /// Why the scene did not run, when it did not.
    pub(super) skipped: Option<String>,
    /// The lost context (`plugin/mechanism`).
    pub(super) context: String,
    /// `plugin`: reported by the plugin (test switch); `runtime`: declared
    /// by the runtime.
    pub(super) path: &'static str,
    /// How the demo lost it, in words.
    pub(super) how: String,
    /// The context's reason, as the host keeps it.
    pub(super) reason: Option<String>,
    /// The `Lost` event's notices: one per binding that held something.
    pub(super) notices: Vec<BindingLine>,
    /// What the termination settled, per binding.
    pub(super) settled: Vec<BindingLine>,
    pub(super) settled_bytes: u64,
    pub(super) objects_forgotten: u64,
    /// The pool's `used` just before and after the termination.
    pub(super) used_before: u64,
    pub(super) used_after: u64,
    /// What `Pool::discharged` grew by at the termination, and what it is
    /// at the end of the demo.
    pub(super) discharged_by_settlement: u64,
    pub(super) discharged_at_end: u64,
    /// What each holder was told, counted at the end of the demo.
    pub(super) deliveries: Vec<Delivery>,
    /// What a second termination answered.
    pub(super) terminate_again: String,
    /// Whether dropping the lost handles after the termination changed
    /// nothing (pool used, discharged, leased, queue, pins, the plugin's
    /// own count of live objects).
    pub(super) inert_drop: bool,
    /// Objects the lost plugin instance still reports holding.
    pub(super) lost_instance_objects: u64,
    /// What `bind` on the lost context answered.
    pub(super) bind_refused: String,
    /// The replacement: its plugin and its context.
    pub(super) replacement: String,
    pub(super) replacement_context: String,
    pub(super) resumed: Vec<Resumed>,
}
