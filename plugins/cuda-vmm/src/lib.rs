//! memplug CUDA VMM plugin: the reference implementation of ABI 1.0 on the
//! CUDA driver API (through cudarc, loaded dynamically).
//!
//! Two mechanisms per CUDA device, sharing its primary context (ids from
//! [`mechanism_id_of`], never colliding): `cuda<N>-vmm` (id N + 1, device
//! `cuda:N`) for device memory, and `cuda<N>-host` (id 2^32 + N + 1,
//! device `cuda_host:N`) for page-locked host memory (`cuMemHostAlloc`;
//! allocator with `memory_info` of the machine's memory, and sync with the
//! copy, so device ↔ pinned copies run on either mechanism's streams; see
//! `pinned.rs`). A driver without `cuMemHostAlloc`/`cuMemFreeHost` gets
//! the device mechanisms only. The device mechanism has:
//!
//! * allocator — `cuMemAlloc`/`cuMemFree`; free/total from `cuMemGetInfo`;
//! * virtual backing — `cuMemAddressReserve`; commit creates one
//!   `cuMemCreate` chunk per granule, maps it and sets read-write access;
//!   decommit unmaps and releases; committed bytes are exact;
//! * shared mapping — physical objects mapped into several reservations,
//!   read-only views through `CU_MEM_ACCESS_FLAGS_PROT_READ`;
//! * export — objects created with `export_types` MEMPLUG_HANDLE_OPAQUE_FD
//!   are one shareable allocation (mapped only whole), exported and
//!   imported as CUDA POSIX-fd handles (`cuMemExportToShareableHandle`,
//!   `cuMemImportFromShareableHandle`; ABI 1.2 typed export only),
//!   offered where the device supports them (see `export.rs`);
//! * sync — CUDA streams (created, or a runtime's `CUstream` adopted), host
//!   functions through `cuLaunchHostFunc`, fences that are events.
//!
//! A device without VMM support gets a device mechanism with only the
//! allocator and sync. Each device's primary context is retained from the plugin's
//! first use of the device until the plugin is unloaded (as vLLM keeps it):
//! `memory_info` with nothing alive, or the last object going, never
//! creates or destroys a context.
//!
//! Without a usable driver (no `libcuda`, missing entry points, `cuInit`
//! failing, no device) the entry symbol fails with
//! `MEMPLUG_STATUS_DEVICE_UNAVAILABLE` and a message saying which: there is
//! no mechanism a runtime could use, and a descriptor with none would be
//! malformed. The library never panics across the boundary and never aborts.
//!
//! `MEMPLUG_CUDA_DRIVER=/path/to/libcuda.so.1` makes the plugin use that
//! library instead of the system's (tests use a fake, `fake-driver/`).
//!
//! A sticky CUDA error (the context is dead) is `MEMPLUG_STATUS_DEVICE_LOST`
//! once a host that agreed on ABI 1.2 holds the plugin (for both mechanisms
//! of the device), and the loss is reported to the hosts once per
//! mechanism through the SDK's `HostLink`
//! (the SDK then answers every slot of that mechanism itself); for 1.0/1.1
//! hosts it stays `DEVICE_UNAVAILABLE`. `MEMPLUG_CUDA_LOSS_POLL_MS=N` adds a
//! watcher that notices a dead context within `N` ms while no slot is
//! called. See `loss.rs`.

#![deny(missing_docs)]

mod allocator;
mod capture;
mod context;
mod copy;
mod device_facts;
#[doc(hidden)]
pub mod driver;
mod export;
mod freer;
mod handles;
mod loss;
mod mechanism;
mod peer;
mod pinned;
mod shared;
mod staging;
mod streams;
mod virtual_backing;

pub use mechanism::{
    mechanism_id, mechanism_id_of, mechanism_name, mechanism_name_of, pinned_mechanism_id,
    pinned_mechanism_name, MechanismKind, MAX_ALIGNMENT, MIN_ALIGNMENT,
};
pub use pinned::HOST_ALLOC_FLAGS;

pub use context::{EVENT_FLAGS, EVENT_POOL_MAX};
/// How long an allocation refused for memory waits for handed-over frees.
pub use freer::FLUSH_LIMIT;
/// Pageable copies: the staging chunk size and chunks per copy (`staging.rs`).
pub use staging::{CHUNK as STAGING_CHUNK, RING as STAGING_RING};
pub use streams::MAX_WAITERS;

pub use loss::POLL_ENV as LOSS_POLL_ENV;

use loss::{CurrentLine, LossLine, Watcher};
use mechanism::CudaMechanism;
use memplug_sdk::abi::{MemplugHostInfo, MemplugMessageSink, MemplugNegotiation, MemplugStatus};
use memplug_sdk::export::{guard, negotiate, PluginCell};
use memplug_sdk::{ExportedPlugin, HostLink, MechanismBuilder, PluginBuilder};

/// The exported entry's instance: its cell and its current loss line.
static EXPORTED: PluginCell = PluginCell::new();
static EXPORTED_LINE: CurrentLine = CurrentLine::new();
/// The in-process entry's instance.
static IN_PROCESS: PluginCell = PluginCell::new();
static IN_PROCESS_LINE: CurrentLine = CurrentLine::new();

/// memplug entry symbol, ABI major 1: the only symbol the library exports.
///
/// # Safety
/// Called by a memplug host according to `memplug.h`.
#[no_mangle]
pub unsafe extern "C" fn memplug_plugin_v1(
    host: *const MemplugHostInfo,
    out: *mut MemplugNegotiation,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    entry(&EXPORTED, &EXPORTED_LINE, plugin_exported, host, out, sink)
}

/// The same plugin as an in-process entry function, for hosts that link
/// this crate and register it with `Plugin::from_entry` (a separate
/// instance from the exported one). Not exported from the library.
///
/// # Safety
/// As for [`memplug_plugin_v1`].
pub unsafe extern "C" fn cuda_vmm_plugin_entry(
    host: *const MemplugHostInfo,
    out: *mut MemplugNegotiation,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    entry(&IN_PROCESS, &IN_PROCESS_LINE, plugin_in_process, host, out, sink)
}

/// Finds the driver (once per process) before negotiating. A host of
/// another major is left to `negotiate`, which reports the mismatch. After
/// a successful negotiation, tells the instance's loss line the agreed
/// minor (a dead context is DEVICE_LOST only for 1.2 hosts).
unsafe fn entry(
    cell: &'static PluginCell,
    line: &'static CurrentLine,
    init: fn() -> ExportedPlugin,
    host: *const MemplugHostInfo,
    out: *mut MemplugNegotiation,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    let status = guard(sink, "memplug_plugin_v1", || {
        let speaks_major_1 = !host.is_null()
            && host.cast::<u32>().read_unaligned() >= memplug_sdk::abi::MEMPLUG_HOST_INFO_SIZE_1_0
            && std::ptr::addr_of!((*host).abi_major).read_unaligned() == memplug_sdk::abi::MEMPLUG_ABI_MAJOR;
        if speaks_major_1 {
            driver::driver()?;
        }
        Ok(())
    });
    if status != memplug_sdk::abi::MEMPLUG_STATUS_OK {
        return status;
    }
    let status = negotiate(cell, init, host, out, sink);
    if status == memplug_sdk::abi::MEMPLUG_STATUS_OK {
        // SAFETY: the negotiation succeeded, so `out` is the host's answer
        // struct, which the SDK just wrote.
        line.host_agreed(std::ptr::addr_of!((*out).agreed_minor).read_unaligned());
    }
    status
}

fn plugin_exported() -> ExportedPlugin {
    plugin(&EXPORTED_LINE)
}

fn plugin_in_process() -> ExportedPlugin {
    plugin(&IN_PROCESS_LINE)
}

/// Builds the descriptor: the mechanisms of every device, sharing one loss
/// line (and, with `MEMPLUG_CUDA_LOSS_POLL_MS`, one watcher). Runs after
/// the entry found the driver, inside its negotiation.
fn plugin(current: &CurrentLine) -> ExportedPlugin {
    let driver = driver::driver().expect("the entry checked the driver before building the plugin");
    // The version names the driver file in use, so a check can print it
    // (made once: the driver is found once per process).
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let version: &'static str = VERSION.get_or_init(|| {
        format!("{} (CUDA driver {}: {})", env!("CARGO_PKG_VERSION"), driver.version, driver.loaded_path)
    });
    let link = HostLink::new();
    let line = LossLine::new(&link);
    current.set(&line);
    let mut builder = PluginBuilder::new("memplug-cuda-vmm", version).host_link(&link);
    let mut states: Vec<memplug_sdk::MechanismState<CudaMechanism>> = Vec::new();
    // The device mechanisms: one context each, so the watcher asks these.
    let mut contexts: Vec<memplug_sdk::MechanismState<CudaMechanism>> = Vec::new();
    for info in &driver.devices {
        let pinned_blocks = driver.host_alloc.map(|_| std::sync::Arc::default());
        let m = CudaMechanism::new(driver, info, std::sync::Arc::clone(&line), pinned_blocks.clone());
        let vmm = m.has_vmm();
        let device = m.device;
        let mut mb =
            MechanismBuilder::new(&mechanism_name(info.ordinal), mechanism_id(info.ordinal), device, m);
        if vmm {
            mb = mb.virtual_backing().shared_mapping();
        }
        if vmm && driver.devices.len() > 1 {
            // Peers exist only with another device; access to a range is
            // set with cuMemSetAccess, which needs VMM.
            mb = mb.peer_access();
        }
        let identity = info.facts.identity();
        if identity.valid != 0 {
            mb = mb.identity(identity);
        }
        mb = mb.sync();
        // Counted, not leaked: each mechanism (and the primary context it
        // keeps retained) is freed when the plugin is unloaded.
        let state = mb.state();
        states.push(state.clone());
        contexts.push(state.clone());
        builder = builder.mechanism(mb.build());
        if let Some(p) = pinned_blocks.and_then(|blocks| CudaMechanism::pinned(state, blocks)) {
            let mb = MechanismBuilder::new(&p.name.clone(), p.id, p.device, p).sync();
            states.push(mb.state());
            builder = builder.mechanism(mb.build());
        }
    }
    // Stopped and joined when the plugin is freed (with this closure).
    let watcher = loss::poll_period().and_then(|period| Watcher::start(period, contexts));
    builder
        .live_objects(move || {
            let _watching = &watcher;
            states.iter().map(|m| m.live_objects()).sum()
        })
        .build()
}
