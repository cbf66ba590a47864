//! The governor's events (`crate::events`): what a pool tells its hub.
//! Each function is out of line, so the paths that call them keep their
//! registers; only a grant's is on the fast path, and it is reached only
//! when `events::events_wanted()` said someone may listen.

use super::holder::PressureTicket;
use super::pool::Pool;
use crate::events::{events_wanted, Event, EventKind};
use crate::ids::AllocationClass;
use crate::ids::HolderId;

impl Pool {
    /// The holder an account uid names (`None`: the anonymous account).
    pub(super) fn holder_of(&self, uid: u64) -> Option<HolderId> {
        super::grant::holder_of(self.id, uid)
    }

    #[cold]
    #[inline(never)]
    pub(super) fn observe_grant(&self, uid: u64, bytes: u64, class: AllocationClass) {
        let e =
            Event::new(EventKind::Grant, self.id, &self.name, bytes).holder(self.holder_of(uid)).class(class);
        self.hub.emit(&e);
    }

    /// A refusal of `requested` bytes; `short` is the pool that had no room.
    #[cold]
    #[inline(never)]
    pub(super) fn observe_refusal(
        &self,
        short: &Pool,
        requested: u64,
        class: AllocationClass,
        holder: Option<HolderId>,
    ) {
        if events_wanted() {
            let e = Event::new(EventKind::OutOfBudget, self.id, &self.name, requested)
                .holder(holder)
                .class(class)
                .detail(&short.name);
            self.hub.emit(&e);
        }
    }

    #[inline]
    pub(super) fn observe_quarantine(&self, holder: Option<HolderId>, class: AllocationClass, bytes: u64) {
        if events_wanted() {
            self.quarantine_event(holder, class, bytes);
        }
    }

    #[cold]
    #[inline(never)]
    fn quarantine_event(&self, holder: Option<HolderId>, class: AllocationClass, bytes: u64) {
        let e = Event::new(EventKind::Quarantine, self.id, &self.name, bytes).holder(holder).class(class);
        self.hub.emit(&e);
    }

    /// A ticket about to go to `recipient` (this pool is the short one).
    #[cold]
    pub(super) fn observe_ticket(&self, ticket: &PressureTicket, recipient: HolderId) {
        if events_wanted() {
            let e = Event::new(EventKind::PressureTicket, self.id, &self.name, ticket.bytes_wanted)
                .holder(Some(recipient))
                .class(ticket.class);
            self.hub.emit(&e);
        }
    }

    /// `recipient`'s answer to `ticket` (`None`: its callback panicked):
    /// an eviction when it released something.
    #[cold]
    pub(super) fn observe_answer(&self, ticket: &PressureTicket, recipient: HolderId, answer: Option<u64>) {
        if let Some(bytes @ 1..) = answer {
            if events_wanted() {
                let e = Event::new(EventKind::Eviction, self.id, &self.name, bytes)
                    .holder(Some(recipient))
                    .class(ticket.class);
                self.hub.emit(&e);
            }
        }
    }
}
