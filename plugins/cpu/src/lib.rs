//! memplug CPU plugin: the reference implementation of every capability of
//! ABI 1.2 on host memory.
//!
//! Its mechanisms (ABI 1.2's memory descriptor made real):
//!
//! * `"cpu"` (id 1, device CPU 0) — host memory on no particular node,
//!   base pages; allocations from the system allocator;
//! * `"cpu-node<N>"` (id 0x100 + N, device CPU N) — one per NUMA node with
//!   memory: every page bound to node N with `mbind(MPOL_BIND)`, located at
//!   that node, zero-filled;
//! * `"cpu-huge-2m"` (id 2, device CPU 0) — memory backed by 2 MiB
//!   transparent huge pages, faulted in and collapsed when committed, so a
//!   commit the kernel cannot back with huge pages is refused; no shared
//!   mapping (see `flavor.rs`);
//! * `"dmabuf-system"` (id 3, device CPU 0) — memory from the kernel's
//!   system dma-buf heap, every object a dma-buf a device driver can
//!   import (exported as `MEMPLUG_HANDLE_DMABUF_FD`; see `dma_heap.rs`).
//!
//! The last three are published only where the machine serves them (a probe
//! at start-up; [`offers`] says what was found and why anything is
//! missing). Each mechanism has every capability:
//!
//! * allocator — `"cpu"`: `std::alloc` with any power-of-two alignment up to
//!   1 GiB; the others: one fresh mapping per allocation;
//! * virtual backing — `PROT_NONE` reservations, committed with `mprotect`,
//!   decommitted with `MADV_DONTNEED` so the memory really goes back;
//! * shared mapping (not `"cpu-huge-2m"`) — sealed memfds mapped
//!   `MAP_SHARED|MAP_FIXED` into reservations, exported to and imported
//!   from other processes as file descriptors (ABI 1.1; typed as memfds in
//!   1.2); the class each object was tagged with is visible through
//!   [`live_physical_objects`];
//! * sync — streams that are worker threads, fences that are condition
//!   variables.
//!
//! Two entry points serve the same plugin: the exported `memplug_plugin_v1`
//! (for hosts that load the cdylib) and [`cpu_plugin_entry`] (for hosts that
//! link this crate and register the plugin in-process). Each builds its own
//! instance, so objects made through one are unknown to the other.
//!
//! ABI 1.2: the plugin speaks 1.0 to 1.2 and carries a [`HostLink`], so a
//! loss reported for one of its mechanisms latches it (every slot then
//! answers `MEMPLUG_STATUS_DEVICE_LOST`) and reaches every 1.2 host. Host
//! memory is never lost by itself: the only way to report a loss is the
//! **test-only** switch [`memplug_cpu_test_report_loss`], an exported C
//! function (`MemplugStatus memplug_cpu_test_report_loss(uint64_t
//! mechanism_id)`) that refuses with `MEMPLUG_STATUS_INVALID_STATE` and does
//! nothing unless `MEMPLUG_CPU_TEST_SWITCHES=1` was set when the plugin
//! instance was built (its first negotiation, or the first after an
//! unload); it is never on by default. It is the library's one export
//! besides `memplug_plugin_v1`. See [`test_switches`] for its answers.

#![deny(missing_docs)]

mod allocator;
mod checks;
mod classes;
mod copy;
mod dma_heap;
mod fd_sharing;
mod flavor;
mod handles;
mod mapped_allocations;
mod mappings;
mod mechanism;
mod meminfo;
mod os;
mod queued;
mod ranges;
mod reservations;
mod shared;
mod slots;
mod streams;
pub mod test_switches;
mod virtual_backing;

pub use classes::live_physical_objects;
pub use flavor::Offer;
use flavor::{Flavor, CPU_ID};
use mechanism::CpuMechanism;
use memplug_sdk::{BuiltMechanism, ExportedPlugin, HostLink, MechanismBuilder, PluginBuilder};
use std::sync::Arc;
pub use test_switches::memplug_cpu_test_report_loss;

memplug_sdk::export_plugin!(plugin);
memplug_sdk::declare_entry!(pub cpu_plugin_entry, plugin);

/// A mechanism this machine serves, with the flavour it is built over.
enum Found {
    Base(flavor::Base),
    Node(flavor::Node),
    Huge(flavor::Huge),
    Heap(dma_heap::DmaHeap),
}

/// Every mechanism the plugin knows, in the order it publishes them, with
/// its flavour where this machine serves it (the one list both
/// [`offers`] and the descriptor are made from). Probes the machine.
fn candidates() -> Vec<(Offer, Option<Found>)> {
    let cpu = Offer { name: "cpu".into(), id: CPU_ID, device: flavor::cpu_device(0), not_offered: None };
    let mut all = vec![(cpu, Some(Found::Base(flavor::Base::new())))];
    all.extend(flavor::node_mechanisms().into_iter().map(|(o, f)| (o, f.map(Found::Node))));
    let (o, f) = flavor::huge_mechanism();
    all.push((o, f.map(Found::Huge)));
    let (o, f) = dma_heap::dma_heap_mechanism();
    all.push((o, f.map(Found::Heap)));
    all
}

/// The mechanisms this plugin publishes on this machine, in order, and
/// those it would publish elsewhere with why not here. Probes the machine
/// afresh (maps and touches a page or two).
pub fn offers() -> Vec<Offer> {
    candidates().into_iter().map(|(o, _)| o).collect()
}

/// One built mechanism and the count of what it holds alive.
type Built = (BuiltMechanism, Arc<dyn Fn() -> u64 + Send + Sync>);

/// `name`'s mechanism over `flavor`, with every capability the flavour has.
fn build<F: Flavor>(name: &str, id: u64, node: u32, flavor: F) -> Built {
    let device = flavor::cpu_device(node);
    let mut m = MechanismBuilder::new(name, id, device, CpuMechanism::new(name, flavor))
        .virtual_backing()
        .sync()
        // A CPU device's ordinal is its NUMA node (ABI 1.2). `"cpu"` serves
        // node 0's ordinal without binding memory to it (its location says
        // host memory, no particular node).
        .identity(flavor::identity(node));
    if F::SHARED {
        m = m.shared_mapping();
    }
    let state = m.state();
    (m.build(), Arc::new(move || state.live_objects()))
}

/// Builds the plugin descriptor; the SDK calls it once per entry point, on
/// the first negotiation.
fn plugin() -> ExportedPlugin {
    let mechanisms: Vec<Built> = candidates()
        .into_iter()
        .filter_map(|(o, found)| {
            let (name, id, node) = (o.name.as_str(), o.id, o.device.ordinal);
            Some(match found? {
                Found::Base(f) => build(name, id, node, f),
                Found::Node(f) => build(name, id, node, f),
                Found::Huge(f) => build(name, id, node, f),
                Found::Heap(f) => build(name, id, node, f),
            })
        })
        .collect();
    // The instance's line to its hosts; only the test switch uses it.
    let link = HostLink::new();
    // Held by the instance (through the closure below), so the switch
    // addresses this instance only while it lives.
    let switches = test_switches::Switches::for_new_instance(&link);
    let mut plugin = PluginBuilder::new("memplug-cpu", env!("CARGO_PKG_VERSION")).host_link(&link);
    let mut counts = Vec::with_capacity(mechanisms.len());
    for (m, count) in mechanisms {
        plugin = plugin.mechanism(m);
        counts.push(count);
    }
    plugin
        .live_objects(move || {
            let _kept = &switches;
            counts.iter().map(|c| c()).sum()
        })
        .build()
}
