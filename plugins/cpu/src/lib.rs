//! memplug CPU plugin: the reference implementation of every capability of
//! ABI 1.1 on host memory.
//!
//! One mechanism, `"cpu"` (id 1, device CPU 0):
//!
//! * allocator — `std::alloc` with any power-of-two alignment up to 1 GiB;
//! * virtual backing — `PROT_NONE` reservations, committed with `mprotect`,
//!   decommitted with `MADV_DONTNEED` so the memory really goes back;
//! * shared mapping — sealed memfds mapped `MAP_SHARED|MAP_FIXED` into
//!   reservations, exported to and imported from other processes as file
//!   descriptors (ABI 1.1); the class each object was tagged with is
//!   visible through [`live_physical_objects`];
//! * sync — streams that are worker threads, fences that are condition
//!   variables.
//!
//! Two entry points serve the same plugin: the exported `memplug_plugin_v1`
//! (for hosts that load the cdylib) and [`cpu_plugin_entry`] (for hosts that
//! link this crate and register the plugin in-process). Each builds its own
//! instance, so objects made through one are unknown to the other.
//!
//! ABI 1.2: the plugin speaks 1.0 to 1.2 and carries a [`HostLink`], so a
//! loss reported for `"cpu"` latches it (every slot then answers
//! `MEMPLUG_STATUS_DEVICE_LOST`) and reaches every 1.2 host. Host memory is
//! never lost by itself: the only way to report a loss is the **test-only**
//! switch [`memplug_cpu_test_report_loss`], an exported C function
//! (`MemplugStatus memplug_cpu_test_report_loss(uint64_t mechanism_id)`)
//! that refuses with `MEMPLUG_STATUS_INVALID_STATE` and does nothing unless
//! `MEMPLUG_CPU_TEST_SWITCHES=1` was set when the plugin instance was built
//! (its first negotiation, or the first after an unload); it is never on by
//! default. It is the library's one export besides `memplug_plugin_v1`. See
//! [`test_switches`] for its answers.

#![deny(missing_docs)]

mod allocator;
mod checks;
mod classes;
mod fd_sharing;
mod handles;
mod mechanism;
mod meminfo;
mod os;
mod ranges;
mod reservations;
mod shared;
mod slots;
mod streams;
pub mod test_switches;
mod virtual_backing;

pub use classes::live_physical_objects;
use mechanism::{CpuMechanism, DEVICE, MECHANISM_ID, MECHANISM_NAME};
use memplug_sdk::{ExportedPlugin, HostLink, MechanismBuilder, PluginBuilder};
pub use test_switches::memplug_cpu_test_report_loss;

memplug_sdk::export_plugin!(plugin);
memplug_sdk::declare_entry!(pub cpu_plugin_entry, plugin);

/// Builds the plugin descriptor; the SDK calls it once per entry point, on
/// the first negotiation.
fn plugin() -> ExportedPlugin {
    let mechanism = MechanismBuilder::new(MECHANISM_NAME, MECHANISM_ID, DEVICE, CpuMechanism::new())
        .virtual_backing()
        .shared_mapping()
        .sync()
        // A CPU device's ordinal is its NUMA node (ABI 1.2); this mechanism
        // serves node 0's ordinal without binding memory to it (its
        // location says host memory, no particular node).
        .identity(memplug_sdk::DeviceIdentity {
            valid: memplug_sdk::abi::MEMPLUG_IDENTITY_NUMA_NODE,
            numa_node: DEVICE.ordinal,
            ..Default::default()
        });
    // Freed with the plugin when the host unloads it.
    let state = mechanism.state();
    // The instance's line to its hosts; only the test switch uses it.
    let link = HostLink::new();
    // Held by the instance (through the closure below), so the switch
    // addresses this instance only while it lives.
    let switches = test_switches::Switches::for_new_instance(&link);
    PluginBuilder::new("memplug-cpu", env!("CARGO_PKG_VERSION"))
        .mechanism(mechanism.build())
        .host_link(&link)
        .live_objects(move || {
            let _kept = &switches;
            state.live_objects()
        })
        .build()
}
