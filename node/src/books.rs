//! The authority's books: per device, its capacity and what is leased to
//! whom. Pure data, no I/O, so the protocol's rules can be checked by a
//! model test: at every moment, each device's `leased` is the sum of its
//! members' leases, and a lease is only granted from what is free.

use crate::wire::{ClassMask, Declared, ALL_CLASSES};
use std::collections::BTreeMap;

/// A member's id: one connection's, for its life.
pub type MemberId = u64;

/// One device the authority governs.
#[derive(Clone, Debug, Default)]
pub struct Device {
    pub capacity: u64,
    /// The sum of every member's lease on it.
    pub leased: u64,
}

/// A process that joined.
#[derive(Clone, Debug, Default)]
pub struct Member {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
    /// False once its connection closed while the process still lived: its
    /// leases stay counted until it dies or joins again (nothing is freed
    /// on a guess).
    pub connected: bool,
    /// Whether its liveness is watched through a pidfd (false: through
    /// `/proc`, the fallback; see `peer.rs`).
    pub pidfd: bool,
    pub leased: BTreeMap<String, u64>,
    pub priority: BTreeMap<String, u32>,
    /// The classes of memory it declared on each device (a [`ClassMask`];
    /// 0 at join is stored as [`ALL_CLASSES`]): only requests of those
    /// classes press it (`victims`).
    pub classes: BTreeMap<String, ClassMask>,
    pub tickets_received: u64,
    pub tickets_answered: u64,
    pub tickets_skipped: u64,
    pub bytes_released: u64,
    pub leases_granted: u64,
    pub leases_refused: u64,
}

/// The bit of `class` (an `AllocationClass` discriminant) in a
/// [`ClassMask`]: an unknown class is `Other`'s, as the link reads it.
pub fn class_bit(class: u8) -> ClassMask {
    use memplug_host::governor::AllocationClass;
    1 << AllocationClass::from_u8_lossy(class) as u8
}

/// The books.
#[derive(Clone, Debug, Default)]
pub struct Books {
    pub chunk: u64,
    pub devices: BTreeMap<String, Device>,
    pub members: BTreeMap<MemberId, Member>,
    /// The most bytes (all devices) each user id may lease.
    pub quotas: BTreeMap<u32, u64>,
    /// The most bytes (all devices) the members of each group id may lease
    /// together.
    pub group_quotas: BTreeMap<u32, u64>,
}

impl Books {
    pub fn new(chunk: u64, devices: &[(String, u64)], quotas: &[(u32, u64)]) -> Books {
        Books {
            chunk,
            devices: devices.iter().map(|(n, c)| (n.clone(), Device { capacity: *c, leased: 0 })).collect(),
            members: BTreeMap::new(),
            quotas: quotas.iter().copied().collect(),
            group_quotas: BTreeMap::new(),
        }
    }

    /// Free bytes of `device` (0 when over-committed after a rejoin).
    pub fn free(&self, device: &str) -> u64 {
        self.devices.get(device).map_or(0, |d| d.capacity.saturating_sub(d.leased))
    }

    fn device(&self, device: &str) -> Result<&Device, String> {
        self.devices.get(device).ok_or_else(|| {
            let known: Vec<&str> = self.devices.keys().map(String::as_str).collect();
            format!("no device {device:?} here (this node governs {})", known.join(", "))
        })
    }

    /// A member joins, declaring its priority and classes on each device
    /// and what it already holds there (a rejoin after the authority
    /// restarted): those bytes are counted even past the capacity (they
    /// are in use; the node is then over-committed and leases nothing more
    /// until enough comes back). A class mask with bits past the last
    /// class is refused.
    pub fn join(
        &mut self,
        id: MemberId,
        pid: i32,
        (uid, gid): (u32, u32),
        declared: &[Declared],
    ) -> Result<(), String> {
        for d in declared {
            self.device(&d.device)?;
            if d.classes & !ALL_CLASSES != 0 {
                return Err(format!(
                    "device {:?}: classes {:#04x} name no class (bits 0-4: weights, kv, activations, workspace, other)",
                    d.device, d.classes
                ));
            }
        }
        let mut m = Member { pid, uid, gid, connected: true, ..Member::default() };
        for d in declared {
            m.priority.insert(d.device.clone(), d.priority);
            let classes = if d.classes == 0 { ALL_CLASSES } else { d.classes };
            m.classes.insert(d.device.clone(), classes);
            if d.holding > 0 {
                m.leased.insert(d.device.clone(), d.holding);
                self.devices.get_mut(&d.device).expect("checked").leased += d.holding;
            }
        }
        self.members.insert(id, m);
        Ok(())
    }

    /// Why a lease of `min..want` bytes of `device` by `id` could never be
    /// granted, whatever is free (an unknown device, one not declared, a
    /// malformed or impossible size).
    pub fn malformed_lease(&self, id: MemberId, device: &str, min: u64, want: u64) -> Result<(), String> {
        let dev = self.device(device)?;
        let member = self.members.get(&id).ok_or("not joined")?;
        if !member.priority.contains_key(device) {
            return Err(format!("device {device:?} was not declared when joining"));
        }
        if min == 0 || min > want {
            return Err(format!("a lease of {min}..{want} bytes is malformed"));
        }
        if min > dev.capacity {
            return Err(format!("{min} B is more than device {device:?} has ({} B)", dev.capacity));
        }
        Ok(())
    }

    /// Leases between `min` and `want` bytes of `device` to `id` from what
    /// is free (in whole chunks where it can), or says why not.
    pub fn lease(&mut self, id: MemberId, device: &str, min: u64, want: u64) -> Result<u64, String> {
        self.malformed_lease(id, device, min, want)?;
        let free = self.free(device);
        let dev = self.device(device)?;
        let member = self.members.get(&id).ok_or("not joined")?;
        let capacity = dev.capacity;
        let mut room = free;
        // The quotas that bind, as words for a refusal.
        let mut capped = Vec::new();
        let leased_by = |same: &dyn Fn(&Member) -> bool| -> u64 {
            self.members.values().filter(|m| same(m)).flat_map(|m| m.leased.values()).sum()
        };
        if let Some(&quota) = self.quotas.get(&member.uid) {
            let left = quota.saturating_sub(leased_by(&|m| m.uid == member.uid));
            room = room.min(left);
            capped.push(format!("user {}'s quota leaves {left} B of {quota} B", member.uid));
        }
        if let Some(&quota) = self.group_quotas.get(&member.gid) {
            let left = quota.saturating_sub(leased_by(&|m| m.gid == member.gid));
            room = room.min(left);
            capped.push(format!("group {}'s quota leaves {left} B of {quota} B", member.gid));
        }
        if room < min {
            let quotas = if capped.is_empty() { String::new() } else { format!("; {}", capped.join("; ")) };
            return Err(format!("{free} B of {capacity} B free on {device:?}, {min} B needed{quotas}"));
        }
        let bytes = want.min(room);
        let m = self.members.get_mut(&id).expect("looked");
        *m.leased.entry(device.to_string()).or_default() += bytes;
        m.leases_granted += 1;
        self.devices.get_mut(device).expect("looked").leased += bytes;
        Ok(bytes)
    }

    /// `id` gives back `bytes` of `device` (idle budget, or what a ticket
    /// released). More than it holds is refused and changes nothing.
    pub fn give_back(&mut self, id: MemberId, device: &str, bytes: u64) -> Result<(), String> {
        self.device(device)?;
        let m = self.members.get_mut(&id).ok_or("not joined")?;
        let held = m.leased.get(device).copied().unwrap_or(0);
        if bytes > held {
            return Err(format!("gives back {bytes} B of {device:?} but holds {held} B"));
        }
        m.leased.insert(device.to_string(), held - bytes);
        self.devices.get_mut(device).expect("checked").leased -= bytes;
        Ok(())
    }

    /// The priority a request of `requester` made at `asked` presses
    /// others with: no more than the priority the member declared for
    /// `device` (a process cannot press harder than it declared, whatever
    /// its holders' priorities inside it).
    pub fn pressing_priority(&self, requester: MemberId, device: &str, asked: u32) -> u32 {
        let declared = self.members.get(&requester).and_then(|m| m.priority.get(device).copied());
        declared.map_or(0, |d| d.min(asked))
    }

    /// Members to ask for room on `device` for `requester` pressing at
    /// `priority` for a request whose class is in `wanted` ([`class_bit`]):
    /// connected, not the requester, holding some and declared at equal or
    /// lower priority (as the governor asks holders in a process). In the
    /// order they are asked: lowest priority first; within one priority,
    /// those that declared holding memory of a wanted class before those
    /// that did not (like for like: a KV request evicts KV first); then the
    /// one holding most.
    ///
    /// Classes order, they never exclude: any memory a member gives back
    /// serves any request (an inference server's offloaded weights make
    /// room for a trainer's activations, as every holder of a pool is asked
    /// whatever the class in a process), so a member that declared no
    /// memory of the class is still asked once those that did are.
    /// Priorities are what protect memory.
    pub fn victims(
        &self,
        requester: MemberId,
        device: &str,
        priority: u32,
        wanted: ClassMask,
    ) -> Vec<MemberId> {
        let mut v: Vec<(u32, bool, u64, MemberId)> = self
            .members
            .iter()
            .filter(|(id, m)| **id != requester && m.connected)
            .filter_map(|(id, m)| {
                let held = m.leased.get(device).copied().unwrap_or(0);
                let p = m.priority.get(device).copied().unwrap_or(0);
                let unlike = m.classes.get(device).copied().unwrap_or(ALL_CLASSES) & wanted == 0;
                (held > 0 && p <= priority).then(|| (p, unlike, u64::MAX - held, *id))
            })
            .collect();
        v.sort();
        v.into_iter().map(|(_, _, _, id)| id).collect()
    }

    /// A member is gone for good (its process died): every lease it held
    /// is free again. Once: a second call finds nothing.
    pub fn reclaim(&mut self, id: MemberId) -> Option<Member> {
        let m = self.members.remove(&id)?;
        for (d, bytes) in &m.leased {
            if let Some(dev) = self.devices.get_mut(d) {
                dev.leased -= bytes;
            }
        }
        Some(m)
    }

    /// Every device's `leased` is the sum of its members' leases.
    pub fn check(&self) -> Result<(), String> {
        for (name, d) in &self.devices {
            let sum: u64 = self.members.values().map(|m| m.leased.get(name).copied().unwrap_or(0)).sum();
            if sum != d.leased {
                return Err(format!("{name}: leased {} but members hold {sum}", d.leased));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Classes at join: 0 is every class; a bit past the last is refused;
    /// within one priority, members that declared the request's class are
    /// asked first, and the others after them, never left out.
    #[test]
    fn members_of_the_requests_class_are_pressed_first_and_the_others_after() {
        let mut b = Books::new(1, &[("d".to_string(), 100)], &[]);
        let decl = |classes, holding, priority| [Declared { device: "d".into(), priority, classes, holding }];
        let why = b.join(9, 19, (0, 0), &decl(0x20, 0, 0)).unwrap_err();
        assert!(why.contains("name no class"), "{why}");
        b.join(1, 11, (0, 0), &decl(1 << 1, 10, 0)).unwrap(); // kv
        b.join(2, 12, (0, 0), &decl(0, 20, 0)).unwrap(); // undeclared: every class
        b.join(3, 13, (0, 0), &decl(1 << 0 | 1 << 4, 30, 0)).unwrap(); // weights, other
        b.join(5, 15, (0, 0), &decl(1 << 1, 40, 1)).unwrap(); // kv, at a higher priority
        b.join(4, 14, (0, 0), &decl(0, 0, 1)).unwrap();
        assert_eq!(b.members[&2].classes["d"], ALL_CLASSES);
        let v = |class| b.victims(4, "d", 1, class_bit(class));
        // Priority 0 before 1; within 0, the class's holders (most held
        // first), then the rest (most held first).
        assert_eq!(v(1), vec![2, 1, 3, 5], "kv");
        assert_eq!(v(0), vec![3, 2, 1, 5], "weights");
        assert_eq!(v(2), vec![2, 3, 1, 5], "activations: the undeclared member first, then by bytes");
        assert_eq!(v(200), vec![3, 2, 1, 5], "an unknown class is other");
        assert_eq!(b.victims(4, "d", 0, class_bit(1)), vec![2, 1, 3], "priority still protects");
    }

    /// A model run: random joins, leases, returns, ticket answers, rejoins
    /// over capacity and deaths; after every step each device's `leased`
    /// is the sum of its members' and, but for what rejoins declared, no
    /// lease took a device past its capacity.
    #[test]
    fn the_books_stay_exact_under_random_joins_leases_returns_and_deaths() {
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let devices = [("a".to_string(), 100), ("b".to_string(), 40)];
        let mut b = Books::new(4, &devices, &[(7, 60)]);
        b.group_quotas.insert(21, 90);
        let mut next = 1;
        for step in 0..20_000 {
            let ids: Vec<MemberId> = b.members.keys().copied().collect();
            let pick = |r: u64| ids.get(r as usize % ids.len().max(1)).copied();
            let dev = if rnd(2) == 0 { "a" } else { "b" };
            let before: u64 = b.devices[dev].leased;
            match rnd(6) {
                0 => {
                    let holding = if rnd(10) == 0 { rnd(30) } else { 0 };
                    let uid = if rnd(3) == 0 { 7 } else { 1 };
                    let gid = if rnd(2) == 0 { 20 } else { 21 };
                    let decl = [
                        Declared {
                            device: "a".into(),
                            priority: rnd(3) as u32,
                            classes: rnd(ALL_CLASSES as u64 + 1) as u8,
                            holding,
                        },
                        Declared { device: "b".into(), priority: 0, classes: 0, holding: 0 },
                    ];
                    b.join(next, next as i32, (uid, gid), &decl).unwrap();
                    next += 1;
                }
                1 | 2 => {
                    if let Some(id) = pick(rnd(1000)) {
                        let min = 1 + rnd(20);
                        let over = b.devices[dev].leased > b.devices[dev].capacity;
                        if let Ok(got) = b.lease(id, dev, min, min + rnd(8)) {
                            assert!(got >= min && !over, "step {step}");
                            assert!(
                                b.devices[dev].leased <= b.devices[dev].capacity,
                                "step {step}: a lease overfilled"
                            );
                        }
                    }
                }
                3 => {
                    if let Some(id) = pick(rnd(1000)) {
                        let held = b.members[&id].leased.get(dev).copied().unwrap_or(0);
                        let r = rnd(held + 3);
                        assert_eq!(b.give_back(id, dev, r).is_ok(), r <= held, "step {step}");
                    }
                }
                4 => {
                    if let Some(id) = pick(rnd(1000)) {
                        let held: u64 = b.members[&id].leased.get(dev).copied().unwrap_or(0);
                        assert!(b.reclaim(id).is_some());
                        assert!(b.reclaim(id).is_none(), "reclaimed twice");
                        assert_eq!(b.devices[dev].leased, before - held);
                    }
                }
                _ => {
                    let requester = pick(rnd(1000)).unwrap_or(0);
                    let pressing = b.pressing_priority(requester, dev, rnd(4) as u32);
                    let class = rnd(7) as u8; // 5 and 6: unknown, read as `Other`
                    let wanted = class_bit(class);
                    let victims = b.victims(requester, dev, pressing, wanted);
                    let p = |id| b.members[&id].priority.get(dev).copied().unwrap_or(0);
                    let classes = |id| b.members[&id].classes.get(dev).copied().unwrap_or(0);
                    for w in victims.windows(2) {
                        assert!(p(w[0]) <= p(w[1]), "step {step}: lowest priority first");
                        if p(w[0]) == p(w[1]) {
                            assert!(
                                classes(w[0]) & wanted != 0 || classes(w[1]) & wanted == 0,
                                "step {step}: a member without class {class} asked before one with it"
                            );
                        }
                    }
                    for v in &victims {
                        assert!(
                            p(*v) <= pressing && *v != requester,
                            "step {step}: pressed a higher priority"
                        );
                    }
                    // Everyone else who holds some at or below the
                    // priority is asked, whatever its classes.
                    for (id, m) in &b.members {
                        let held = m.leased.get(dev).copied().unwrap_or(0);
                        let eligible = *id != requester && m.connected && held > 0;
                        if eligible && p(*id) <= pressing {
                            assert!(victims.contains(id), "step {step}: member {id} left out");
                        }
                    }
                }
            }
            b.check().unwrap_or_else(|e| panic!("step {step}: {e}"));
            let quota_used: u64 =
                b.members.values().filter(|m| m.uid == 7).flat_map(|m| m.leased.values()).sum();
            let declared: u64 = 30 * b.members.values().filter(|m| m.uid == 7).count() as u64;
            assert!(quota_used <= 60 + declared, "step {step}: quota passed");
            let group_used: u64 =
                b.members.values().filter(|m| m.gid == 21).flat_map(|m| m.leased.values()).sum();
            let declared: u64 = 30 * b.members.values().filter(|m| m.gid == 21).count() as u64;
            assert!(group_used <= 90 + declared, "step {step}: group quota passed");
        }
    }

    /// A group's quota holds for its members together and says so when it
    /// refuses; a user's and a group's quota both bind (the smaller wins).
    #[test]
    fn group_quotas_bind_members_together() {
        let devices = [("d".to_string(), 1000)];
        let mut b = Books::new(1, &devices, &[(5, 30)]);
        b.group_quotas.insert(100, 50);
        let decl = [Declared { device: "d".into(), priority: 0, classes: 0, holding: 0 }];
        b.join(1, 11, (1, 100), &decl).unwrap();
        b.join(2, 12, (2, 100), &decl).unwrap();
        b.join(3, 13, (5, 100), &decl).unwrap();
        b.join(4, 14, (3, 200), &decl).unwrap();
        assert_eq!(b.lease(1, "d", 1, 40), Ok(40));
        assert_eq!(b.lease(2, "d", 1, 40), Ok(10), "the group's 50 B, less member 1's 40");
        let why = b.lease(2, "d", 1, 1).unwrap_err();
        assert!(why.contains("group 100's quota leaves 0 B of 50 B"), "{why}");
        assert_eq!(b.lease(4, "d", 1, 500), Ok(500), "another group: only the device's capacity");
        assert!(b.give_back(1, "d", 40).is_ok());
        // User 5: its own 30 B binds before the group's 50 B.
        assert_eq!(b.lease(3, "d", 1, 45), Ok(30));
        let why = b.lease(3, "d", 1, 1).unwrap_err();
        assert!(why.contains("user 5's quota leaves 0 B of 30 B"), "{why}");
        b.check().unwrap();
    }
}
