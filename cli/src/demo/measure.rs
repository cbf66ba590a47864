//! The kernel's view of the demo's memory, next to the governor's:
//! `/proc/self/pagemap` page by page over the live objects' address ranges
//! (exact), and `/proc/self/smaps` over the whole process (a delta since
//! the start, within [`PROCESS_TOLERANCE`]). After the device loss, the
//! lost objects' pages are [`Stranded`]: no longer charged, still resident.

use super::timeline::{Checks, Recorder};
use super::{mib, signed_mib, KIB, MIB};
use memplug_host::governor::{AllocationClass, Pool};
use serde::Serialize;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// Tolerance between the governor's figure and the process's resident
/// delta from smaps. The delta also holds what memplug does not govern:
/// malloc's header page in front of each weight shard (4 KiB each), the
/// CPU stream's thread stack and malloc arena, the host's own tables and
/// this timeline — measured at 40–90 KiB. 1 MiB leaves room for that on
/// other machines and is still half of the smallest governed object (a
/// 2 MiB decode step or the prefix), so a missed or doubled object fails.
pub(super) const PROCESS_TOLERANCE: u64 = MIB;

/// How the exact measurement is taken (the report's `resident_method`).
pub(super) const RESIDENT_METHOD: &str =
    "pages present in /proc/self/pagemap over each live object's address range \
     (weight shards, each region's private KV, the shared prefix once)";
/// How the process-wide measurement is taken (the report's
/// `process_method`).
pub(super) const PROCESS_METHOD: &str = "sum over /proc/self/smaps of Anonymous + Pss of memfd mappings, \
     now minus at start (whole process: includes the host's own heap and stacks)";

/// What the process holds that the governor no longer charges: the pages
/// of a lost context's objects. A real device's memory goes with the
/// device; the CPU plugin's cannot, and since the host never calls a lost
/// mechanism again, those pages stay mapped (in the lost plugin instance,
/// which stays loaded) until the process exits.
#[derive(Clone, Default)]
pub(super) struct Stranded {
    /// The lost objects' address ranges (the prefix once).
    pub(super) ranges: Vec<(u64, u64)>,
    /// Their bytes: what the lost context's settlement discharged.
    pub(super) bytes: u64,
}

/// Host copies of offloaded objects: charged to a pool of their own (the
/// host pool), resident in this process like the rest.
#[derive(Default)]
pub(super) struct HostCopies {
    /// The host pool, once the offload scene made it.
    pub(super) pool: Option<Arc<Pool>>,
    /// The live host copies' address ranges.
    pub(super) ranges: Vec<(u64, u64)>,
}

/// The governor's figures next to the kernel's, at one moment.
#[derive(Serialize)]
pub(super) struct Measurement {
    /// When it was taken (ms since the start): its `measure` event's time.
    pub(super) t_ms: f64,
    pub(super) label: String,
    pub(super) governor_used: u64,
    pub(super) governor_weights: u64,
    pub(super) governor_kv: u64,
    /// Bytes charged to the host pool (offloaded objects' host copies).
    pub(super) governor_host: u64,
    /// Pages present (pagemap) over the live weight shards.
    pub(super) resident_weights: Option<u64>,
    /// Pages present over the live KV: the prefix once, and every region's
    /// private part (including one whose free waits for a fence).
    pub(super) resident_kv: Option<u64>,
    /// Pages present over the live host copies.
    pub(super) resident_host: Option<u64>,
    /// Pages swapped out in those ranges (counted as backed, reported).
    pub(super) swapped: Option<u64>,
    /// Bytes of the lost context's objects, no longer charged ([`Stranded`]).
    pub(super) stranded: u64,
    /// Pages present (or swapped) over their ranges.
    pub(super) resident_stranded: Option<u64>,
    /// Σ smaps (Anonymous + memfd Pss) now, minus the same at the start.
    pub(super) process_delta: Option<i64>,
    /// `process_delta - governor_used - stranded`: what the process holds
    /// beyond the governed and the stranded bytes.
    pub(super) process_excess: Option<i64>,
    pub(super) exact_ok: bool,
    pub(super) process_ok: bool,
}

/// Resident memory as the kernel reports it.
pub(super) struct Kernel {
    pagemap: Result<File, String>,
    /// The page size the kernel reports (`KernelPageSize`).
    pub(super) page: u64,
    baseline: Option<u64>,
}

#[derive(Clone, Copy, Default)]
struct Pages {
    present: u64,
    swapped: u64,
}

impl Kernel {
    pub(super) fn open(fallback_page: u64) -> Kernel {
        let page = smaps_page_size().unwrap_or(fallback_page);
        let pagemap = File::open("/proc/self/pagemap").map_err(|e| format!("/proc/self/pagemap: {e}"));
        let mut k = Kernel { pagemap, page, baseline: None };
        k.baseline = smaps_governable().ok();
        k
    }

    /// Pages present / swapped in `ranges` (bit 63 / bit 62 of each
    /// pagemap entry), in bytes.
    fn pages(&self, ranges: &[(u64, u64)]) -> Result<Pages, String> {
        let f = self.pagemap.as_ref().map_err(Clone::clone)?;
        let mut p = Pages::default();
        for &(addr, len) in ranges {
            if len == 0 {
                continue;
            }
            let first = addr / self.page;
            let end = (addr + len).div_ceil(self.page);
            let mut buf = vec![0u8; ((end - first) * 8) as usize];
            f.read_exact_at(&mut buf, first * 8).map_err(|e| format!("/proc/self/pagemap: {e}"))?;
            for e in buf.chunks_exact(8) {
                let e = u64::from_le_bytes(e.try_into().expect("8 bytes"));
                if e >> 63 & 1 == 1 {
                    p.present += self.page;
                } else if e >> 62 & 1 == 1 {
                    p.swapped += self.page;
                }
            }
        }
        Ok(p)
    }

    /// The process's governable resident bytes now minus at the start.
    fn process_delta(&self) -> Option<i64> {
        let now = smaps_governable().ok()?;
        Some(now as i64 - self.baseline? as i64)
    }

    /// Governor vs kernel now, logged on `rec`'s timeline. `weights` and
    /// `kv` list the live address ranges (the prefix once); `stranded`,
    /// what a lost context left behind; `host`, the host copies of
    /// offloaded objects and the pool they are charged to.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn measure(
        &self,
        pool: &Pool,
        rec: &Recorder,
        label: &str,
        weights: &[(u64, u64)],
        kv: &[(u64, u64)],
        stranded: &Stranded,
        host: &HostCopies,
    ) -> Measurement {
        let snap = pool.snapshot();
        let gw = snap.class(AllocationClass::Weights).charged();
        let gk = snap.class(AllocationClass::Kv).charged();
        let gh = host.pool.as_ref().map_or(0, |p| p.used());
        let (rw, rk, rs) = (self.pages(weights), self.pages(kv), self.pages(&stranded.ranges));
        let rh = self.pages(&host.ranges);
        let exact = match (&rw, &rk, &rs, &rh) {
            (Ok(w), Ok(k), Ok(s), Ok(h)) => Some((*w, *k, *s, *h)),
            _ => None,
        };
        let delta = self.process_delta();
        let exact_ok = exact.is_none_or(|(w, k, s, h)| {
            w.present + w.swapped == gw
                && k.present + k.swapped == gk
                && gw + gk == snap.used
                && s.present + s.swapped == stranded.bytes
                && h.present + h.swapped == gh
        });
        let held = snap.used + stranded.bytes + gh;
        let process_ok = delta.is_none_or(|d| d.abs_diff(held as i64) <= PROCESS_TOLERANCE);
        let mut m = Measurement {
            t_ms: 0.0,
            label: label.into(),
            governor_used: snap.used,
            governor_weights: gw,
            governor_kv: gk,
            governor_host: gh,
            resident_weights: exact.map(|(w, _, _, _)| w.present),
            resident_kv: exact.map(|(_, k, _, _)| k.present),
            resident_host: exact.map(|(_, _, _, h)| h.present),
            swapped: exact.map(|(w, k, _, h)| w.swapped + k.swapped + h.swapped),
            stranded: stranded.bytes,
            resident_stranded: exact.map(|(_, _, s, _)| s.present + s.swapped),
            process_delta: delta,
            process_excess: delta.map(|d| d - held as i64),
            exact_ok,
            process_ok,
        };
        let resident = match exact {
            Some((w, k, s, h)) => format!(
                "pagemap {} (weights {}, kv {}){}{}",
                mib(w.present + k.present),
                mib(w.present),
                mib(k.present),
                if stranded.bytes == 0 { String::new() } else { format!(" + stranded {}", mib(s.present)) },
                if host.pool.is_none() {
                    String::new()
                } else {
                    format!(" + host copies {}", mib(h.present))
                }
            ),
            None => format!(
                "pagemap unavailable ({})",
                rw.err().or(rk.err()).or(rs.err()).or(rh.err()).unwrap_or_default()
            ),
        };
        let process = match delta {
            Some(d) => format!("smaps Δ {} ({:+} KiB)", signed_mib(d), (d - held as i64) / KIB as i64),
            None => "smaps unavailable".into(),
        };
        let mut stranded_text = if stranded.bytes == 0 {
            String::new()
        } else {
            format!(" + stranded {} (lost, no longer charged)", mib(stranded.bytes))
        };
        if host.pool.is_some() {
            stranded_text += &format!(" + host pool {}", mib(gh));
        }
        m.t_ms = rec.log(
            "measure",
            "kernel",
            format!(
                "{label}: governor {} (weights {}, kv {}){stranded_text} | {resident} | {process} → {}",
                mib(snap.used),
                mib(gw),
                mib(gk),
                if exact_ok && process_ok { "agree" } else { "DISAGREE" }
            ),
        );
        m
    }
}

fn smaps_page_size() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let line = text.lines().find(|l| l.starts_with("KernelPageSize:"))?;
    kib_field(line)
}

fn kib_field(line: &str) -> Option<u64> {
    let mut it = line.split_whitespace().skip(1);
    let v: u64 = it.next()?.parse().ok()?;
    (it.next() == Some("kB")).then_some(v * KIB)
}

/// Σ over `/proc/self/smaps` of `Anonymous` (private anonymous pages: the
/// weight shards, the KV regions, and the process's own heap and stacks)
/// plus `Pss` of memfd mappings (the shared prefix: mapped into every
/// region, so its `Rss` would count it once per region, while `Pss`
/// divides each page among its mappings and counts it once).
fn smaps_governable() -> std::io::Result<u64> {
    let text = std::fs::read_to_string("/proc/self/smaps")?;
    let mut total = 0;
    let mut memfd = false;
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            memfd = line.contains("/memfd:");
        } else if line.starts_with("Anonymous:") || (memfd && line.starts_with("Pss:")) {
            total += kib_field(line).unwrap_or(0);
        }
    }
    Ok(total)
}

/// The two checks over every measurement taken: governor = pagemap
/// exactly, governor ≈ smaps delta within [`PROCESS_TOLERANCE`].
pub(super) fn check(ms: &[Measurement], checks: &mut Checks) {
    let exact_all = ms.iter().all(|m| m.exact_ok);
    let process_all = ms.iter().all(|m| m.process_ok);
    const EXACT: &str = "governor = kernel pages (pagemap)";
    if ms.iter().all(|m| m.resident_kv.is_none()) {
        checks.skip(EXACT, "/proc/self/pagemap is not readable here");
    } else {
        checks.add(
            EXACT,
            exact_all,
            format!(
                "{}/{} measurements: pages present over the live objects == bytes charged, exactly \
                 (and over the lost objects == bytes stranded)",
                ms.iter().filter(|m| m.exact_ok).count(),
                ms.len()
            ),
        );
    }
    checks.add(
        "governor ≈ process resident delta (smaps)",
        process_all,
        format!(
            "{}/{} measurements within {} of the governed bytes{} (worst difference {})",
            ms.iter().filter(|m| m.process_ok).count(),
            ms.len(),
            mib(PROCESS_TOLERANCE),
            if ms.iter().any(|m| m.stranded != 0) { " plus the stranded ones" } else { "" },
            ms.iter()
                .filter_map(|m| m.process_excess.map(i64::unsigned_abs))
                .max()
                .map_or("n/a".into(), |d| format!("{} KiB", d / KIB))
        ),
    );
}
