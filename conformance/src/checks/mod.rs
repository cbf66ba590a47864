//! The run: load, negotiate, read the descriptor, then every check in the
//! order of [`crate::CHECKS`], with what each check makes released by a
//! [`Scope`] whatever way the check ends.

mod allocator;
mod concurrency;
mod descriptor;
mod messages;
mod negotiation;
mod shared_mapping;
mod sync;
mod virtual_backing;

use crate::raw::{Made, Mech};
use crate::sink::Log;
use crate::{CheckResult, Error, MechanismSummary, Options, Outcome, Report, CHECKS};
use core::ffi::c_void;
use memplug_sdk::abi::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How a check stops early.
pub(crate) enum Verdict {
    Fail(String),
    Skip(String),
}

/// A check's result: `Ok(detail)` passes.
pub(crate) type Checked = Result<String, Verdict>;

/// The body of a per-mechanism check.
pub(crate) type CheckFn = fn(&Ctx, &Mech) -> Checked;

macro_rules! fail {
    ($($t:tt)*) => {
        return Err($crate::checks::Verdict::Fail(format!($($t)*)))
    };
}

macro_rules! skip {
    ($($t:tt)*) => {
        return Err($crate::checks::Verdict::Skip(format!($($t)*)))
    };
}

macro_rules! ensure {
    ($c:expr, $($t:tt)*) => {
        if !($c) {
            return Err($crate::checks::Verdict::Fail(format!($($t)*)));
        }
    };
}

pub(crate) use {ensure, fail, skip};

/// Fails unless `got` is one of `want`.
pub(crate) fn expect(got: MemplugStatus, want: &[MemplugStatus], what: &str) -> Result<(), Verdict> {
    if want.contains(&got) {
        return Ok(());
    }
    let names: Vec<String> = want.iter().map(|&s| crate::raw::status_name(s)).collect();
    fail!("{what}: got {}, expected {}", crate::raw::status_name(got), names.join(" or "))
}

/// Fails unless the plugin's live-object count is `want`.
pub(crate) fn expect_live(m: &Mech, want: u64, what: &str) -> Result<(), Verdict> {
    let got = m.live();
    ensure!(got == want, "{what}: live_objects is {got}, expected {want}");
    Ok(())
}

/// What every check can reach.
pub(crate) struct Ctx {
    pub log: Arc<Log>,
    pub opts: Options,
    pub entry: MemplugEntryV1,
}

/// Results as they come.
pub(crate) struct Results {
    pub list: Vec<CheckResult>,
}

impl Results {
    pub(crate) fn add(&mut self, name: &'static str, mechanism: Option<&str>, r: Checked) -> bool {
        debug_assert!(CHECKS.iter().any(|c| c.name == name), "{name} is not in CHECKS");
        let (outcome, detail) = match r {
            Ok(d) => (Outcome::Pass, d),
            Err(Verdict::Fail(d)) => (Outcome::Fail, d),
            Err(Verdict::Skip(d)) => (Outcome::Skip, d),
        };
        self.list.push(CheckResult { name, mechanism: mechanism.map(str::to_string), outcome, detail });
        outcome != Outcome::Fail
    }

    /// Runs `f` as check `name`; a panic in the kit's own code is a
    /// failure of the check, not of the run.
    pub(crate) fn run(
        &mut self,
        name: &'static str,
        mechanism: Option<&str>,
        f: impl FnOnce() -> Checked,
    ) -> bool {
        let r = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
            let what = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(Verdict::Fail(format!("the check stopped: {what}")))
        });
        self.add(name, mechanism, r)
    }
}

/// What the per-mechanism checks learn that later checks use.
#[derive(Default)]
pub(crate) struct MechState {
    /// Allocations proved readable and writable (CPU): the storm may touch
    /// its blocks.
    pub touch_ok: bool,
    /// A fence failed to complete: later waits are short.
    pub fences_stuck: bool,
}

pub(crate) fn run(path: &Path, opts: &Options) -> Result<Report, Error> {
    let mut res = Results { list: Vec::new() };
    let mut report = Report {
        plugin_path: path.to_path_buf(),
        plugin_name: None,
        plugin_version: None,
        abi: None,
        plugin_abi_range: None,
        mechanisms: Vec::new(),
        checks: Vec::new(),
    };
    let finish = |mut report: Report, res: Results| {
        report.checks = res.list;
        Ok(report)
    };

    let lib = match open(path) {
        Ok(l) => {
            res.add("load.open", None, Ok("opened with RTLD_NOW | RTLD_LOCAL".into()));
            l
        }
        Err(e) => {
            res.add("load.open", None, Err(Verdict::Fail(e)));
            res.run("exports.only_entry_symbols", None, || exports(path));
            return finish(report, res);
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
            return finish(report, res);
        }
    };
    // The library stays loaded for the life of the process: a plugin may
    // keep threads or mappings past the last call the kit makes.
    std::mem::forget(lib);
    res.run("exports.only_entry_symbols", None, || exports(path));

    let ctx = Ctx { log: Arc::new(Log::default()), opts: opts.clone(), entry };
    let Some((desc, agreed)) = negotiation::run_all(&mut res, &ctx) else {
        return finish(report, res);
    };
    report.abi = Some(format!("{MEMPLUG_ABI_MAJOR}.{agreed}"));
    let Some(plugin) = descriptor::plugin(&mut res, &desc, agreed) else {
        return finish(report, res);
    };
    report.plugin_name = Some(plugin.name.clone());
    report.plugin_version = Some(plugin.version.clone());
    report.plugin_abi_range = Some(format!("1.{}..=1.{}", plugin.min_minor, plugin.max_minor));
    let published = descriptor::mechanisms(&mut res, &plugin);
    if let Some(want) = &opts.mechanism {
        if !published.iter().any(|d| &d.name == want) {
            return Err(Error::NoSuchMechanism {
                name: want.clone(),
                available: published.iter().map(|d| d.name.clone()).collect(),
            });
        }
    }
    let start_live = plugin.live();
    let mut checked = Vec::new();
    for d in &published {
        report.mechanisms.push(MechanismSummary {
            name: d.name.clone(),
            id: d.desc.mechanism_id,
            device: descriptor::device_string(d.desc.device),
            capabilities: descriptor::capability_names(d.desc.capabilities),
        });
        if opts.mechanism.as_ref().is_some_and(|w| w != &d.name) || !d.checkable {
            continue;
        }
        let Some(m) = descriptor::mechanism(&mut res, &ctx, &plugin, d) else {
            continue;
        };
        per_mechanism(&mut res, &ctx, &m);
        checked.push(m);
    }
    messages::finish(&mut res, &ctx, &plugin, &checked, start_live);
    finish(report, res)
}

fn per_mechanism(res: &mut Results, ctx: &Ctx, m: &Mech) {
    let mut st = MechState::default();
    let name = Some(m.name.as_str());
    allocator::run_all(res, ctx, m, &mut st);
    virtual_backing::run_all(res, ctx, m);
    shared_mapping::run_all(res, ctx, m);
    sync::run_all(res, ctx, m, &mut st);
    concurrency::run_all(res, ctx, m, &st);
    res.run("lifecycle.live_objects", name, || allocator::live_objects(ctx, m));
}

fn open(path: &Path) -> Result<libloading::Library, String> {
    let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL;
    // SAFETY: loading runs the library's initialisers: that is what
    // checking a plugin means; the path was chosen by the user.
    unsafe { libloading::os::unix::Library::open(Some(path), flags) }
        .map(libloading::Library::from)
        .map_err(|e| format!("not a loadable library: {e}"))
}

fn exports(path: &Path) -> Checked {
    let names = crate::elf::exported_symbols(path).map_err(Verdict::Fail)?;
    let extra: Vec<&String> = names.iter().filter(|n| !crate::elf::is_entry_symbol(n)).collect();
    let entries: Vec<&String> = names.iter().filter(|n| crate::elf::is_entry_symbol(n)).collect();
    ensure!(
        extra.is_empty(),
        "exports {} symbol(s) besides its entry symbols (build with -fvisibility=hidden and mark only \
         the entry MEMPLUG_EXPORT): {}",
        extra.len(),
        extra.iter().take(8).map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
    );
    ensure!(!entries.is_empty(), "exports no memplug_plugin_v<N> entry symbol");
    Ok(format!("exports only {}", entries.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")))
}

// ---------------------------------------------------------------------------
// Objects a check makes, released whatever way it ends
// ---------------------------------------------------------------------------

/// Tracks what a check made and releases, in dependency order, whatever is
/// left when it ends: gates are opened first (so no stream waits forever),
/// then fences, streams, mappings, physical-object references,
/// reservations and allocations.
pub(crate) struct Scope<'a> {
    pub m: &'a Mech,
    pub log: &'a Log,
    allocs: Vec<MemplugObjectRef>,
    reservations: Vec<MemplugObjectRef>,
    objects: Vec<MemplugObjectRef>,
    mappings: Vec<(MemplugObjectRef, u64, u64)>,
    streams: Vec<u64>,
    fences: Vec<u64>,
    gates: Vec<Arc<Gate>>,
}

impl<'a> Scope<'a> {
    pub(crate) fn new(ctx: &'a Ctx, m: &'a Mech) -> Self {
        Scope {
            m,
            log: &ctx.log,
            allocs: Vec::new(),
            reservations: Vec::new(),
            objects: Vec::new(),
            mappings: Vec::new(),
            streams: Vec::new(),
            fences: Vec::new(),
            gates: Vec::new(),
        }
    }

    fn forget(list: &mut Vec<MemplugObjectRef>, o: &MemplugObjectRef) {
        if let Some(i) = list.iter().position(|x| x == o) {
            list.swap_remove(i);
        }
    }

    /// Allocates; a success is tracked.
    pub(crate) fn allocate(&mut self, req: &MemplugRequest) -> Made {
        let made = self.m.allocate(self.log, req);
        if made.status == MEMPLUG_STATUS_OK {
            self.allocs.push(made.obj);
        }
        made
    }

    /// Allocates `size` bytes aligned to `align`, or fails the check.
    pub(crate) fn alloc_ok(&mut self, size: u64, align: u64) -> Result<MemplugObjectRef, Verdict> {
        let req = crate::raw::request(self.m, size, align);
        let made = self.allocate(&req);
        expect(made.status, &[MEMPLUG_STATUS_OK], &format!("allocate({size}, align {align})"))?;
        ensure!(
            made.block.addr != 0 && made.block.size >= size,
            "allocate({size}, align {align}) returned OK with address {:#x} and size {}",
            made.block.addr,
            made.block.size
        );
        Ok(made.obj)
    }

    pub(crate) fn free(&mut self, o: &MemplugObjectRef) -> MemplugStatus {
        let s = self.m.deallocate(self.log, o);
        if s == MEMPLUG_STATUS_OK {
            Self::forget(&mut self.allocs, o);
        }
        s
    }

    /// Reserves `size` bytes, or fails the check.
    pub(crate) fn reserve_ok(&mut self, size: u64) -> Result<MemplugObjectRef, Verdict> {
        let made = self.m.reserve(self.log, size);
        if made.status == MEMPLUG_STATUS_OK {
            self.reservations.push(made.obj);
        }
        expect(made.status, &[MEMPLUG_STATUS_OK], &format!("reserve({size})"))?;
        ensure!(
            made.block.addr != 0 && made.block.size >= size,
            "reserve({size}) returned OK with address {:#x} and size {}",
            made.block.addr,
            made.block.size
        );
        Ok(made.obj)
    }

    /// Reserves and tracks whatever the plugin says (for checks of the
    /// answer itself).
    pub(crate) fn reserve(&mut self, size: u64) -> Made {
        let made = self.m.reserve(self.log, size);
        if made.status == MEMPLUG_STATUS_OK {
            self.reservations.push(made.obj);
        }
        made
    }

    pub(crate) fn release_reservation(&mut self, r: &MemplugObjectRef) -> MemplugStatus {
        let s = self.m.release_reservation(self.log, r);
        if s == MEMPLUG_STATUS_OK {
            Self::forget(&mut self.reservations, r);
            self.mappings.retain(|(res, _, _)| res != r);
        }
        s
    }

    pub(crate) fn create(&mut self, size: u64) -> Made {
        let made = self.m.create(self.log, size);
        if made.status == MEMPLUG_STATUS_OK {
            self.objects.push(made.obj);
        }
        made
    }

    pub(crate) fn create_ok(&mut self, size: u64) -> Result<MemplugObjectRef, Verdict> {
        let made = self.create(size);
        expect(made.status, &[MEMPLUG_STATUS_OK], &format!("create({size})"))?;
        ensure!(made.block.size >= size, "create({size}) returned OK with size {}", made.block.size);
        Ok(made.obj)
    }

    /// Imports `size` bytes from `fd` (ABI 1.1); a success is tracked.
    pub(crate) fn import(&mut self, fd: i32, size: u64) -> Made {
        let made = self.m.import_fd(self.log, fd, size);
        if made.status == MEMPLUG_STATUS_OK {
            self.objects.push(made.obj);
        }
        made
    }

    pub(crate) fn retain(&mut self, o: &MemplugObjectRef) -> MemplugStatus {
        let s = self.m.retain(self.log, o);
        if s == MEMPLUG_STATUS_OK {
            self.objects.push(*o);
        }
        s
    }

    pub(crate) fn release_object(&mut self, o: &MemplugObjectRef) -> MemplugStatus {
        let s = self.m.release_object(self.log, o);
        if s == MEMPLUG_STATUS_OK {
            Self::forget(&mut self.objects, o);
        }
        s
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn map(
        &mut self,
        o: &MemplugObjectRef,
        object_offset: u64,
        r: &MemplugObjectRef,
        offset: u64,
        len: u64,
        access: u32,
    ) -> MemplugStatus {
        let s = self.m.map(self.log, o, object_offset, r, offset, len, access);
        if s == MEMPLUG_STATUS_OK {
            self.mappings.push((*r, offset, len));
        }
        s
    }

    pub(crate) fn unmap(&mut self, r: &MemplugObjectRef, offset: u64, len: u64) -> MemplugStatus {
        let s = self.m.unmap(self.log, r, offset, len);
        if s == MEMPLUG_STATUS_OK {
            if let Some(i) = self.mappings.iter().position(|x| *x == (*r, offset, len)) {
                self.mappings.swap_remove(i);
            }
        }
        s
    }

    pub(crate) fn stream_ok(&mut self) -> Result<u64, Verdict> {
        let (s, h) = self.m.stream_create(self.log);
        expect(s, &[MEMPLUG_STATUS_OK], "stream_create")?;
        ensure!(h != 0, "stream_create returned OK with the handle 0");
        self.streams.push(h);
        Ok(h)
    }

    pub(crate) fn stream_destroy(&mut self, h: u64) -> MemplugStatus {
        let s = self.m.stream_destroy(self.log, h);
        if s == MEMPLUG_STATUS_OK {
            self.streams.retain(|&x| x != h);
        }
        s
    }

    pub(crate) fn fence_ok(&mut self, stream: u64) -> Result<u64, Verdict> {
        let (s, h) = self.m.fence_record(self.log, stream);
        expect(s, &[MEMPLUG_STATUS_OK], "fence_record")?;
        ensure!(h != 0, "fence_record returned OK with the handle 0");
        self.fences.push(h);
        Ok(h)
    }

    pub(crate) fn fence_destroy(&mut self, h: u64) -> MemplugStatus {
        let s = self.m.fence_destroy(self.log, h);
        if s == MEMPLUG_STATUS_OK {
            self.fences.retain(|&x| x != h);
        }
        s
    }

    /// Enqueues `job` on `stream`, or fails the check.
    pub(crate) fn enqueue_ok(&mut self, stream: u64, job: Job) -> Result<(), Verdict> {
        if let Job::Gate(g) = &job {
            self.gates.push(g.clone());
        }
        let s = enqueue_job(self.m, self.log, stream, job);
        expect(s, &[MEMPLUG_STATUS_OK], "enqueue_host_fn")
    }
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        for g in self.gates.drain(..) {
            g.open();
        }
        for f in std::mem::take(&mut self.fences) {
            self.m.fence_destroy(self.log, f);
        }
        for s in std::mem::take(&mut self.streams) {
            self.m.stream_destroy(self.log, s);
        }
        for (r, off, len) in std::mem::take(&mut self.mappings) {
            self.m.unmap(self.log, &r, off, len);
        }
        for o in std::mem::take(&mut self.objects) {
            self.m.release_object(self.log, &o);
        }
        for r in std::mem::take(&mut self.reservations) {
            self.m.release_reservation(self.log, &r);
        }
        for a in std::mem::take(&mut self.allocs) {
            self.m.deallocate(self.log, &a);
        }
    }
}

// ---------------------------------------------------------------------------
// Host functions the kit enqueues on plugin streams
// ---------------------------------------------------------------------------

/// A gate a host function waits at until the kit opens it (or 30 s pass:
/// a stream worker is never held forever by the kit).
#[derive(Default)]
pub(crate) struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
    /// Set once the host function has passed the gate.
    pub passed: AtomicBool,
}

impl Gate {
    pub(crate) fn open(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }

    fn wait(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        while !*open {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            open = self.cv.wait_timeout(open, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        self.passed.store(true, Ordering::SeqCst);
    }
}

/// Work the kit puts on a stream.
pub(crate) enum Job {
    /// Sleeps, then sets the flag.
    SleepThenSet(Duration, Arc<AtomicBool>),
    /// Waits at the gate.
    Gate(Arc<Gate>),
    /// Appends a number.
    Push(Arc<Mutex<Vec<u32>>>, u32),
}

unsafe extern "C" fn run_job(userdata: *mut c_void) {
    // Runs on a plugin thread: nothing may unwind into it.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the Box leaked by `enqueue_job`, run once.
        let job = unsafe { Box::from_raw(userdata.cast::<Job>()) };
        match *job {
            Job::SleepThenSet(d, flag) => {
                std::thread::sleep(d);
                flag.store(true, Ordering::SeqCst);
            }
            Job::Gate(g) => g.wait(),
            Job::Push(v, n) => v.lock().unwrap_or_else(|e| e.into_inner()).push(n),
        }
    }));
}

/// Enqueues `job`; on refusal the job is dropped here (the plugin must
/// not run what it refused).
pub(crate) fn enqueue_job(m: &Mech, log: &Log, stream: u64, job: Job) -> MemplugStatus {
    let userdata = Box::into_raw(Box::new(job)).cast::<c_void>();
    let s = m.enqueue(log, stream, Some(run_job), userdata);
    if s != MEMPLUG_STATUS_OK {
        // SAFETY: refused, so never run: the box is still ours.
        drop(unsafe { Box::from_raw(userdata.cast::<Job>()) });
    }
    s
}

/// Runs `f` on its own thread and gives up on it after `limit` (a plugin
/// call that never returns must not stop the run; the thread is left).
pub(crate) fn bounded<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("memplug-conformance-bounded".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .ok()?;
    rx.recv_timeout(limit).ok()
}
