//! One C lifecycle subscription (a [`Subscriber`]): the caller's callback
//! and userdata, how each host event becomes a C
//! `MemplugHostLifecycleEvent` valid for the call, and what lets
//! `unsubscribe` wait for deliveries running on other threads. Apart from
//! `lifecycle.rs` (the exported functions) so that the manager's tables,
//! which hold subscribers, do not import the functions that use the tables.

use crate::callbacks::{thread_token, LifecycleScope, UserData};
use crate::common::MemplugHostSubscription;
use crate::lifecycle::{
    MemplugHostLifeState, MemplugHostLifecycleEvent, MemplugHostLossNotice, MemplugHostSettlement,
    MEMPLUG_HOST_SETTLEMENT_SIZE_1_0,
};
use memplug_host_dep::registry::Context;
use memplug_host_dep::{LifeState, LifecycleEvent, Settlement, SubscriptionId};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError, Weak};

pub(crate) fn life_state(s: LifeState) -> MemplugHostLifeState {
    match s {
        LifeState::Active => MemplugHostLifeState::Active,
        LifeState::Retiring => MemplugHostLifeState::Retiring,
        LifeState::Lost => MemplugHostLifeState::Lost,
        LifeState::Terminated => MemplugHostLifeState::Terminated,
    }
}

/// The C form of a settlement.
pub(crate) fn settlement(s: &Settlement) -> MemplugHostSettlement {
    MemplugHostSettlement {
        struct_size: MEMPLUG_HOST_SETTLEMENT_SIZE_1_0,
        after_loss: s.after_loss as u32,
        bytes: s.bytes,
        quarantined_bytes: s.bindings.iter().map(|b| b.quarantined_bytes).fold(0, u64::saturating_add),
        leases: s.bindings.iter().map(|b| b.leases).fold(0, u64::saturating_add),
        bindings: s.bindings.len() as u64,
        objects_forgotten: s.objects_forgotten,
    }
}

/// `s` as bytes followed by a NUL (C strings valid for a callback).
fn nul_terminated(s: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(s.len() + 1);
    v.extend_from_slice(s.as_bytes());
    v.push(0);
    v
}

// ---- subscriptions ------------------------------------------------------------

pub(crate) type LifecycleCallback = unsafe extern "C" fn(*mut c_void, *const MemplugHostLifecycleEvent);

struct SubscriberState {
    /// No delivery starts once set.
    closed: bool,
    /// Threads (`thread_token`) delivering to this subscriber now.
    running: Vec<u64>,
    /// The context's id of the subscription, once subscribed.
    id: Option<SubscriptionId>,
}

/// One C subscription: the caller's callback and userdata, and what lets
/// `unsubscribe` wait for deliveries running on other threads.
pub(crate) struct Subscriber {
    callback: LifecycleCallback,
    userdata: UserData,
    /// The subscription's handle (set before any event can be delivered).
    handle: AtomicU64,
    context: Weak<Context>,
    state: Mutex<SubscriberState>,
    idle: Condvar,
}

impl Subscriber {
    pub(crate) fn new(callback: LifecycleCallback, userdata: UserData, context: Weak<Context>) -> Subscriber {
        Subscriber {
            callback,
            userdata,
            handle: AtomicU64::new(0),
            context,
            state: Mutex::new(SubscriberState { closed: false, running: Vec::new(), id: None }),
            idle: Condvar::new(),
        }
    }

    /// The subscription's C handle (set before any event can be delivered).
    pub(crate) fn set_handle(&self, id: u64) {
        self.handle.store(id, Ordering::Release);
    }

    /// Records the host's subscription id; `false` when the subscription
    /// was ended meanwhile (the caller then unsubscribes `id` itself).
    pub(crate) fn complete(&self, id: SubscriptionId) -> bool {
        let mut s = self.lock();
        if s.closed {
            return false;
        }
        s.id = Some(id);
        true
    }

    fn lock(&self) -> MutexGuard<'_, SubscriberState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends the subscription: no delivery starts after this; returns once
    /// none runs on another thread (one running on this thread — a callback
    /// ending its own subscription — goes on after this returns).
    fn close_now(&self) {
        let me = thread_token();
        let id = {
            let mut s = self.lock();
            s.closed = true;
            while s.running.iter().any(|t| *t != me) {
                s = self.idle.wait(s).unwrap_or_else(PoisonError::into_inner);
            }
            s.id.take()
        };
        if let (Some(id), Some(ctx)) = (id, self.context.upgrade()) {
            ctx.unsubscribe(id);
        }
    }

    /// Runs the callback with `e` (unless closed), on this thread.
    pub(crate) fn deliver(&self, e: &LifecycleEvent) {
        let me = thread_token();
        {
            let mut s = self.lock();
            if s.closed {
                return;
            }
            s.running.push(me);
        }
        // Taken off the running list however this ends.
        struct Running<'a>(&'a Subscriber, u64);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                let mut s = self.0.lock();
                if let Some(i) = s.running.iter().position(|t| *t == self.1) {
                    s.running.swap_remove(i);
                }
                drop(s);
                self.0.idle.notify_all();
            }
        }
        let _running = Running(self, me);

        let context = nul_terminated(&e.context);
        let reason = e.reason.as_deref().map(nul_terminated);
        let pool_names: Vec<Vec<u8>> = e.notices.iter().map(|n| nul_terminated(&n.pool)).collect();
        let notices: Vec<MemplugHostLossNotice> = e
            .notices
            .iter()
            .zip(&pool_names)
            .map(|(n, name)| MemplugHostLossNotice {
                struct_size: std::mem::size_of::<MemplugHostLossNotice>() as u32,
                alloc_class: memplug_host_dep::mechanism::class_tag(n.class),
                holder_id: n.holder.map_or(0, |h| h.get()),
                objects: n.objects,
                bytes: n.bytes,
                quarantined_bytes: n.quarantined_bytes,
                pool_name: name.as_ptr().cast(),
                pool_name_len: name.len() - 1,
            })
            .collect();
        let settled = e.settlement.as_ref().map(settlement);
        let event = MemplugHostLifecycleEvent {
            struct_size: std::mem::size_of::<MemplugHostLifecycleEvent>() as u32,
            from: life_state(e.from),
            to: life_state(e.to),
            reserved0: 0,
            subscription: MemplugHostSubscription { id: self.handle.load(Ordering::Acquire) },
            context: context.as_ptr().cast(),
            context_len: context.len() - 1,
            reason: reason.as_ref().map_or(std::ptr::null(), |r| r.as_ptr().cast()),
            reason_len: reason.as_ref().map_or(0, |r| r.len() - 1),
            notices: if notices.is_empty() { std::ptr::null() } else { notices.as_ptr() },
            notice_count: notices.len(),
            notice_size: std::mem::size_of::<MemplugHostLossNotice>(),
            settlement: settled.as_ref().map_or(std::ptr::null(), |s| s as *const _),
        };
        let _scope = LifecycleScope::enter();
        let ud = self.userdata;
        // SAFETY: the caller subscribed this function and userdata for
        // exactly this call; the event and what it points to live across it.
        unsafe { (self.callback)(ud.0, &event) };
    }
}

impl crate::manager_tables::Closes for Subscriber {
    fn close(&self) {
        self.close_now();
    }
}
