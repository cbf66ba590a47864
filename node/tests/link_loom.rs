//! Exhaustive interleavings (loom) of the link's rule for changing a
//! joined pool's capacity (`node/src/gate.rs`): a grant and a ticket of
//! the authority that went away, racing the join to the next one, leave
//! the pool's capacity equal to what the next authority counts — every
//! byte once, none it did not see — and idle budget given back never
//! loses a change.
//!
//! Built only with `--cfg loom`, in its own target dir:
//!
//! ```sh
//! CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" \
//!     cargo test -p memplug-node --release --test link_loom
//! ```
#![cfg(loom)]

use loom::sync::atomic::{AtomicU64, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;
use memplug_node::gate::{Capacity, Gates, Stale};

/// A pool: its capacity and use, loom's atomics (the governor's own
/// atomics are not what is explored here).
#[derive(Default)]
struct Pool {
    capacity: AtomicU64,
    used: AtomicU64,
}

impl Capacity for Pool {
    fn capacity(&self) -> u64 {
        self.capacity.load(SeqCst)
    }
    fn used(&self) -> u64 {
        self.used.load(SeqCst)
    }
    fn set(&self, capacity: u64) -> bool {
        if capacity < self.used() {
            return false;
        }
        self.capacity.store(capacity, SeqCst);
        true
    }
}

fn pool(capacity: u64, used: u64) -> Arc<Pool> {
    let p = Pool::default();
    p.capacity.store(capacity, SeqCst);
    p.used.store(used, SeqCst);
    Arc::new(p)
}

/// A grant of the old authority races the join: applied before (and
/// declared) or dropped after, never counted by neither or both.
#[test]
fn a_grant_racing_a_join_is_declared_or_dropped() {
    loom::model(|| {
        let gates = Arc::new(Gates::new(1));
        let p = pool(4, 4);
        let old = gates.generation();
        let (g, q) = (gates.clone(), p.clone());
        let grant = thread::spawn(move || g.grant(0, &*q, old, 2));
        let declared = gates.join(&[&*p as &dyn Capacity])[0];
        let applied = grant.join().unwrap();
        // What the next authority counts is what the pool holds.
        assert_eq!(declared, p.capacity());
        match applied {
            Ok(()) => assert_eq!(declared, 6),
            Err(Stale::Generation) => assert_eq!(declared, 4),
            Err(Stale::Refused) => unreachable!(),
        }
    });
}

/// A ticket of the old authority and a grant of the old one both race the
/// join; then idle budget goes back to the new one. The new books
/// (declared, less what is returned to them) always equal the capacity.
#[test]
fn a_ticket_and_a_grant_of_a_gone_authority_and_the_idle_return_keep_the_books_exact() {
    loom::model(|| {
        let gates = Arc::new(Gates::new(1));
        // 8 held, 6 used: the ticket's holders already freed 2.
        let p = pool(8, 6);
        let old = gates.generation();
        let (g1, q1) = (gates.clone(), p.clone());
        let ticket = thread::spawn(move || g1.ticket(0, &*q1, old, 2, || ()));
        let (g2, q2) = (gates.clone(), p.clone());
        let grant = thread::spawn(move || g2.grant(0, &*q2, old, 4));
        let declared = gates.join(&[&*p as &dyn Capacity])[0];
        let answered = ticket.join().unwrap();
        let granted = grant.join().unwrap();
        // Nothing of the old generation changes the pool after the join:
        // the new books hold what the pool holds.
        assert_eq!(declared, p.capacity(), "ticket {answered:?}, grant {granted:?}");
        // The idle return (the tick, after the join) gives the new
        // authority back everything above one chunk; books still exact.
        let returned = gates.idle(0, &*p, 0, 1).unwrap();
        assert_eq!(declared - returned, p.capacity());
        assert_eq!(p.capacity(), 6, "only what is used stays");
    });
}

/// Capacity changes of the current generation never lose one: a ticket
/// lowering, a grant raising and an idle return at once end at their sum
/// (an idle return that finds the gate busy changes nothing), and the
/// capacity never goes below what is live.
#[test]
fn concurrent_changes_of_one_generation_all_land() {
    loom::model(|| {
        let gates = Arc::new(Gates::new(1));
        let p = pool(10, 4);
        let now = gates.generation();
        let (g1, q1) = (gates.clone(), p.clone());
        let ticket = thread::spawn(move || g1.ticket(0, &*q1, now, 3, || ()).unwrap());
        let (g2, q2) = (gates.clone(), p.clone());
        let idle = thread::spawn(move || g2.idle(0, &*q2, 1, 1));
        gates.grant(0, &*p, now, 2).unwrap();
        let released = ticket.join().unwrap();
        let returned = idle.join().unwrap().unwrap_or(0);
        // The ticket releases at most what it asked, and no more than what
        // was not live (the idle return may have taken the rest first).
        assert!(released <= 3);
        assert_eq!(p.capacity(), 10 + 2 - released - returned, "none lost");
        assert!(p.capacity() >= p.used());
    });
}

/// A ticket's holders free bytes while the tick's idle return runs: what
/// they free goes back as the ticket's answer, never as idle budget (the
/// authority's count of what each member released stays true), and
/// nothing is lost either way.
#[test]
fn what_a_tickets_holders_free_is_its_answer_not_idle_budget() {
    loom::model(|| {
        let gates = Arc::new(Gates::new(1));
        // 6 held, all used; the holders will free 3.
        let p = pool(6, 6);
        let now = gates.generation();
        let (g1, q1) = (gates.clone(), p.clone());
        let ticket = thread::spawn(move || {
            let q = q1.clone();
            g1.ticket(0, &*q1, now, 3, move || {
                q.used.fetch_sub(3, SeqCst);
            })
        });
        let returned = gates.idle(0, &*p, 0, 1);
        let released = ticket.join().unwrap().unwrap();
        assert_eq!(released, 3, "idle return took {returned:?}");
        assert_eq!(returned.unwrap_or(0), 0);
        assert_eq!(p.capacity(), 3);
    });
}
