//! The fresh plugin instance every `loss.*` check works on, and the
//! device-loss test triggers the kit looks for in it ([`LOSS_TRIGGERS`]).
//!
//! The check's process loads a second copy of the library file (a memfd,
//! or a temporary file when a memfd cannot be mapped executable), so its
//! initialisers, statics and threads are its own, and negotiates once with
//! a 1.2 host info carrying a services table of its own
//! ([`KitServices`]). So the kit sees exactly what that one negotiation
//! did (a report during the entry call); a trigger that is read from the
//! environment when the plugin instance is built (the CPU plugin's
//! `MEMPLUG_CPU_TEST_SWITCHES`) is switched on, in this process only,
//! before that happens; and nothing of the loss reaches the instance the
//! other checks use. The copy's dependencies are the ones already loaded
//! for the first instance (found by their sonames), only the plugin itself
//! is duplicated.

use super::descriptor::{mech_of, read_tables};
use super::negotiation::{host_info, malformed_answer};
use super::{fail, skip, Ctx, Verdict};
use crate::raw::{plugin_string, status_name, Guarded, Mech};
use crate::services::KitServices;
use crate::sink::{call, Log};
use core::ffi::c_void;
use memplug_sdk::abi::*;
use memplug_sdk::prefix;
use std::path::Path;

/// A symbol the kit calls to make a plugin report a device loss (a test
/// build's, or one switched on by the environment):
/// `MemplugStatus NAME(uint64_t mechanism_id)`. It reports the mechanism
/// lost as the plugin would on a real loss (through the host's services)
/// and answers `MEMPLUG_STATUS_OK`; for an id the plugin does not publish
/// it reports nothing and answers another status (`WRONG_MECHANISM`); when
/// it is not enabled, another status too (the check is then skipped).
#[derive(Clone, Copy, Debug)]
pub struct LossTrigger {
    /// The exported name.
    pub symbol: &'static str,
    /// An environment variable the kit sets (to this value) in the check's
    /// process before the fresh copy of the plugin is loaded and
    /// negotiated, when the plugin exports this symbol.
    pub env: Option<(&'static str, &'static str)>,
    /// Whose name it is.
    pub origin: &'static str,
}

/// The test triggers the kit looks for, in this order (the first one
/// exported is used). The one place they are listed.
pub const LOSS_TRIGGERS: &[LossTrigger] = &[
    LossTrigger { symbol: "memplug_test_trigger_device_lost", env: None, origin: "the kit's convention" },
    LossTrigger {
        symbol: "memplug_cpu_test_report_loss",
        env: Some(("MEMPLUG_CPU_TEST_SWITCHES", "1")),
        origin: "the reference CPU plugin's test switch",
    },
];

/// Whether `name` is one of [`LOSS_TRIGGERS`].
pub fn is_loss_trigger(name: &str) -> bool {
    LOSS_TRIGGERS.iter().any(|t| t.symbol == name)
}

pub(crate) type TriggerFn = unsafe extern "C" fn(u64) -> MemplugStatus;

fn trigger_names() -> String {
    LOSS_TRIGGERS.iter().map(|t| t.symbol).collect::<Vec<_>>().join(", ")
}

/// Writes `what` to the process's stderr (captured by the kit; part of a
/// crashed or timed-out check's detail).
pub(crate) fn mark(what: &str) {
    let line = format!("memplug-conformance: {what}\n");
    // SAFETY: writes a local buffer to stderr.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

// ---------------------------------------------------------------------------
// A fresh instance of the plugin
// ---------------------------------------------------------------------------

/// A second copy of the plugin, negotiated once with the kit's 1.2 host.
pub(crate) struct Fresh {
    pub(crate) services: &'static KitServices,
    pub(crate) agreed: u32,
    pub(crate) min_minor: u32,
    pub(crate) max_minor: u32,
    /// `(id, name, descriptor)` of each mechanism that could be read.
    pub(crate) mechanisms: Vec<(u64, String, MemplugMechanism)>,
    pub(crate) live_objects: unsafe extern "C" fn(*mut c_void) -> u64,
    pub(crate) plugin_ctx: *mut c_void,
    pub(crate) trigger: Option<(&'static LossTrigger, TriggerFn)>,
    /// The trigger the library exports, found or not by `dlsym`.
    pub(crate) exported: Option<&'static LossTrigger>,
    /// The calls of this instance (kept out of the run's log: the
    /// `messages.*` checks judge the ordinary instance).
    pub(crate) log: Log,
}

/// Loads a copy of the library at `path` that shares nothing with one
/// already loaded from it.
fn load_copy(path: &Path) -> Result<libloading::Library, String> {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut tried = Vec::new();
    // SAFETY: memfd_create with a static name; the descriptor is owned by
    // the File from then on.
    let fd = unsafe { libc::memfd_create(c"memplug-conformance-fresh".as_ptr(), libc::MFD_CLOEXEC) };
    if fd >= 0 {
        let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
        match file.write_all(&bytes) {
            Ok(()) => match super::open(Path::new(&format!("/proc/self/fd/{fd}"))) {
                Ok(lib) => return Ok(lib),
                Err(e) => tried.push(format!("from a memfd: {e}")),
            },
            Err(e) => tried.push(format!("writing a memfd: {e}")),
        }
    } else {
        tried.push(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    let p = std::env::temp_dir().join(format!("memplug-conformance-fresh-{}.so", std::process::id()));
    let r = std::fs::write(&p, &bytes).map_err(|e| e.to_string()).and_then(|()| super::open(&p));
    let _ = std::fs::remove_file(&p);
    r.map_err(|e| {
        tried.push(format!("from {}: {e}", p.display()));
        tried.join("; ")
    })
}

fn fresh_skip(why: String) -> Verdict {
    Verdict::Skip(format!(
        "{why}; every loss.* check needs an instance of the plugin of its own (a second copy of the library)"
    ))
}

/// Loads and negotiates a fresh instance (see the module documentation).
pub(crate) fn fresh(ctx: &Ctx) -> Result<Fresh, Verdict> {
    fresh_at(ctx, MEMPLUG_ABI_MINOR)
}

/// [`fresh`], negotiated with a host whose newest minor is `host_max`:
/// below 2 its host info is the 24-byte one of ABI 1.0/1.1, without the
/// services field (the kit's services are then never reachable, and the
/// plugin must not answer `MEMPLUG_STATUS_DEVICE_LOST`, which such a host
/// reads as `MEMPLUG_STATUS_INTERNAL`).
pub(crate) fn fresh_at(ctx: &Ctx, host_max: u32) -> Result<Fresh, Verdict> {
    let Some(path) = &ctx.path else {
        return Err(fresh_skip(
            "the plugin is linked into the executable running the kit: there is no library file to load a \
             copy from"
                .into(),
        ));
    };
    let exported_names = crate::elf::exported_symbols(path).unwrap_or_default();
    let exported = LOSS_TRIGGERS.iter().find(|t| exported_names.iter().any(|n| n == t.symbol));
    if let Some((k, v)) = exported.and_then(|t| t.env) {
        // Only this check's process, before the copy's initialisers and
        // first negotiation run: the caller of the kit never sees it.
        std::env::set_var(k, v);
    }
    let lib = load_copy(path).map_err(|e| fresh_skip(format!("the kit could not load a copy: {e}")))?;
    // SAFETY: the symbol types are fixed by the ABI and the kit's
    // convention for these names.
    let entry = match unsafe { lib.get::<MemplugEntryV1>(b"memplug_plugin_v1\0") } {
        Ok(f) => *f,
        Err(e) => return Err(fresh_skip(format!("the copy has no memplug_plugin_v1 ({e})"))),
    };
    let trigger = exported.and_then(|t| {
        let name = format!("{}\0", t.symbol);
        // SAFETY: as above.
        unsafe { lib.get::<TriggerFn>(name.as_bytes()) }.ok().map(|f| (t, *f))
    });
    // Kept loaded: the plugin may keep threads past the check's last call.
    std::mem::forget(lib);

    let services = KitServices::leak();
    let h = if host_max >= 2 {
        host_info(MEMPLUG_HOST_INFO_SIZE_1_2, MEMPLUG_ABI_MAJOR, 0, host_max, services.table())
    } else {
        host_info(MEMPLUG_HOST_INFO_SIZE_1_0, MEMPLUG_ABI_MAJOR, 0, host_max, core::ptr::null())
    };
    let mut out = Guarded::new(MEMPLUG_NEGOTIATION_SIZE_1_0);
    let log = Log::default();
    services.in_entry(true);
    mark("negotiating with a fresh copy of the plugin");
    // SAFETY: the entry contract: pointers valid for the call.
    let (st, _) = call(&log, "memplug_plugin_v1", |sink| unsafe { entry(h.as_ptr(), out.ptr(), sink) });
    services.in_entry(false);
    if st != MEMPLUG_STATUS_OK {
        return Err(fresh_skip(format!(
            "the fresh copy refused the kit's host speaking 1.0..=1.{host_max} with {} (the first instance agreed \
             with a 1.{MEMPLUG_ABI_MINOR} host)",
            status_name(st)
        )));
    }
    let n: MemplugNegotiation = out.read();
    if let Some(why) = malformed_answer(&n, MEMPLUG_NEGOTIATION_SIZE_1_0, 0, host_max) {
        return Err(fresh_skip(format!("the fresh copy's answer is malformed: {why}")));
    }
    // SAFETY: a well-formed answer's descriptor, read as a prefix.
    let d: MemplugPlugin = unsafe { prefix::read(n.plugin) }
        .map_err(|e| fresh_skip(format!("the fresh copy's descriptor cannot be read: {e:?}")))?;
    let Some(live_objects) = d.live_objects else {
        return Err(fresh_skip("the fresh copy's live_objects is NULL".into()));
    };
    if d.mechanisms.is_null() || d.mechanism_count > 4096 {
        return Err(fresh_skip("the fresh copy's mechanism list cannot be read".into()));
    }
    let mut mechanisms = Vec::new();
    for i in 0..d.mechanism_count as usize {
        // SAFETY: `mechanism_count` pointers, as the descriptor says; each
        // descriptor read as a prefix, its name with a bound.
        let p = unsafe { *d.mechanisms.add(i) };
        let Ok(md) = (unsafe { prefix::read::<MemplugMechanism>(p) }) else {
            continue;
        };
        if let Ok(name) = unsafe { plugin_string(md.name) } {
            mechanisms.push((md.mechanism_id, name, md));
        }
    }
    services.publish(n.agreed_minor, mechanisms.iter().map(|m| m.0).collect());
    Ok(Fresh {
        services,
        agreed: n.agreed_minor,
        min_minor: d.min_minor,
        max_minor: d.max_minor,
        mechanisms,
        live_objects,
        plugin_ctx: d.ctx,
        trigger,
        exported,
        log,
    })
}

impl Fresh {
    pub(crate) fn published(&self) -> Vec<(u64, String)> {
        self.mechanisms.iter().map(|(id, n, _)| (*id, n.clone())).collect()
    }

    /// Skips unless negotiation agreed on 1.2 or newer.
    pub(crate) fn require_1_2(&self) -> Result<(), Verdict> {
        if self.agreed < 2 {
            skip!(
                "the plugin agreed on ABI 1.{} with the kit's 1.2 host (it speaks 1.{}..=1.{}): device loss and \
                 host services are ABI 1.2",
                self.agreed,
                self.min_minor,
                self.max_minor
            );
        }
        Ok(())
    }

    /// The trigger, or a skip saying why there is none.
    pub(crate) fn trigger(&self) -> Result<(&'static LossTrigger, TriggerFn), Verdict> {
        match (self.trigger, self.exported) {
            (Some(t), _) => Ok(t),
            (None, Some(t)) => skip!("the plugin exports {} but the kit could not resolve it", t.symbol),
            (None, None) => skip!(
                "the plugin exports no device-loss test trigger ({}): a loss cannot be provoked from outside \
                 a plugin, so this check runs only on a build that exports one (docs/conformance-json.md, \
                 \"Device-loss test triggers\")",
                trigger_names()
            ),
        }
    }

    /// The kit's view of mechanism `id` of this instance, with `props`.
    pub(crate) fn mech(&self, id: u64, props: MemplugProperties) -> Result<Mech, Verdict> {
        let Some((_, name, desc)) = self.mechanisms.iter().find(|m| m.0 == id) else {
            fail!("the fresh copy of the plugin does not publish mechanism id {id}, which the first one did");
        };
        let t = read_tables(desc, self.agreed)?;
        let mut m = mech_of(name, desc, t, self.agreed, self.live_objects, self.plugin_ctx);
        m.props = props;
        Ok(m)
    }
}

/// Calls the trigger for `id`.
pub(crate) fn pull(t: &LossTrigger, f: TriggerFn, id: u64) -> MemplugStatus {
    mark(&format!("calling {}({id})", t.symbol));
    // SAFETY: an exported trigger of the kit's convention.
    unsafe { f(id) }
}

/// Why a trigger that did not answer OK makes the check a skip.
pub(crate) fn not_enabled(t: &LossTrigger, st: MemplugStatus, id: u64, name: &str) -> Verdict {
    let env = t
        .env
        .map(|(k, v)| {
            format!(" (the kit set {k}={v} in this check's process before the fresh copy was loaded and negotiated)")
        })
        .unwrap_or_default();
    Verdict::Skip(format!(
        "the plugin's test trigger {}({id}) ({}) answered {} for mechanism '{name}': not enabled in this build \
         or environment{env}, so no loss could be provoked",
        t.symbol,
        t.origin,
        status_name(st)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triggers_are_listed_once_with_the_cpu_switch() {
        let mut names: Vec<&str> = LOSS_TRIGGERS.iter().map(|t| t.symbol).collect();
        assert_eq!(names[0], "memplug_test_trigger_device_lost");
        names.dedup();
        assert_eq!(names.len(), LOSS_TRIGGERS.len());
        let cpu = LOSS_TRIGGERS.iter().find(|t| t.symbol == "memplug_cpu_test_report_loss").unwrap();
        assert_eq!(cpu.env, Some(("MEMPLUG_CPU_TEST_SWITCHES", "1")));
        assert!(is_loss_trigger("memplug_cpu_test_report_loss") && !is_loss_trigger("memplug_plugin_v1"));
        // Not entry symbols: the exports check allows them separately.
        assert!(LOSS_TRIGGERS.iter().all(|t| !crate::elf::is_entry_symbol(t.symbol)));
    }
}
