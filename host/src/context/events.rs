//! What a context tells its holders: one [`LifecycleEvent`] per transition,
//! delivered by [`Context::dispatch`] on the thread of whoever drives the
//! context (the manager's `poll` and reaper, `retire`, `declare_lost`,
//! `terminate`), never from where a loss was reported: a report may come
//! from inside a plugin slot or a driver's thread, where a runtime's
//! callback must not run.

use super::{Context, Settlement};
use crate::events::{events_wanted, Event, EventKind, Level};
use crate::governor::{AllocationClass, HolderId, Pool};
use crate::lifecycle::LifeState;
use crate::sync::{lock, AtomicU64, Mutex};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// What one binding of a lost context held: everything it made through the
/// context went with the device. (Which handles those are, the holder
/// knows: each says so, e.g. `OwnedAllocation::is_lost`.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LossNotice {
    /// `plugin/mechanism` of the lost context.
    pub context: String,
    /// The pool the binding charges.
    pub pool: String,
    /// The holder the binding charges (`None`: the pool's anonymous
    /// account).
    pub holder: Option<HolderId>,
    /// The binding's allocation class.
    pub class: AllocationClass,
    /// Charged objects (leases) the binding held when the notice was made.
    pub objects: u64,
    /// Their charged bytes.
    pub bytes: u64,
    /// Bytes quarantined by earlier refused releases (settled too).
    pub quarantined_bytes: u64,
}

/// One transition of a context's life.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LifecycleEvent {
    /// `plugin/mechanism`.
    pub context: String,
    /// The state left. Events of one context chain: each `from` is the
    /// previous event's `to`.
    pub from: LifeState,
    /// The state entered; an event with `to` [`LifeState::Terminated`] is
    /// the context's last.
    pub to: LifeState,
    /// Why the context left `Active`.
    pub reason: Option<String>,
    /// On entering `Lost`: one notice per binding that held something.
    pub notices: Vec<LossNotice>,
    /// On entering `Terminated`: what was settled.
    pub settlement: Option<Settlement>,
}

/// A subscription, for [`Context::unsubscribe`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SubscriptionId(u64);

type Listener = Arc<dyn Fn(&LifecycleEvent) + Send + Sync>;

pub(super) struct Listeners {
    list: Mutex<Vec<(u64, Listener)>>,
    next: AtomicU64,
    /// The state the listeners were last told of.
    delivered: Mutex<LifeState>,
}

impl Default for Listeners {
    fn default() -> Self {
        Listeners {
            list: Mutex::new(Vec::new()),
            next: AtomicU64::new(0),
            delivered: Mutex::new(LifeState::Active),
        }
    }
}

impl Context {
    /// Calls `f` with every later transition of this context, on the thread
    /// that delivers it (see the module documentation). A panic in `f` is
    /// caught and ignored.
    pub fn subscribe(&self, f: impl Fn(&LifecycleEvent) + Send + Sync + 'static) -> SubscriptionId {
        let id = self.listeners.next.fetch_add(1, Relaxed) + 1;
        lock(&self.listeners.list).push((id, Arc::new(f)));
        SubscriptionId(id)
    }

    /// Stops a subscription; `false` when it was not one of this context's.
    pub fn unsubscribe(&self, id: SubscriptionId) -> bool {
        let mut l = lock(&self.listeners.list);
        let before = l.len();
        l.retain(|(i, _)| *i != id.0);
        l.len() != before
    }

    /// What each binding holding something would be told if the context
    /// were lost now.
    pub fn loss_notices(&self) -> Vec<LossNotice> {
        self.holdings()
            .into_iter()
            .map(|(pool, n)| LossNotice { context: self.label().into(), pool: pool.name().into(), ..n })
            .collect()
    }

    /// What each binding holding something holds now, with its pool (the
    /// notice's `context` and `pool` left empty).
    fn holdings(&self) -> Vec<(Arc<Pool>, LossNotice)> {
        lock(&self.ledgers)
            .iter()
            .filter_map(|e| {
                let t = e.ledger.totals();
                (!t.is_zero()).then(|| {
                    (
                        e.pool.clone(),
                        LossNotice {
                            context: String::new(),
                            pool: String::new(),
                            holder: e.holder,
                            class: e.class,
                            objects: t.leases,
                            bytes: t.bytes,
                            quarantined_bytes: t.quarantined_bytes,
                        },
                    )
                })
            })
            .collect()
    }

    /// Tells the hub of a loss being delivered: the reason to the log hook,
    /// and one `ContextLost` event per binding that held something (one
    /// without a pool when none did).
    #[cold]
    fn observe_loss(&self, e: &LifecycleEvent) {
        let inner = &self.mechanism.inner;
        if let Some(reason) = &e.reason {
            inner.log(Level::Error, reason);
        }
        let Some(hub) = inner.plugin.hub.get().filter(|_| events_wanted()) else { return };
        let held = self.holdings();
        if held.is_empty() {
            hub.emit(&Event { count: 0, ..Event::new_bare(EventKind::ContextLost, 0).detail(&e.context) });
        }
        for (pool, n) in &held {
            let ev = Event {
                count: n.objects,
                ..Event::new(EventKind::ContextLost, pool.id(), pool.name(), n.bytes)
            }
            .holder(n.holder)
            .class(n.class)
            .detail(&e.context);
            hub.emit(&ev);
        }
    }

    /// Delivers the transitions the listeners have not been told of yet.
    /// A context that terminated is reported `Terminated` only once its
    /// settlement is recorded; one that was lost on the way is reported
    /// `Lost` (with the loss notices) first.
    pub fn dispatch(&self) {
        let events = {
            let mut delivered = lock(&self.listeners.delivered);
            let settled = lock(&self.settlement).clone();
            let lost_on_the_way = self.mechanism.inner.life.was_lost();
            let mut now = self.state();
            if now == LifeState::Terminated && settled.is_none() {
                // Settling right now: the terminator delivers the rest.
                now = if lost_on_the_way { LifeState::Lost } else { *delivered };
            }
            let mut events = Vec::new();
            let mut from = *delivered;
            if from < LifeState::Lost && now >= LifeState::Lost && lost_on_the_way {
                events.push(self.event(from, LifeState::Lost, None));
                from = LifeState::Lost;
            }
            if from != now {
                let s = if now == LifeState::Terminated { settled } else { None };
                events.push(self.event(from, now, s));
            }
            *delivered = now;
            events
        };
        if events.is_empty() {
            return;
        }
        let listeners: Vec<Listener> = lock(&self.listeners.list).iter().map(|(_, l)| l.clone()).collect();
        for e in &events {
            for l in &listeners {
                let _ = catch_unwind(AssertUnwindSafe(|| l(e)));
            }
            if e.to == LifeState::Lost {
                self.observe_loss(e);
            }
        }
    }

    fn event(&self, from: LifeState, to: LifeState, settlement: Option<Settlement>) -> LifecycleEvent {
        LifecycleEvent {
            context: self.label().into(),
            from,
            to,
            reason: self.reason(),
            notices: if to == LifeState::Lost { self.loss_notices() } else { Vec::new() },
            settlement,
        }
    }
}
