//! The plugin the README's "Write a plugin in Rust" shows, as a crate that
//! builds: the code between the `README` markers below is the README's
//! snippet, character for character (`tests/readme.rs` fails when they
//! differ), and `tests/conformance.rs` runs the conformance kit on the
//! built library.

// README: begin
use memplug_sdk::{abi, *};
use std::alloc::{alloc, dealloc, Layout};
use std::collections::{hash_map::Entry, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// What an allocation was made as, to check references against.
struct Live {
    object_id: u64,
    addr: u64,
    layout: Layout,
}

impl Live {
    fn is(&self, obj: &ObjectRef) -> bool {
        (self.object_id, self.addr, self.layout.size() as u64) == (obj.object_id, obj.addr, obj.size)
    }
}

#[derive(Default)]
struct MyMemory {
    last_handle: AtomicU64,
    live: Mutex<HashMap<u64, Live>>,
}

impl Allocator for MyMemory {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 16, max_alignment: 4096, granularity: 0 }
    }

    // The SDK has refused unknown flags, size 0, a bad alignment and another
    // device, and raised r.alignment to min_alignment.
    fn allocate(&self, r: &Request) -> PluginResult<Block> {
        let no_memory = || PluginError::out_of_memory(format!("cannot allocate {} bytes", r.size));
        let layout =
            Layout::from_size_align(r.size as usize, r.alignment as usize).map_err(|_| no_memory())?;
        // SAFETY: the layout is not zero-sized (the SDK refused size 0).
        let p = unsafe { alloc(layout) };
        if p.is_null() {
            return Err(no_memory());
        }
        let handle = self.last_handle.fetch_add(1, Ordering::Relaxed) + 1;
        let live = Live { object_id: r.object_id, addr: p as u64, layout };
        self.live.lock().unwrap().insert(handle, live);
        Ok(Block { addr: p as u64, size: r.size, handle })
    }

    // The SDK has refused references of another mechanism or device; the
    // handle, and that the reference is the allocation's, are ours to check.
    fn deallocate(&self, obj: &ObjectRef) -> PluginResult<()> {
        match self.live.lock().unwrap().entry(obj.handle) {
            Entry::Occupied(e) if e.get().is(obj) => {
                let l = e.remove();
                // SAFETY: made by `allocate` with this layout, and out of
                // the table now, so freed once.
                unsafe { dealloc(l.addr as *mut u8, l.layout) };
                Ok(())
            }
            _ => Err(PluginError::unknown_allocation(format!("handle {} is no live allocation", obj.handle))),
        }
    }
}

fn plugin() -> ExportedPlugin {
    let cpu0 = abi::MemplugDevice { kind: abi::MEMPLUG_DEVICE_CPU, ordinal: 0 };
    let mine = MechanismBuilder::new("mine", 1, cpu0, MyMemory::default());
    let state = mine.state(); // freed with the plugin when the host unloads it
    PluginBuilder::new("my-plugin", env!("CARGO_PKG_VERSION"))
        .mechanism(mine.build())
        .live_objects(move || state.live.lock().unwrap().len() as u64)
        .build()
}
memplug_sdk::export_plugin!(plugin);
// README: end
