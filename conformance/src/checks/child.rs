//! A check's process: each check runs in a child process of its own, which runs the
//! whole sequence and reports only the check it is aimed at.

use super::*;

/// How many of the loss reports made during a check its detail describes.
const NOTED_REPORTS: usize = 5;

/// The child of the check at `target`: the whole sequence, aimed at it.
pub(super) fn child_main(source: &Source, opts: &Options, kit: &Kit, target: usize, out: RawFd) -> i32 {
    let log = Arc::new(kit.log.snapshot());
    log.set_muted(true);
    let mut res = Results {
        history: kit.history.clone(),
        states: kit.states.clone(),
        leaks: kit.leaks.clone(),
        target,
        next: 0,
        out,
        log,
        started: false,
        announced: None,
        done: false,
        state_sent: false,
        live: None,
        services: None,
    };
    let mut header = Header::default();
    if let Err(Error::NoSuchMechanism { name, available }) = orchestrate(source, opts, &mut res, &mut header)
    {
        res.send(&Msg::NoSuchMechanism { name, available });
    }
    res.send(&Msg::Header(header));
    if !res.started {
        res.send(&Msg::End);
    }
    0
}

/// Writes all of `b` to `fd` (a kit whose end is gone is not waited for).
/// Tells the kit that this check's process is still at work (a storm that
/// runs for seconds), so `--timeout` measures silence, not a long check.
pub(super) fn still_alive() {
    if let Ok(mut b) = serde_json::to_vec(&Msg::Alive) {
        b.push(b'\n');
        write_all(crate::os::MESSAGE_FD, &b);
    }
}

pub(super) fn write_all(fd: RawFd, mut b: &[u8]) {
    while !b.is_empty() {
        // SAFETY: writes from a live buffer of its length.
        let n = unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
        if n > 0 {
            b = &b[n as usize..];
        } else if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        } else {
            return;
        }
    }
}

/// Runs `f`; a panic in the kit's own code is a failure of the check, not
/// of the run.
pub(super) fn guarded(f: impl FnOnce() -> Checked) -> Checked {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(Verdict::Fail(format!("the check stopped: {what}")))
    })
}

pub(super) fn passes(r: &Checked) -> bool {
    !matches!(r, Err(Verdict::Fail(_)))
}

/// The checks as one child sees them: the kit's record of those before its
/// own, its own check, and nothing after it (see the module documentation).
pub(crate) struct Results {
    history: Vec<Record>,
    states: HashMap<String, MechState>,
    leaks: Vec<String>,
    /// The position of this child's check.
    target: usize,
    /// The position of the next check reached.
    next: usize,
    /// Where messages to the kit go.
    out: RawFd,
    pub(crate) log: Arc<Log>,
    /// Its check's start was announced, and under which name.
    started: bool,
    announced: Option<(&'static str, Option<String>)>,
    /// Its check ran.
    done: bool,
    /// Its mechanism's state went to the kit.
    state_sent: bool,
    /// The plugin's `live_objects` and its context, once validated.
    live: Option<(unsafe extern "C" fn(*mut c_void) -> u64, *mut c_void)>,
    /// The services of the ordinary negotiation: a report the plugin makes
    /// during a check is noted in its detail.
    services: Option<&'static KitServices>,
}

impl Results {
    fn send(&self, m: &Msg) {
        let Ok(mut b) = serde_json::to_vec(m) else {
            return;
        };
        b.push(b'\n');
        write_all(self.out, &b);
    }

    /// Records `r`, a result already worked out, as check `name`.
    pub(crate) fn add(&mut self, name: &'static str, mechanism: Option<&str>, r: Checked) -> bool {
        self.step(name, mechanism, true, move || r)
    }

    /// Runs `f` as check `name` (when it is this process's check); returns
    /// whether it passed or was skipped.
    pub(crate) fn run(
        &mut self,
        name: &'static str,
        mechanism: Option<&str>,
        f: impl FnOnce() -> Checked,
    ) -> bool {
        self.step(name, mechanism, false, f)
    }

    /// Says the next check is `name`: work done before it reaches
    /// [`Results::add`] or [`Results::run`] (reading what it judges) is
    /// part of it, so a crash there is that check's.
    pub(crate) fn upcoming(&mut self, name: &'static str, mechanism: Option<&str>) {
        if self.next == self.target && !self.started {
            self.start(name, mechanism);
        }
    }

    fn start(&mut self, name: &'static str, mechanism: Option<&str>) {
        self.send(&Msg::Start { name: name.into(), mechanism: mechanism.map(str::to_string) });
        self.started = true;
        self.announced = Some((name, mechanism.map(str::to_string)));
    }

    fn diverged(&self, index: usize, name: &'static str, mechanism: Option<&str>) -> ! {
        self.send(&Msg::Diverged { index, name: name.into(), mechanism: mechanism.map(str::to_string) });
        // SAFETY: a check's process, leaving without unwinding into the
        // plugin or running the caller's atexit handlers.
        unsafe { libc::_exit(0) }
    }

    fn step(
        &mut self,
        name: &'static str,
        mechanism: Option<&str>,
        computed: bool,
        f: impl FnOnce() -> Checked,
    ) -> bool {
        debug_assert!(CHECKS.iter().any(|c| c.name == name), "{name} is not in CHECKS");
        let at = self.next;
        self.next += 1;
        if at < self.target {
            let rec = match self.history.get(at) {
                Some(r) if r.name == name && r.mechanism.as_deref() == mechanism => r.clone(),
                _ => self.diverged(at, name, mechanism),
            };
            if computed {
                return passes(&f());
            }
            if REPLAYED.contains(&name) && !matches!(rec.outcome, Outcome::Crash | Outcome::Timeout) {
                self.send(&Msg::Replay { index: at });
                return passes(&guarded(f));
            }
            return !rec.outcome.is_failure();
        }
        if at > self.target || self.done {
            return false;
        }
        // Announced by `upcoming` under another name (a check was put in
        // between): the later Start is the one the kit keeps.
        if self.announced.as_ref().is_none_or(|(n, m)| *n != name || m.as_deref() != mechanism) {
            self.start(name, mechanism);
        }
        let before = mechanism.and_then(|_| self.live_count());
        let reports_before = self.services.map_or(0, |s| s.count());
        let marks = self.log.marks();
        self.log.set_muted(false);
        let strays = super::host_fns::STRAY_RUNS.load(Ordering::SeqCst);
        let t = Instant::now();
        let r = guarded(f);
        let duration = t.elapsed();
        self.log.set_muted(true);
        let (mut outcome, mut detail) = match r {
            Ok(d) => (Outcome::Pass, d),
            Err(Verdict::Fail(d)) => (Outcome::Fail, d),
            Err(Verdict::Skip(d)) => (Outcome::Skip, d),
        };
        let stray = super::host_fns::STRAY_RUNS.load(Ordering::SeqCst) - strays;
        if stray > 0 {
            // What the check saw may be fine; the plugin still broke
            // "exactly once when enqueue_host_fn returns OK, never on failure".
            outcome = Outcome::Fail;
            detail = format!(
                "the plugin ran {stray} host function(s) the kit had no enqueue waiting for: a function run a second \
                 time, or run after its enqueue_host_fn was refused (exactly once on OK, never on failure)\n{detail}"
            );
        }
        let passed = outcome != Outcome::Fail;
        if let Some(s) = self.services {
            // A few notes, then a count: a storm of reports must not make
            // a report of megabytes.
            let seen = s.seen();
            let new = seen.len().saturating_sub(reports_before);
            if new > NOTED_REPORTS {
                detail += &format!(
                    "\nnote: during this check the plugin reported {new} device losses through the kit's services; the \
                     first {NOTED_REPORTS}:"
                );
            }
            for r in seen.iter().skip(reports_before).take(NOTED_REPORTS) {
                detail += &format!(
                    "\nnote: during this check the plugin reported the loss of mechanism id {} through the kit's \
                     services ({}, {}; answered {})",
                    r.mechanism_id,
                    r.thread(),
                    r.reason.describe(),
                    crate::raw::status_name(r.answer)
                );
            }
        }
        // Every late write this process saw (in this check, or in the
        // checks replayed on the way to it) goes to the kit.
        let log = LogDelta::new(self.log.since(marks), crate::sink::take_late_writes());
        self.send(&Msg::Verdict { outcome, detail, duration_ns: duration.as_nanos() as u64, log });
        self.done = true;
        if let Some(before) = before {
            if let Some(after) = self.live_count() {
                self.send(&Msg::Live { before, after });
            }
        }
        passed
    }

    /// Where a mechanism's groups of checks meet: before this process's
    /// check, `st` becomes what the checks before it built; after it, `st`
    /// goes to the kit for the checks after it.
    pub(crate) fn share(&mut self, mechanism: &str, st: &mut MechState) {
        if !self.done {
            if let Some(s) = self.states.get(mechanism) {
                *st = *s;
            }
        } else if !self.state_sent {
            self.send(&Msg::State { mechanism: mechanism.into(), state: *st });
            self.state_sent = true;
        }
    }

    /// From now on the plugin's live objects are counted around each
    /// per-mechanism check.
    pub(crate) fn set_live_probe(&mut self, plugin: &descriptor::PluginView) {
        self.live = Some((plugin.live_objects, plugin.ctx));
    }

    fn live_count(&self) -> Option<u64> {
        let (f, ctx) = self.live?;
        // SAFETY: the plugin's validated live_objects slot and context.
        Some(unsafe { f(ctx) })
    }

    /// The checks after which the plugin counted a different number of live
    /// objects than before, as the kit recorded them.
    pub(crate) fn leaks(&self) -> &[String] {
        &self.leaks
    }
}

/// The whole sequence of checks, as one child runs it through `res`.
pub(super) fn orchestrate(
    source: &Source,
    opts: &Options,
    res: &mut Results,
    h: &mut Header,
) -> Result<(), Error> {
    let (entry, path) = match source {
        Source::Opened(path) => match load(path, res) {
            Some(entry) => (entry, Some(path.clone())),
            None => return Ok(()),
        },
        Source::Linked(entry) => {
            const WHY: &str =
                "the plugin is linked into the executable running the kit: there is no library \
                               file; run the kit on the plugin's library to check it";
            res.add("load.open", None, Err(Verdict::Skip(format!("{WHY} (dlopen)"))));
            res.add("load.entry_symbol", None, Ok("memplug_plugin_v1, linked in".into()));
            res.add("exports.only_entry_symbols", None, Err(Verdict::Skip(format!("{WHY} (its exports)"))));
            (*entry, None)
        }
    };
    let services = KitServices::leak();
    res.services = Some(services);
    let ctx = Ctx { log: res.log.clone(), opts: opts.clone(), entry, path, services };
    let Some((desc, agreed)) = negotiation::run_all(res, &ctx) else {
        return Ok(());
    };
    h.abi = Some(format!("{MEMPLUG_ABI_MAJOR}.{agreed}"));
    let Some(plugin) = descriptor::plugin(res, &desc, agreed) else {
        return Ok(());
    };
    res.set_live_probe(&plugin);
    h.plugin_name = Some(plugin.name.clone());
    h.plugin_version = Some(plugin.version.clone());
    h.plugin_abi_range = Some(format!("1.{}..=1.{}", plugin.min_minor, plugin.max_minor));
    // Reading the mechanism descriptors is descriptor.mechanisms' work.
    res.upcoming("descriptor.mechanisms", None);
    let published = descriptor::mechanisms(res, &plugin);
    // From now on the kit's services take the plugin's reports.
    services.publish(agreed, published.iter().map(|d| d.desc.mechanism_id).collect());
    if let Some(want) = &opts.mechanism {
        if !published.iter().any(|d| &d.name == want) {
            return Err(Error::NoSuchMechanism {
                name: want.clone(),
                available: published.iter().map(|d| d.name.clone()).collect(),
            });
        }
    }
    let mut checked = Vec::new();
    for d in &published {
        h.mechanisms.push(WireMech {
            name: d.name.clone(),
            id: d.desc.mechanism_id,
            device: descriptor::device_string(d.desc.device),
            capabilities: descriptor::capability_names(d.desc.capabilities)
                .iter()
                .map(|c| c.to_string())
                .collect(),
        });
        if opts.mechanism.as_ref().is_some_and(|w| w != &d.name) || !d.checkable {
            continue;
        }
        let Some(m) = descriptor::mechanism(res, &ctx, &plugin, d) else {
            continue;
        };
        per_mechanism(res, &ctx, &m);
        checked.push(m);
    }
    loss::run_plugin(res, &ctx, &checked);
    messages::finish(res, &ctx, &plugin, &checked);
    Ok(())
}

/// Opens the plugin file and finds its entry (`load.open`,
/// `load.entry_symbol`, `exports.only_entry_symbols`); `None` when the run
/// cannot go on.
fn load(path: &Path, res: &mut Results) -> Option<MemplugEntryV1> {
    // An initialiser of the plugin that crashes does so in load.open.
    res.upcoming("load.open", None);
    let lib = match open(path) {
        Ok(l) => {
            res.add("load.open", None, Ok("opened with RTLD_NOW | RTLD_LOCAL".into()));
            l
        }
        Err(e) => {
            res.add("load.open", None, Err(Verdict::Fail(e)));
            res.run("exports.only_entry_symbols", None, || exports(path));
            return None;
        }
    };
    // SAFETY: the symbol's type is fixed by the ABI for this name.
    let entry = match unsafe { lib.get::<MemplugEntryV1>(b"memplug_plugin_v1\0") } {
        Ok(f) => {
            res.add("load.entry_symbol", None, Ok("memplug_plugin_v1 found".into()));
            *f
        }
        Err(e) => {
            res.add(
                "load.entry_symbol",
                None,
                Err(Verdict::Fail(format!("memplug_plugin_v1 is not defined: {e}"))),
            );
            res.run("exports.only_entry_symbols", None, || exports(path));
            return None;
        }
    };
    // The library stays loaded for the life of the process: a plugin may
    // keep threads or mappings past the last call the kit makes.
    std::mem::forget(lib);
    res.run("exports.only_entry_symbols", None, || exports(path));

    Some(entry)
}

pub(super) fn per_mechanism(res: &mut Results, ctx: &Ctx, m: &Mech) {
    let mut st = MechState::default();
    let name = Some(m.name.as_str());
    res.share(&m.name, &mut st);
    descriptor_claims::run_descriptor(res, ctx, m);
    allocator::run_all(res, ctx, m, &mut st);
    res.share(&m.name, &mut st);
    virtual_backing::run_all(res, ctx, m);
    res.share(&m.name, &mut st);
    shared_mapping::run_all(res, ctx, m);
    typed_export::run_all(res, ctx, m);
    descriptor_claims::run_claims(res, ctx, m);
    res.share(&m.name, &mut st);
    sync::run_all(res, ctx, m, &mut st);
    res.share(&m.name, &mut st);
    ordering::run_all(res, ctx, m, &st);
    copy::run_all(res, ctx, m, &st);
    concurrency::run_all(res, ctx, m, &st);
    res.share(&m.name, &mut st);
    loss::run_mech(res, ctx, m);
    res.run("lifecycle.live_objects", name, || allocator::live_objects(ctx, m));
}

pub(crate) fn open(path: &Path) -> Result<libloading::Library, String> {
    let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL;
    // SAFETY: loading runs the library's initialisers: that is what
    // checking a plugin means; the path was chosen by the user.
    unsafe { libloading::os::unix::Library::open(Some(path), flags) }
        .map(libloading::Library::from)
        .map_err(|e| format!("not a loadable library: {e}"))
}

/// How many offending names `exports.only_entry_symbols` lists.
const LISTED_EXPORTS: usize = 24;

pub(super) fn exports(path: &Path) -> Checked {
    let names = crate::elf::exported_symbols(path).map_err(Verdict::Fail)?;
    let extra: Vec<&String> =
        names.iter().filter(|n| !crate::elf::is_entry_symbol(n) && !fresh::is_loss_trigger(n)).collect();
    let entries: Vec<&String> = names.iter().filter(|n| crate::elf::is_entry_symbol(n)).collect();
    let triggers: Vec<&str> =
        names.iter().filter(|n| fresh::is_loss_trigger(n)).map(|s| s.as_str()).collect();
    if !extra.is_empty() {
        // Sorted, each name whole.
        let listed: Vec<&str> = extra.iter().take(LISTED_EXPORTS).map(|s| s.as_str()).collect();
        let more = extra.len().saturating_sub(LISTED_EXPORTS);
        let more = if more > 0 { format!(" and {more} more") } else { String::new() };
        fail!(
            "exports {} symbol(s) besides its entry symbols (build with -fvisibility=hidden and mark only the \
             entry MEMPLUG_EXPORT, or link with a version script whose `local: *;` hides the rest): {}{more}",
            extra.len(),
            listed.join(", ")
        );
    }
    ensure!(!entries.is_empty(), "exports no memplug_plugin_v<N> entry symbol");
    let triggers = if triggers.is_empty() {
        String::new()
    } else {
        format!(" and the kit's device-loss test trigger {}", triggers.join(", "))
    };
    Ok(format!(
        "exports only {}{triggers}",
        entries.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
    ))
}
