//! Model-based test of the governor: random sequences of every operation
//! against a plain reference model; after every step the pool's snapshot
//! and every holder's statistics must equal the model's, and capacity must
//! hold. Covers invariants 2 (accounting follows the bytes committed),
//! 5 (holders release, the governor only asks) and 7 (quarantine is never
//! refunded).

use memplug_host::governor::{
    AllocationClass, ClassStats, Governor, GovernorError, Grant, HolderId, HolderRegistration, Lease, Pool,
    PressureStats, PressureTicket, Priority,
};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

const CAP: u64 = 1024;

#[derive(Debug, Clone)]
enum Op {
    /// `try_reserve`.
    Reserve {
        bytes: u64,
        class: usize,
        holder: Option<usize>,
    },
    /// `reserve` without deadline: tickets to holders.
    Pressure {
        bytes: u64,
        class: usize,
        holder: Option<usize>,
    },
    /// Commit `bytes * num / 255` (never more than reserved).
    Commit {
        res: usize,
        num: u8,
    },
    /// Commit more than reserved.
    CommitOver {
        res: usize,
        extra: u64,
    },
    DropGrant {
        res: usize,
    },
    /// Reserve with the lease's class and holder, `commit_into` a part of it.
    Grow {
        lease: usize,
        bytes: u64,
        num: u8,
    },
    Shrink {
        lease: usize,
        num: u8,
    },
    QuarantinePart {
        lease: usize,
        num: u8,
    },
    OverRelease {
        lease: usize,
    },
    /// `split_lease`: move a part into a new lease.
    Split {
        lease: usize,
        num: u8,
    },
    Release {
        lease: usize,
    },
    Quarantine {
        lease: usize,
    },
    /// Drop a lease without ending it.
    Leak {
        lease: usize,
    },
    Register {
        priority: u32,
        generous: bool,
    },
    Unregister {
        holder: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let bytes = prop_oneof![0u64..=16, 0u64..=512, Just(CAP)];
    let class = 0..AllocationClass::COUNT;
    let holder = proptest::option::weighted(0.6, any::<usize>());
    prop_oneof![
        6 => (bytes.clone(), class.clone(), holder.clone())
            .prop_map(|(bytes, class, holder)| Op::Reserve { bytes, class, holder }),
        3 => (bytes.clone(), class, holder)
            .prop_map(|(bytes, class, holder)| Op::Pressure { bytes, class, holder }),
        6 => (any::<usize>(), any::<u8>()).prop_map(|(res, num)| Op::Commit { res, num }),
        1 => (any::<usize>(), 1u64..=300).prop_map(|(res, extra)| Op::CommitOver { res, extra }),
        2 => any::<usize>().prop_map(|res| Op::DropGrant { res }),
        2 => (any::<usize>(), bytes, any::<u8>()).prop_map(|(lease, bytes, num)| Op::Grow { lease, bytes, num }),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(lease, num)| Op::Shrink { lease, num }),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(lease, num)| Op::QuarantinePart { lease, num }),
        1 => any::<usize>().prop_map(|lease| Op::OverRelease { lease }),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(lease, num)| Op::Split { lease, num }),
        4 => any::<usize>().prop_map(|lease| Op::Release { lease }),
        1 => any::<usize>().prop_map(|lease| Op::Quarantine { lease }),
        1 => any::<usize>().prop_map(|lease| Op::Leak { lease }),
        2 => (0u32..4, any::<bool>()).prop_map(|(priority, generous)| Op::Register { priority, generous }),
        1 => any::<usize>().prop_map(|holder| Op::Unregister { holder }),
    ]
}

/// A token as the model sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Tok {
    bytes: u64,
    class: usize,
    holder: Option<HolderId>,
}

struct MHolder {
    id: HolderId,
    priority: Priority,
    generous: bool,
    registered: bool,
    pressure: PressureStats,
    /// Tickets received, per class of the request.
    class_pressure: [PressureStats; AllocationClass::COUNT],
}

#[derive(Default)]
struct Model {
    used: u64,
    peak: u64,
    /// Per account (`None`: anonymous), per class.
    stats: BTreeMap<Option<HolderId>, [ClassStats; AllocationClass::COUNT]>,
    grants: Vec<Tok>,
    leases: Vec<Tok>,
    holders: Vec<MHolder>,
    pressure: PressureStats,
    /// Tickets issued, per class of the request.
    class_pressure: [PressureStats; AllocationClass::COUNT],
}

impl Model {
    fn cs(&mut self, holder: Option<HolderId>, class: usize) -> &mut ClassStats {
        &mut self.stats.entry(holder).or_default()[class]
    }

    fn registered(&self, holder: Option<HolderId>) -> bool {
        holder.is_none_or(|h| self.holders.iter().any(|m| m.id == h && m.registered))
    }

    fn charge(&mut self, bytes: u64) -> bool {
        if self.used + bytes > CAP {
            return false;
        }
        self.used += bytes;
        self.peak = self.peak.max(self.used);
        true
    }

    fn grant(&mut self, t: Tok) -> bool {
        if !self.charge(t.bytes) {
            return false;
        }
        let c = self.cs(t.holder, t.class);
        c.reserved += t.bytes;
        c.granted_bytes += t.bytes;
        c.grants += 1;
        true
    }

    fn release(&mut self, t: Tok) {
        let c = self.cs(t.holder, t.class);
        c.leased -= t.bytes;
        c.leases -= 1;
        self.used -= t.bytes;
    }

    fn pool_classes(&self) -> [ClassStats; AllocationClass::COUNT] {
        let mut out = [ClassStats::default(); AllocationClass::COUNT];
        for per in self.stats.values() {
            for (o, c) in out.iter_mut().zip(per) {
                o.reserved += c.reserved;
                o.leased += c.leased;
                o.quarantined += c.quarantined;
                o.leases += c.leases;
                o.grants += c.grants;
                o.failures += c.failures;
                o.quarantines += c.quarantines;
                o.leaked_leases += c.leaked_leases;
                o.leaked_bytes += c.leaked_bytes;
                o.granted_bytes += c.granted_bytes;
            }
        }
        out
    }
}

/// Releases the holder's leases, oldest first, until `wanted` is covered.
/// The same rule runs in the real callback and in the model.
fn generous_pick(leases: &[Tok], holder: HolderId, wanted: u64) -> Vec<usize> {
    let (mut freed, mut picked) = (0, Vec::new());
    for (i, t) in leases.iter().enumerate() {
        if freed >= wanted {
            break;
        }
        if t.holder == Some(holder) {
            freed += t.bytes;
            picked.push(i);
        }
    }
    picked
}

fn tok(l: &Lease) -> Tok {
    Tok { bytes: l.bytes(), class: l.class().index(), holder: l.holder() }
}

/// The model's class figures with what follows from the rest: released
/// bytes (granted minus charged), the class's ticket figures, and the
/// sampled peak — which is not modelled, only bounded: at least what is
/// charged now, at most the pool's exact peak.
fn derived(
    model: &[ClassStats; AllocationClass::COUNT],
    pressure: &[PressureStats; AllocationClass::COUNT],
    got: &[ClassStats; AllocationClass::COUNT],
    pool_peak: u64,
) -> Result<[ClassStats; AllocationClass::COUNT], TestCaseError> {
    let mut want = *model;
    for ((w, p), g) in want.iter_mut().zip(pressure).zip(got) {
        w.released_bytes = w.granted_bytes - w.charged();
        w.tickets = p.tickets;
        w.evictions = p.tickets - p.zero_answers;
        w.evicted_bytes = p.bytes_answered;
        prop_assert!(
            g.peak >= w.charged() && g.peak <= pool_peak,
            "peak {} outside [{}, {pool_peak}]",
            g.peak,
            w.charged()
        );
        w.peak = g.peak;
    }
    Ok(want)
}

fn check(pool: &Pool, m: &Model) -> Result<(), TestCaseError> {
    let s = pool.snapshot();
    prop_assert!(s.used <= s.capacity, "capacity exceeded: {} > {}", s.used, s.capacity);
    prop_assert_eq!(s.capacity, CAP);
    prop_assert_eq!(s.used, m.used);
    prop_assert_eq!(s.free, CAP - m.used);
    prop_assert_eq!(s.peak, m.peak);
    let classes = m.pool_classes();
    prop_assert_eq!(s.classes, derived(&classes, &m.class_pressure, &s.classes, s.peak)?);
    prop_assert_eq!(s.reserved, classes.iter().map(|c| c.reserved).sum::<u64>());
    prop_assert_eq!(s.leased, classes.iter().map(|c| c.leased).sum::<u64>());
    prop_assert_eq!(s.quarantined, classes.iter().map(|c| c.quarantined).sum::<u64>());
    prop_assert_eq!(s.used, s.reserved + s.leased + s.quarantined, "ledger does not balance");
    prop_assert_eq!(s.pressure, m.pressure);
    prop_assert_eq!(s.holders, m.holders.iter().filter(|h| h.registered).count());
    prop_assert_eq!((s.waits, s.wait_timeouts), (0, 0));
    for h in &m.holders {
        let hs = pool.holder_stats(h.id).expect("holder stats");
        let want = m.stats.get(&Some(h.id)).copied().unwrap_or_default();
        let want = derived(&want, &h.class_pressure, &hs.classes, s.peak)?;
        prop_assert_eq!(hs.classes, want, "holder {}", h.id);
        prop_assert_eq!(hs.registered, h.registered);
        prop_assert_eq!(hs.priority, h.priority);
        prop_assert_eq!(hs.pressure, h.pressure);
    }
    Ok(())
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let g = Governor::new();
    let pool = g.pool(g.create_pool("model", CAP).unwrap()).unwrap();
    let leases: Arc<Mutex<Vec<Lease>>> = Arc::default();
    let mut regs: Vec<Option<HolderRegistration>> = Vec::new();
    let mut grants: Vec<Grant<'_>> = Vec::new();
    let mut m = Model::default();

    for op in ops {
        match op {
            Op::Reserve { bytes, class, holder } => {
                let h = holder.and_then(|i| m.holders.get(i % m.holders.len().max(1)).map(|h| h.id));
                let cls = AllocationClass::ALL[class];
                let t = Tok { bytes, class, holder: h };
                match pool.try_reserve(bytes, cls, h) {
                    Ok(r) => {
                        prop_assert!(m.registered(h));
                        prop_assert!(m.grant(t), "granted, model says no room");
                        grants.push(r);
                        m.grants.push(t);
                    }
                    Err(GovernorError::UnknownHolder { .. }) => prop_assert!(!m.registered(h)),
                    Err(GovernorError::OutOfBudget(o)) => {
                        prop_assert!(m.registered(h));
                        prop_assert!(m.used + bytes > CAP, "refused, model says room");
                        m.cs(h, class).failures += 1;
                        prop_assert_eq!(o.requested, bytes);
                        prop_assert_eq!(o.snapshot.used, m.used);
                    }
                    Err(e) => prop_assert!(false, "unexpected {e}"),
                }
            }
            Op::Pressure { bytes, class, holder } => {
                let h = holder.and_then(|i| m.holders.get(i % m.holders.len().max(1)).map(|h| h.id));
                let cls = AllocationClass::ALL[class];
                let t = Tok { bytes, class, holder: h };
                // Model first: decide the outcome and which leases holders release.
                let expect: Result<(), bool> = if !m.registered(h) {
                    Err(false)
                } else if m.grant(t) {
                    Ok(())
                } else if bytes > CAP {
                    m.cs(h, class).failures += 1;
                    Err(true)
                } else {
                    let prio = h.map_or(Priority::HIGHEST, |h| {
                        m.holders.iter().find(|x| x.id == h).unwrap().priority
                    });
                    let mut order: Vec<usize> = (0..m.holders.len())
                        .filter(|&i| {
                            let x = &m.holders[i];
                            x.registered && Some(x.id) != h && x.priority <= prio
                        })
                        .collect();
                    order.sort_by_key(|&i| (m.holders[i].priority, i));
                    let mut done = false;
                    for i in order {
                        let wanted = bytes - (CAP - m.used);
                        let (id, generous) = (m.holders[i].id, m.holders[i].generous);
                        let answer = if generous {
                            let picked = generous_pick(&m.leases, id, wanted);
                            let mut freed = 0;
                            for &j in picked.iter().rev() {
                                let t = m.leases.remove(j);
                                freed += t.bytes;
                                m.release(t);
                            }
                            freed
                        } else {
                            0
                        };
                        let h = &mut m.holders[i];
                        let (hp, hcp) = (&mut h.pressure, &mut h.class_pressure[class]);
                        for p in [&mut m.pressure, &mut m.class_pressure[class], hp, hcp] {
                            p.tickets += 1;
                            p.bytes_wanted += wanted;
                            if answer == 0 {
                                p.zero_answers += 1;
                            } else {
                                p.bytes_answered += answer;
                            }
                        }
                        if m.grant(t) {
                            done = true;
                            break;
                        }
                    }
                    if done {
                        Ok(())
                    } else {
                        m.cs(h, class).failures += 1;
                        Err(true)
                    }
                };
                match (pool.reserve(bytes, cls, h, None), expect) {
                    (Ok(r), Ok(())) => {
                        grants.push(r);
                        m.grants.push(t);
                    }
                    (Err(GovernorError::UnknownHolder { .. }), Err(false)) => {}
                    (Err(GovernorError::OutOfBudget(o)), Err(true)) => {
                        prop_assert_eq!(o.snapshot.used, m.used);
                        prop_assert_eq!(o.snapshot.pressure, m.pressure);
                    }
                    (got, want) => {
                        prop_assert!(false, "reserve: got {:?}, model {:?}", got.map(|_| ()), want)
                    }
                }
            }
            Op::Commit { res, num } => {
                if grants.is_empty() {
                    continue;
                }
                let i = res % grants.len();
                let r = grants.remove(i);
                let t = m.grants.remove(i);
                let actual = t.bytes * u64::from(num) / 255;
                let l = r.commit(actual).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(tok(&l), Tok { bytes: actual, ..t });
                let c = m.cs(t.holder, t.class);
                c.reserved -= t.bytes;
                c.leased += actual;
                c.leases += 1;
                m.used -= t.bytes - actual;
                leases.lock().unwrap().push(l);
                m.leases.push(Tok { bytes: actual, ..t });
            }
            Op::CommitOver { res, extra } => {
                if grants.is_empty() {
                    continue;
                }
                let i = res % grants.len();
                let r = grants.remove(i);
                let t = m.grants[i];
                match r.commit(t.bytes + extra) {
                    Ok(l) => {
                        prop_assert!(m.charge(extra), "over-commit granted, model says no room");
                        m.grants.remove(i);
                        let c = m.cs(t.holder, t.class);
                        c.reserved -= t.bytes;
                        c.leased += t.bytes + extra;
                        c.granted_bytes += extra;
                        c.leases += 1;
                        leases.lock().unwrap().push(l);
                        m.leases.push(Tok { bytes: t.bytes + extra, ..t });
                    }
                    Err(rej) => {
                        prop_assert!(m.used + extra > CAP, "over-commit refused, model says room");
                        prop_assert!(matches!(rej.error, GovernorError::OutOfBudget(_)));
                        m.cs(t.holder, t.class).failures += 1;
                        grants.insert(i, rej.into_inner());
                    }
                }
            }
            Op::DropGrant { res } => {
                if grants.is_empty() {
                    continue;
                }
                let i = res % grants.len();
                drop(grants.remove(i));
                let t = m.grants.remove(i);
                m.cs(t.holder, t.class).reserved -= t.bytes;
                m.used -= t.bytes;
            }
            Op::Grow { lease, bytes, num } => {
                let mut v = leases.lock().unwrap();
                if v.is_empty() {
                    continue;
                }
                let i = lease % v.len();
                let t = m.leases[i];
                let g = Tok { bytes, ..t };
                match pool.try_reserve(bytes, AllocationClass::ALL[t.class], t.holder) {
                    Ok(r) => {
                        prop_assert!(m.registered(t.holder) && m.grant(g));
                        let actual = bytes * u64::from(num) / 255;
                        r.commit_into(&mut v[i], actual).map_err(|e| TestCaseError::fail(e.to_string()))?;
                        let c = m.cs(t.holder, t.class);
                        c.reserved -= bytes;
                        c.leased += actual;
                        m.used -= bytes - actual;
                        m.leases[i].bytes += actual;
                        prop_assert_eq!(tok(&v[i]), m.leases[i]);
                    }
                    Err(GovernorError::UnknownHolder { .. }) => prop_assert!(!m.registered(t.holder)),
                    Err(GovernorError::OutOfBudget(_)) => {
                        prop_assert!(m.registered(t.holder) && m.used + bytes > CAP);
                        m.cs(t.holder, t.class).failures += 1;
                    }
                    Err(e) => prop_assert!(false, "unexpected {e}"),
                }
            }
            Op::Shrink { lease, num } | Op::QuarantinePart { lease, num } => {
                let mut v = leases.lock().unwrap();
                if v.is_empty() {
                    continue;
                }
                let i = lease % v.len();
                let t = m.leases[i];
                let k = t.bytes * u64::from(num) / 255;
                if matches!(op, Op::Shrink { .. }) {
                    pool.release_part(&mut v[i], k).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    m.cs(t.holder, t.class).leased -= k;
                    m.used -= k;
                } else {
                    pool.quarantine_part(&mut v[i], k).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let c = m.cs(t.holder, t.class);
                    c.leased -= k;
                    c.quarantined += k;
                    c.quarantines += 1;
                }
                m.leases[i].bytes -= k;
                prop_assert_eq!(tok(&v[i]), m.leases[i]);
            }
            Op::OverRelease { lease } => {
                let mut v = leases.lock().unwrap();
                if v.is_empty() {
                    continue;
                }
                let i = lease % v.len();
                let held = v[i].bytes();
                let e = pool.release_part(&mut v[i], held + 1).unwrap_err();
                prop_assert_eq!(e, GovernorError::OverRelease { requested: held + 1, held });
            }
            Op::Split { lease, num } => {
                let mut v = leases.lock().unwrap();
                if v.is_empty() {
                    continue;
                }
                let i = lease % v.len();
                let t = m.leases[i];
                let k = t.bytes * u64::from(num) / 255;
                let part = pool.split_lease(&mut v[i], k).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(tok(&part), Tok { bytes: k, ..t });
                m.leases[i].bytes -= k;
                prop_assert_eq!(tok(&v[i]), m.leases[i]);
                m.cs(t.holder, t.class).leases += 1;
                v.push(part);
                m.leases.push(Tok { bytes: k, ..t });
            }
            Op::Release { lease } | Op::Quarantine { lease } | Op::Leak { lease } => {
                let l = {
                    let mut v = leases.lock().unwrap();
                    if v.is_empty() {
                        continue;
                    }
                    let i = lease % v.len();
                    let t = m.leases.remove(i);
                    let l = v.remove(i);
                    prop_assert_eq!(tok(&l), t);
                    l
                };
                let t = tok(&l);
                match op {
                    Op::Release { .. } => {
                        pool.release(l).map_err(|e| TestCaseError::fail(e.to_string()))?;
                        m.release(t);
                    }
                    Op::Quarantine { .. } => {
                        pool.quarantine(l).map_err(|e| TestCaseError::fail(e.to_string()))?;
                        let c = m.cs(t.holder, t.class);
                        c.leased -= t.bytes;
                        c.leases -= 1;
                        c.quarantined += t.bytes;
                        c.quarantines += 1;
                    }
                    _ => {
                        drop(l);
                        let c = m.cs(t.holder, t.class);
                        c.leaked_leases += 1;
                        c.leaked_bytes += t.bytes;
                    }
                }
            }
            Op::Register { priority, generous } => {
                let me: Arc<OnceLock<HolderId>> = Arc::default();
                let (me2, leases2, weak): (_, _, Weak<Pool>) =
                    (me.clone(), leases.clone(), Arc::downgrade(&pool));
                let reg = pool.register_holder("h", Priority(priority), move |t: &PressureTicket| {
                    if !generous {
                        return 0;
                    }
                    let (Some(pool), Some(&id)) = (weak.upgrade(), me2.get()) else {
                        return 0;
                    };
                    let mut v = leases2.lock().unwrap();
                    let toks: Vec<Tok> = v.iter().map(tok).collect();
                    let mut freed = 0;
                    for j in generous_pick(&toks, id, t.bytes_wanted).into_iter().rev() {
                        let l = v.remove(j);
                        freed += l.bytes();
                        pool.release(l).unwrap();
                    }
                    freed
                });
                me.set(reg.id()).unwrap();
                m.holders.push(MHolder {
                    id: reg.id(),
                    priority: Priority(priority),
                    generous,
                    registered: true,
                    pressure: PressureStats::default(),
                    class_pressure: Default::default(),
                });
                regs.push(Some(reg));
            }
            Op::Unregister { holder } => {
                if regs.is_empty() {
                    continue;
                }
                let i = holder % regs.len();
                if let Some(reg) = regs[i].take() {
                    drop(reg);
                    m.holders[i].registered = false;
                }
            }
        }
        check(&pool, &m)?;
    }

    // Teardown: end everything the ordinary way.
    grants.clear();
    for t in m.grants.drain(..) {
        let c = m.stats.get_mut(&t.holder).unwrap();
        c[t.class].reserved -= t.bytes;
        m.used -= t.bytes;
    }
    let all: Vec<Lease> = leases.lock().unwrap().drain(..).collect();
    for l in all {
        let t = tok(&l);
        pool.release(l).unwrap();
        m.release(t);
    }
    m.leases.clear();
    drop(regs);
    for h in &mut m.holders {
        h.registered = false;
    }
    check(&pool, &m)?;

    // Everything is zero but quarantine and the leaked leases' charge.
    let s = pool.snapshot();
    let leaked: u64 = s.classes.iter().map(|c| c.leaked_bytes).sum();
    let quarantined: u64 = m.pool_classes().iter().map(|c| c.quarantined).sum();
    prop_assert_eq!(s.reserved, 0);
    prop_assert_eq!(s.quarantined, quarantined);
    prop_assert_eq!(s.leased, leaked);
    prop_assert_eq!(s.used, quarantined + leaked);
    let live_leases: u64 = s.classes.iter().map(|c| c.leases).sum();
    let leaked_leases: u64 = s.classes.iter().map(|c| c.leaked_leases).sum();
    prop_assert_eq!(live_leases, leaked_leases);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Invariants 2, 5 and 7 against the reference model.
    #[test]
    fn governor_matches_reference_model(ops in proptest::collection::vec(op(), 1..80)) {
        run(ops)?;
    }
}

/// A fixed sequence touching every operation, so a model regression shows
/// up even if the random cases happen to miss a path.
#[test]
fn scripted_sequence_matches_model() {
    use Op::*;
    let ops = vec![
        Register { priority: 1, generous: true },
        Register { priority: 0, generous: false },
        Reserve { bytes: 300, class: 1, holder: Some(0) },
        Commit { res: 0, num: 255 },
        Reserve { bytes: 300, class: 1, holder: Some(0) },
        Commit { res: 0, num: 128 },
        Reserve { bytes: 400, class: 2, holder: Some(1) },
        Commit { res: 0, num: 255 },
        Reserve { bytes: 200, class: 0, holder: None },
        CommitOver { res: 0, extra: 200 },
        Pressure { bytes: 500, class: 3, holder: None },
        Grow { lease: 0, bytes: 50, num: 255 },
        Shrink { lease: 0, num: 100 },
        QuarantinePart { lease: 0, num: 10 },
        OverRelease { lease: 0 },
        Split { lease: 0, num: 100 },
        Quarantine { lease: 1 },
        Leak { lease: 0 },
        Unregister { holder: 0 },
        Reserve { bytes: 1, class: 4, holder: Some(0) },
        DropGrant { res: 0 },
        Release { lease: 0 },
    ];
    run(ops).unwrap();
}

// ----- trees of pools ---------------------------------------------------------
//
// Random charges, commits of more and less, growth, partial refunds,
// quarantines, releases and capacity changes on a two- or three-level tree
// (root > {a, b}, and a grandchild under a), against a reference model:
// after every step each level's `used` equals the sum of what is charged
// in its subtree, never exceeds its capacity, its own figures and its
// children's share match, refusals name the first short level (leaf to
// root) and change nothing, and at the end every level is back to its
// quarantine.

#[derive(Debug, Clone)]
enum TreeOp {
    Reserve { pool: usize, bytes: u64 },
    Commit { grant: usize, num: u8 },
    CommitOver { grant: usize, extra: u64 },
    DropGrant { grant: usize },
    Grow { lease: usize, bytes: u64, num: u8 },
    Shrink { lease: usize, num: u8 },
    QuarantinePart { lease: usize, num: u8 },
    Release { lease: usize },
    Quarantine { lease: usize },
    SetCapacity { pool: usize, capacity: u64 },
}

fn tree_op() -> impl Strategy<Value = TreeOp> {
    let bytes = prop_oneof![0u64..=16, 0u64..=400, 300u64..=1200];
    let pool = 0usize..4;
    prop_oneof![
        8 => (pool.clone(), bytes.clone()).prop_map(|(pool, bytes)| TreeOp::Reserve { pool, bytes }),
        5 => (any::<usize>(), any::<u8>()).prop_map(|(grant, num)| TreeOp::Commit { grant, num }),
        2 => (any::<usize>(), 1u64..=400).prop_map(|(grant, extra)| TreeOp::CommitOver { grant, extra }),
        2 => any::<usize>().prop_map(|grant| TreeOp::DropGrant { grant }),
        2 => (any::<usize>(), bytes, any::<u8>()).prop_map(|(lease, bytes, num)| TreeOp::Grow { lease, bytes, num }),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(lease, num)| TreeOp::Shrink { lease, num }),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(lease, num)| TreeOp::QuarantinePart { lease, num }),
        4 => any::<usize>().prop_map(|lease| TreeOp::Release { lease }),
        1 => any::<usize>().prop_map(|lease| TreeOp::Quarantine { lease }),
        3 => (pool, prop_oneof![0u64..=200, 0u64..=2500]).prop_map(|(pool, capacity)| TreeOp::SetCapacity { pool, capacity }),
    ]
}

/// A token of the tree model: the pool it was made on, and its bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
struct TTok {
    pool: usize,
    bytes: u64,
}

/// Per pool: parent, capacity, own charges by kind, peak.
#[derive(Default)]
struct TreeModel {
    parent: Vec<Option<usize>>,
    cap: Vec<u64>,
    reserved: Vec<u64>,
    leased: Vec<u64>,
    quarantined: Vec<u64>,
    peak: Vec<u64>,
    failures: Vec<u64>,
    grants: Vec<TTok>,
    leases: Vec<TTok>,
}

impl TreeModel {
    fn own(&self, i: usize) -> u64 {
        self.reserved[i] + self.leased[i] + self.quarantined[i]
    }

    /// Everything charged at level `i`: its own and its descendants'.
    fn used(&self, i: usize) -> u64 {
        (0..self.cap.len()).filter(|&j| self.path(j).contains(&i)).map(|j| self.own(j)).sum()
    }

    /// `i`, then its ancestors, the root last.
    fn path(&self, i: usize) -> Vec<usize> {
        let mut v = vec![i];
        while let Some(p) = self.parent[*v.last().unwrap()] {
            v.push(p);
        }
        v
    }

    /// The first level (leaf to root) where `bytes` more do not fit.
    fn short(&self, i: usize, bytes: u64) -> Option<usize> {
        self.path(i).into_iter().find(|&k| self.used(k) + bytes > self.cap[k])
    }

    /// Charges `bytes` more at pool `i` (already checked to fit) and
    /// updates the peaks.
    fn charged(&mut self, i: usize, kind: fn(&mut TreeModel) -> &mut Vec<u64>, bytes: u64) {
        kind(self)[i] += bytes;
        for k in self.path(i) {
            self.peak[k] = self.peak[k].max(self.used(k));
        }
    }
}

fn check_tree(pools: &[Arc<Pool>], m: &TreeModel) -> Result<(), TestCaseError> {
    for (i, p) in pools.iter().enumerate() {
        let s = p.snapshot();
        let used = m.used(i);
        prop_assert!(s.used <= s.capacity, "level {i} over capacity: {}", s);
        prop_assert_eq!((s.used, s.capacity, s.free), (used, m.cap[i], m.cap[i] - used), "level {}", i);
        prop_assert_eq!(p.used_and_capacity(), (used, m.cap[i]));
        prop_assert_eq!(s.peak, m.peak[i], "peak of level {}", i);
        prop_assert_eq!(
            (s.reserved, s.leased, s.quarantined),
            (m.reserved[i], m.leased[i], m.quarantined[i])
        );
        let children: Vec<usize> = (0..pools.len()).filter(|&j| m.parent[j] == Some(i)).collect();
        prop_assert_eq!(s.children, children.len());
        prop_assert_eq!(s.children_used, children.iter().map(|&j| m.used(j)).sum::<u64>());
        prop_assert_eq!(s.own_used(), m.own(i), "own charges of level {}", i);
        prop_assert_eq!(s.parent, m.parent[i].map(|j| pools[j].id()));
        prop_assert_eq!(s.depth, m.path(i).len() - 1);
        prop_assert_eq!(s.totals().failures, m.failures[i]);
    }
    Ok(())
}

fn run_tree(three_levels: bool, caps: [u64; 4], ops: Vec<TreeOp>) -> Result<(), TestCaseError> {
    let g = Governor::new();
    let root = g.pool(g.create_pool("root", caps[0]).unwrap()).unwrap();
    let a = g.pool(g.create_child_pool("a", &root, caps[1]).unwrap()).unwrap();
    let b = g.pool(g.create_child_pool("b", root.id(), caps[2]).unwrap()).unwrap();
    let mut pools = vec![root, a, b];
    let mut parent = vec![None, Some(0), Some(0)];
    if three_levels {
        pools.push(g.pool(g.create_child_pool("a.0", &pools[1], caps[3]).unwrap()).unwrap());
        parent.push(Some(1));
    }
    let n = pools.len();
    let mut m = TreeModel {
        parent,
        cap: caps[..n].to_vec(),
        reserved: vec![0; n],
        leased: vec![0; n],
        quarantined: vec![0; n],
        peak: vec![0; n],
        failures: vec![0; n],
        ..TreeModel::default()
    };
    let mut grants: Vec<Grant<'_>> = Vec::new();
    let mut leases: Vec<Lease> = Vec::new();
    let tt = |l: &Lease, pool: usize| TTok { pool, bytes: l.bytes() };
    let refused =
        |o: &memplug_host::governor::OutOfBudget, m: &TreeModel, i: usize, short: usize, bytes: u64| {
            prop_assert_eq!(o.requested, bytes);
            prop_assert_eq!(o.requested_pool(), pools[i].id());
            prop_assert_eq!(o.short_pool(), pools[short].id());
            prop_assert_eq!(o.short_level(), m.path(i).iter().position(|&k| k == short).unwrap());
            prop_assert_eq!(o.path.pools.len(), m.path(i).len());
            prop_assert_eq!(o.snapshot.used, m.used(short));
            Ok(())
        };
    check_tree(&pools, &m)?;
    for op in ops {
        match op {
            TreeOp::Reserve { pool, bytes } => {
                let i = pool % n;
                match (pools[i].try_reserve(bytes, AllocationClass::Kv, None), m.short(i, bytes)) {
                    (Ok(r), None) => {
                        m.charged(i, |m| &mut m.reserved, bytes);
                        grants.push(r);
                        m.grants.push(TTok { pool: i, bytes });
                    }
                    (Err(GovernorError::OutOfBudget(o)), Some(short)) => {
                        refused(&o, &m, i, short, bytes)?;
                        m.failures[i] += 1;
                    }
                    (got, want) => prop_assert!(
                        false,
                        "reserve {bytes} in {i}: got {:?}, model {want:?}",
                        got.map(|_| ())
                    ),
                }
            }
            TreeOp::Commit { grant, num } => {
                if grants.is_empty() {
                    continue;
                }
                let k = grant % grants.len();
                let (r, t) = (grants.remove(k), m.grants.remove(k));
                let actual = t.bytes * u64::from(num) / 255;
                let l = r.commit(actual).map_err(|e| TestCaseError::fail(e.to_string()))?;
                m.reserved[t.pool] -= t.bytes;
                m.leased[t.pool] += actual;
                prop_assert_eq!(tt(&l, t.pool), TTok { bytes: actual, ..t });
                leases.push(l);
                m.leases.push(TTok { bytes: actual, ..t });
            }
            TreeOp::CommitOver { grant, extra } => {
                if grants.is_empty() {
                    continue;
                }
                let k = grant % grants.len();
                let (r, t) = (grants.remove(k), m.grants[k]);
                match (r.commit(t.bytes + extra), m.short(t.pool, extra)) {
                    (Ok(l), None) => {
                        m.grants.remove(k);
                        m.reserved[t.pool] -= t.bytes;
                        m.charged(t.pool, |m| &mut m.leased, t.bytes + extra);
                        leases.push(l);
                        m.leases.push(TTok { bytes: t.bytes + extra, ..t });
                    }
                    (Err(rej), Some(short)) => {
                        let Some(o) = rej.error.out_of_budget() else {
                            return Err(TestCaseError::fail(rej.error.to_string()));
                        };
                        refused(o, &m, t.pool, short, extra)?;
                        m.failures[t.pool] += 1;
                        grants.insert(k, rej.into_inner());
                    }
                    (got, want) => {
                        prop_assert!(false, "over-commit: got {:?}, model {want:?}", got.map(|_| ()))
                    }
                }
            }
            TreeOp::DropGrant { grant } => {
                if grants.is_empty() {
                    continue;
                }
                let k = grant % grants.len();
                drop(grants.remove(k));
                let t = m.grants.remove(k);
                m.reserved[t.pool] -= t.bytes;
            }
            TreeOp::Grow { lease, bytes, num } => {
                if leases.is_empty() {
                    continue;
                }
                let k = lease % leases.len();
                let t = m.leases[k];
                match (pools[t.pool].try_reserve(bytes, AllocationClass::Kv, None), m.short(t.pool, bytes)) {
                    (Ok(r), None) => {
                        m.charged(t.pool, |m| &mut m.reserved, bytes);
                        let actual = bytes * u64::from(num) / 255;
                        r.commit_into(&mut leases[k], actual)
                            .map_err(|e| TestCaseError::fail(e.to_string()))?;
                        m.reserved[t.pool] -= bytes;
                        m.leased[t.pool] += actual;
                        m.leases[k].bytes += actual;
                        prop_assert_eq!(tt(&leases[k], t.pool), m.leases[k]);
                    }
                    (Err(GovernorError::OutOfBudget(o)), Some(short)) => {
                        refused(&o, &m, t.pool, short, bytes)?;
                        m.failures[t.pool] += 1;
                    }
                    (got, want) => prop_assert!(false, "grow: got {:?}, model {want:?}", got.map(|_| ())),
                }
            }
            TreeOp::Shrink { lease, num } | TreeOp::QuarantinePart { lease, num } => {
                if leases.is_empty() {
                    continue;
                }
                let k = lease % leases.len();
                let t = m.leases[k];
                let part = t.bytes * u64::from(num) / 255;
                let p = &pools[t.pool];
                if matches!(op, TreeOp::Shrink { .. }) {
                    p.release_part(&mut leases[k], part).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    m.leased[t.pool] -= part;
                } else {
                    p.quarantine_part(&mut leases[k], part)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    m.leased[t.pool] -= part;
                    m.quarantined[t.pool] += part;
                }
                m.leases[k].bytes -= part;
                prop_assert_eq!(tt(&leases[k], t.pool), m.leases[k]);
            }
            TreeOp::Release { lease } | TreeOp::Quarantine { lease } => {
                if leases.is_empty() {
                    continue;
                }
                let k = lease % leases.len();
                let (l, t) = (leases.remove(k), m.leases.remove(k));
                prop_assert_eq!(tt(&l, t.pool), t);
                let p = &pools[t.pool];
                m.leased[t.pool] -= t.bytes;
                if matches!(op, TreeOp::Release { .. }) {
                    p.release(l).map_err(|e| TestCaseError::fail(e.to_string()))?;
                } else {
                    p.quarantine(l).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    m.quarantined[t.pool] += t.bytes;
                }
            }
            TreeOp::SetCapacity { pool, capacity } => {
                let i = pool % n;
                let live = m.used(i);
                match pools[i].set_capacity(capacity) {
                    Ok(()) => {
                        prop_assert!(capacity >= live, "lowered to {capacity} below {live} live");
                        m.cap[i] = capacity;
                    }
                    Err(GovernorError::CapacityBelowLive { requested, live: l, capacity: kept, .. }) => {
                        prop_assert!(capacity < live, "refused {capacity} with {live} live");
                        prop_assert_eq!((requested, l, kept), (capacity, live, m.cap[i]));
                    }
                    Err(e) => prop_assert!(false, "set_capacity: {e}"),
                }
            }
        }
        check_tree(&pools, &m)?;
    }

    // Teardown: everything ends the ordinary way; only quarantine stays.
    drop(grants);
    for t in m.grants.drain(..) {
        m.reserved[t.pool] -= t.bytes;
    }
    for (l, t) in leases.into_iter().zip(m.leases.drain(..)) {
        pools[t.pool].release(l).unwrap();
        m.leased[t.pool] -= t.bytes;
    }
    check_tree(&pools, &m)?;
    for (i, p) in pools.iter().enumerate() {
        let s = p.snapshot();
        prop_assert_eq!((s.reserved, s.leased), (0, 0));
        let quarantined: u64 = (0..n).filter(|&j| m.path(j).contains(&i)).map(|j| m.quarantined[j]).sum();
        prop_assert_eq!(s.used, quarantined, "level {} after teardown", i);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Every level of a tree of pools against the reference model.
    #[test]
    fn pool_trees_match_reference_model(
        three_levels in any::<bool>(),
        caps in [0u64..=2048, 0u64..=1500, 0u64..=1500, 0u64..=1200],
        ops in proptest::collection::vec(tree_op(), 1..80),
    ) {
        run_tree(three_levels, caps, ops)?;
    }
}

/// A fixed tree sequence touching every operation (a refusal at each level,
/// a refused and an accepted lowering, an over-subscribed child).
#[test]
fn scripted_tree_sequence_matches_model() {
    use TreeOp::*;
    // root 950 > {a 400 > {a.0 500}, b 700}.
    let ops = vec![
        Reserve { pool: 3, bytes: 300 },
        Commit { grant: 0, num: 255 }, // a.0 300, a 300, root 300
        Reserve { pool: 2, bytes: 500 },
        CommitOver { grant: 0, extra: 100 },    // b 600, root 900
        Reserve { pool: 1, bytes: 401 },        // short at a (level 0)
        Reserve { pool: 3, bytes: 201 },        // short at a.0 (level 0)
        Reserve { pool: 3, bytes: 101 },        // short at a (level 1)
        Reserve { pool: 3, bytes: 60 },         // short at the root (level 2)
        Reserve { pool: 1, bytes: 60 },         // short at the root (level 1)
        SetCapacity { pool: 0, capacity: 800 }, // below the 900 live: refused
        SetCapacity { pool: 0, capacity: 900 }, // to what is live: accepted
        Grow { lease: 0, bytes: 50, num: 200 }, // short at the root
        Shrink { lease: 0, num: 100 },
        QuarantinePart { lease: 1, num: 10 },
        Reserve { pool: 0, bytes: 10 },
        Grow { lease: 0, bytes: 50, num: 200 },
        DropGrant { grant: 0 },
        SetCapacity { pool: 3, capacity: 5000 }, // over-subscribed child
        CommitOver { grant: 0, extra: 1 },
        Quarantine { lease: 0 },
        Release { lease: 0 },
        SetCapacity { pool: 1, capacity: 0 },
    ];
    run_tree(true, [950, 400, 700, 500], ops).unwrap();
}
