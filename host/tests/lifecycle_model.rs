//! A model-based test of a context's life against its books (issue 11):
//! random allocations, regions that grow and shrink, a shared prefix,
//! frees behind runtime fences and behind a plugin stream's fences, a loss
//! and a termination at random points — against a reference model of what
//! the pool must hold. Properties, after every step:
//!
//! * before termination, the pool holds exactly what the live handles and
//!   the frees still waiting hold;
//! * after a loss nothing new is made, and termination settles everything
//!   the context held in one step: the pool's `used` falls by exactly the
//!   settlement's bytes, to zero, and `discharged()` is that amount;
//! * after termination nothing is refunded twice (the pool stays at zero
//!   whatever is dropped, opened or polled) and the plugin is never asked
//!   to free anything (its own live count stays where it was);
//! * at the end, with everything dropped: zero.
//!
//! Runs against a private copy of the reference CPU plugin, one per case.

mod common;

use common::*;
use memplug_host::{FenceSource, LifeState, OwnedAllocation, Region, SharedPrefix};
use proptest::prelude::*;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Debug)]
enum Op {
    Alloc(u64),
    Free(usize),
    FreeAfterRuntimeFence(usize),
    FreeAfterStreamFence(usize),
    Reserve,
    Grow(usize, u64),
    Shrink(usize, u64),
    /// A shrink whose decommit waits behind runtime work (queued).
    ShrinkAfterRuntimeFence(usize, u64),
    /// A grow queued on the plugin's stream (`grow_on`, queued binding).
    GrowOn(usize, u64),
    DropRegion(usize),
    MapPrefix(usize),
    OpenFences,
    Poll,
    Lose,
    Terminate,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..20_000).prop_map(Op::Alloc),
        2 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::FreeAfterRuntimeFence),
        1 => any::<usize>().prop_map(Op::FreeAfterStreamFence),
        1 => Just(Op::Reserve),
        2 => (any::<usize>(), 1u64..(256 * KIB)).prop_map(|(i, l)| Op::Grow(i, l)),
        1 => (any::<usize>(), 0u64..(128 * KIB)).prop_map(|(i, l)| Op::Shrink(i, l)),
        1 => (any::<usize>(), 0u64..(128 * KIB)).prop_map(|(i, l)| Op::ShrinkAfterRuntimeFence(i, l)),
        1 => (any::<usize>(), 1u64..(256 * KIB)).prop_map(|(i, l)| Op::GrowOn(i, l)),
        1 => any::<usize>().prop_map(Op::DropRegion),
        1 => any::<usize>().prop_map(Op::MapPrefix),
        1 => Just(Op::OpenFences),
        1 => Just(Op::Poll),
        1 => Just(Op::Lose),
        1 => Just(Op::Terminate),
    ]
}

/// A free waiting on a fence, as the model sees it: its charged bytes.
struct Waiting {
    bytes: u64,
    /// The runtime fence, when it waits on one (opened by `OpenFences`).
    gate: Option<Arc<Gate>>,
}

struct World {
    rig: Rig,
    stream: Option<CpuStream>,
    /// The stream queued grows go on: not `stream`, whose host functions
    /// the model holds (a grow behind them would wait for the model).
    grow_stream: Option<CpuStream>,
    /// Unblocks the stream's current host function (the stream's fences
    /// complete once it returns).
    stream_gates: Vec<mpsc::Sender<()>>,
    allocs: Vec<OwnedAllocation>,
    regions: Vec<Region>,
    /// Per region (same index): the gate of its last shrink still queued
    /// behind runtime work. Its release waits for its shrinks, so a region
    /// dropped meanwhile stays charged until that gate opens (every gate
    /// opens at once, with `OpenFences`).
    shrink_gates: Vec<Option<Arc<Gate>>>,
    prefix: Option<Arc<SharedPrefix>>,
    waiting: Vec<Waiting>,
    /// Charges of handles dropped (or tails shrunk) after the loss: they
    /// stay in the pool until termination settles them.
    lost_held: u64,
    lost: bool,
    terminated: bool,
    /// The plugin's own live count when the context terminated.
    plugin_live_at_end: Option<u64>,
}

impl World {
    fn held(&self) -> u64 {
        let a: u64 = self.allocs.iter().map(|a| a.charged()).sum();
        let r: u64 = self.regions.iter().map(|r| r.committed()).sum();
        let p = self.prefix.as_ref().map_or(0, |p| p.charged());
        a + r + p + self.lost_held + self.waiting.iter().map(|w| w.bytes).sum::<u64>()
    }

    /// Whether region `i` has a shrink still queued behind a closed gate.
    fn shrink_pending(&self, i: usize) -> bool {
        self.shrink_gates[i].as_ref().is_some_and(|g| !g.is_open())
    }

    fn pick<T>(v: &[T], i: usize) -> Option<usize> {
        (!v.is_empty()).then(|| i % v.len())
    }

    /// The queue retired what it could (fences open, or a lost device's):
    /// what the model drops from `waiting`.
    fn settle_waiting(&mut self) {
        if self.lost {
            // A lost context's queued frees settle with the context, not
            // by themselves; their bytes stay charged until termination.
            return;
        }
        self.waiting.retain(|w| w.gate.as_ref().is_some_and(|g| !g.is_open()));
    }

    fn step(&mut self, op: &Op) {
        let b = &self.rig.binding;
        match op {
            Op::Alloc(size) => match b.allocate(*size, 64) {
                Ok(a) => {
                    assert!(!self.lost, "a lost context made an allocation");
                    self.allocs.push(a)
                }
                Err(e) => assert!(self.lost, "an active context refused: {e}"),
            },
            Op::Free(i) => {
                if let Some(i) = Self::pick(&self.allocs, *i) {
                    let a = self.allocs.swap_remove(i);
                    if self.lost {
                        self.lost_held += a.charged();
                    }
                    drop(a);
                }
            }
            Op::FreeAfterRuntimeFence(i) => {
                if let Some(i) = Self::pick(&self.allocs, *i) {
                    let a = self.allocs.swap_remove(i);
                    let g = Arc::new(Gate::new("runtime work"));
                    let bytes = a.charged();
                    a.release_after([g.fence.clone()]);
                    self.waiting.push(Waiting { bytes, gate: Some(g) });
                }
            }
            Op::FreeAfterStreamFence(i) => {
                let (Some(i), Some(s)) = (Self::pick(&self.allocs, *i), self.stream.as_ref()) else { return };
                if self.lost {
                    return; // no stream work on a lost device
                }
                let a = self.allocs.swap_remove(i);
                let (tx, rx) = mpsc::channel::<()>();
                s.run(move || {
                    let _ = rx.recv_timeout(Duration::from_secs(20));
                });
                self.stream_gates.push(tx);
                let bytes = a.charged();
                a.release_after([s.fence()]);
                // Waits on a device fence: settles when the stream runs
                // (OpenFences), or with the context once it is lost.
                let g = Arc::new(Gate::new("stand-in for the stream"));
                self.waiting.push(Waiting { bytes, gate: Some(g) });
            }
            Op::Reserve => match b.reserve_virtual(512 * KIB) {
                Ok(r) => {
                    self.regions.push(r);
                    self.shrink_gates.push(None);
                }
                Err(e) => assert!(self.lost, "{e}"),
            },
            Op::Grow(i, len) => {
                if let Some(i) = Self::pick(&self.regions, *i) {
                    let needs_growth = *len > self.regions[i].len();
                    let r = self.regions[i].grow_to(*len, |_| Ok::<(), ()>(()));
                    if needs_growth && self.shrink_pending(i) {
                        // A range whose queued decommit has not run is BUSY
                        // (a grow past it is not); a lost context grows none.
                        assert!(!(self.lost && r.is_ok()), "a lost context grew a region");
                    } else if needs_growth {
                        assert_eq!(
                            r.is_err(),
                            self.lost,
                            "grow on a region of a {} context",
                            self.rig.context.state()
                        );
                    } else {
                        assert!(r.is_ok(), "a grow to less than the length is a no-op");
                    }
                }
            }
            Op::Shrink(i, len) => {
                if let Some(i) = Self::pick(&self.regions, *i) {
                    let before = self.regions[i].committed();
                    let _ = self.regions[i].shrink_to(*len, Vec::new());
                    let tail = before - self.regions[i].committed();
                    if self.lost {
                        self.lost_held += tail;
                    } else if self.shrink_pending(i) && tail > 0 {
                        // The region's fences include the runtime work a
                        // queued shrink waits for: this tail waits too.
                        let gate = self.shrink_gates[i].clone();
                        self.waiting.push(Waiting { bytes: tail, gate });
                    }
                }
            }
            Op::ShrinkAfterRuntimeFence(i, len) => {
                if let Some(i) = Self::pick(&self.regions, *i) {
                    let before = self.regions[i].committed();
                    let g = Arc::new(Gate::new("runtime work on the tail"));
                    if self.regions[i].shrink_to(*len, vec![g.fence.clone()]).is_err() {
                        return; // offloaded: never here
                    }
                    let tail = before - self.regions[i].committed();
                    if tail == 0 {
                        return;
                    }
                    if self.lost {
                        self.lost_held += tail;
                    } else {
                        self.waiting.push(Waiting { bytes: tail, gate: Some(g.clone()) });
                        self.shrink_gates[i] = Some(g);
                    }
                }
            }
            Op::GrowOn(i, len) => {
                let (Some(i), Some(s)) = (Self::pick(&self.regions, *i), self.grow_stream.as_ref()) else {
                    return;
                };
                let needs_growth = *len > self.regions[i].len();
                match self.regions[i].grow_on(*len, s.stream()) {
                    Ok(f) => {
                        assert!(!self.lost || !needs_growth, "a lost context grew a region");
                        // Usable once its fence completes: wait, so later
                        // shrinks of it run at once (as the model has it).
                        assert!(f.wait(Duration::from_secs(20)).unwrap());
                    }
                    Err(e) => assert!(
                        self.lost || self.shrink_pending(i),
                        "an active context refused a queued grow: {e}"
                    ),
                }
            }
            Op::DropRegion(i) => {
                if let Some(i) = Self::pick(&self.regions, *i) {
                    let r = self.regions.swap_remove(i);
                    let gate = self.shrink_gates.swap_remove(i);
                    if self.lost {
                        self.lost_held += r.committed();
                    } else if let Some(g) = gate.filter(|g| !g.is_open()) {
                        // Its release waits for its queued shrinks.
                        self.waiting.push(Waiting { bytes: r.committed(), gate: Some(g) });
                    }
                    drop(r);
                }
            }
            Op::MapPrefix(i) => {
                if self.prefix.is_none() && !self.lost {
                    self.prefix = Some(b.create_shared(64 * KIB, |_| {}).unwrap());
                }
                if let (Some(i), Some(p)) = (Self::pick(&self.regions, *i), self.prefix.clone()) {
                    // (Not over a range whose queued decommit has not run.)
                    let free = self.regions[i].committed() == 0 && !self.shrink_pending(i);
                    if free && self.regions[i].prefix_access().is_none() {
                        let _ = self.regions[i].map_prefix(&p);
                    }
                }
            }
            Op::OpenFences => {
                for w in &self.waiting {
                    if let Some(g) = &w.gate {
                        g.open();
                    }
                }
                for g in self.shrink_gates.iter().flatten() {
                    g.open();
                }
                for tx in self.stream_gates.drain(..) {
                    let _ = tx.send(());
                }
                // Let the stream run what it was holding.
                if let Some(s) = &self.stream {
                    if !self.lost {
                        let done = s.fence();
                        let _ = done.wait(Duration::from_secs(20));
                    }
                }
                // A region waits for its shrinks, which the same poll may
                // retire after it looked: one more poll retires it.
                self.rig.manager.queue().poll();
                self.poll();
            }
            Op::Poll => self.poll(),
            Op::Lose => {
                self.rig.context.declare_lost("the model lost it");
                self.lost = true;
            }
            Op::Terminate => {
                if !self.lost || self.terminated {
                    return;
                }
                let before = self.rig.pool.used();
                let s = self.rig.manager.terminate(&self.rig.context, Duration::from_secs(10)).unwrap();
                assert_eq!(before - self.rig.pool.used(), s.bytes, "used falls by the settled bytes");
                assert_eq!(self.rig.pool.discharged(), s.bytes, "settled once");
                self.terminated = true;
                self.plugin_live_at_end = Some(self.rig.plugin_live());
            }
        }
    }

    /// The manager's poll: retires what it can and, for a lost context with
    /// nothing in flight, terminates it (settling once).
    fn poll(&mut self) {
        let before = self.rig.pool.used();
        self.rig.manager.poll();
        self.settle_waiting();
        if self.lost && !self.terminated {
            assert_eq!(
                self.rig.context.state(),
                LifeState::Terminated,
                "poll terminates a quiet lost context"
            );
            let s = self.rig.context.settlement().expect("settled");
            assert_eq!(before - self.rig.pool.used(), s.bytes, "used falls by the settled bytes");
            assert_eq!(self.rig.pool.discharged(), s.bytes, "settled once");
            self.terminated = true;
            self.plugin_live_at_end = Some(self.rig.plugin_live());
        }
    }

    fn check(&self) {
        let used = self.rig.pool.used();
        if self.terminated {
            assert_eq!(used, 0, "a terminated context holds nothing, and nothing is refunded twice");
            // Termination settled what was queued, and what is dropped
            // later does not wait: nothing stays queued, whatever fence it
            // named (runtime gates never opened included).
            let q = self.rig.manager.queue().stats();
            assert_eq!(q.pending, 0, "nothing stays queued after termination: {q:?}");
            assert_eq!(self.rig.context.state(), LifeState::Terminated);
            assert_eq!(
                Some(self.rig.plugin_live()),
                self.plugin_live_at_end,
                "no plugin call after termination"
            );
        } else {
            assert_eq!(used, self.held(), "the pool holds what the handles and the waiting frees hold");
        }
    }
}

impl Rig {
    fn plugin_live(&self) -> u64 {
        self.manager.registry().live_reports().iter().map(|(_, r)| r.plugin_reported).sum()
    }
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let rig = Rig::cpu("model", 64 * MIB);
    let stream = Some(CpuStream::new(rig.mechanism()));
    let grow_stream = Some(CpuStream::new(rig.mechanism()));
    let mut w = World {
        rig,
        stream,
        grow_stream,
        stream_gates: Vec::new(),
        allocs: Vec::new(),
        regions: Vec::new(),
        shrink_gates: Vec::new(),
        prefix: None,
        waiting: Vec::new(),
        lost_held: 0,
        lost: false,
        terminated: false,
        plugin_live_at_end: None,
    };
    for op in ops {
        w.step(op);
        w.check();
    }
    // The end: everything dropped, every fence opened.
    w.step(&Op::OpenFences);
    let dropped = w.allocs.iter().map(|a| a.charged()).sum::<u64>()
        + w.regions.iter().map(|r| r.committed()).sum::<u64>()
        + w.prefix.as_ref().map_or(0, |p| p.charged());
    if w.lost {
        w.lost_held += dropped;
    }
    w.allocs.clear();
    w.regions.clear();
    w.shrink_gates.clear();
    w.prefix = None;
    w.step(&Op::OpenFences);
    w.stream = None;
    w.grow_stream = None;
    if w.lost && !w.terminated {
        w.step(&Op::Terminate);
    }
    w.rig.manager.poll();
    w.waiting.clear();
    w.check();
    prop_assert_eq!(w.rig.pool.used(), 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn lifecycle_and_settlement_match_the_model(ops in proptest::collection::vec(op(), 1..40)) {
        run(&ops)?;
    }
}

/// Cases the model once found, kept.
#[test]
fn a_free_behind_a_runtime_fence_made_after_the_loss_settles_with_the_context() {
    run(&[Op::Alloc(1), Op::Lose, Op::FreeAfterRuntimeFence(0), Op::Terminate]).unwrap();
}
