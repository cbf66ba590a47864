//! The load-time rules of ABI 1.2's peer access and queue-ordered binding,
//! broken one at a time: each capability only at an agreed minor of at
//! least 2, flag and pointer (or slots) agreeing, queued binding only with
//! virtual backing and sync and with tables long enough for its slots, and
//! the whole-word prefix rule (a `struct_size` that cuts a pointer leaves
//! it unpublished, never half-read).
//!
//! The plugin is a correct SDK plugin; a wrapping entry copies the
//! descriptor the SDK negotiated and changes one thing in it before the
//! host reads it. The same plugin unchanged loads at 1.2 and at 1.1, so
//! each refusal is the change's.

use memplug_host::{Access, LoadOptions, Plugin, Status};
use memplug_sdk::abi::*;
use memplug_sdk::*;
use std::cell::Cell;
use std::time::Duration;

const CPU3: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 3 };
const G: u64 = 4096;

/// Bookkeeping only (one reservation handle; nothing is made): the
/// refused cases never get past load.
struct Stub;

impl Allocator for Stub {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 16, max_alignment: 4096, granularity: G }
    }
    fn allocate(&self, _: &Request) -> PluginResult<Block> {
        Err(PluginError::out_of_memory("stub"))
    }
    fn deallocate(&self, _: &ObjectRef) -> PluginResult<()> {
        Ok(())
    }
}

impl VirtualBacking for Stub {
    fn reserve(&self, r: &Request) -> PluginResult<Block> {
        Ok(Block { addr: 1 << 32, size: r.size.div_ceil(G) * G, handle: 1 })
    }
    fn commit(&self, _: &ObjectRef, _: u64, _: u64) -> PluginResult<()> {
        Ok(())
    }
    fn decommit(&self, _: &ObjectRef, _: u64, _: u64) -> PluginResult<()> {
        Ok(())
    }
    fn committed_bytes(&self, _: &ObjectRef) -> PluginResult<u64> {
        Ok(0)
    }
    fn release(&self, _: &ObjectRef) -> PluginResult<()> {
        Ok(())
    }
    const CAN_QUEUE: bool = true;
    fn commit_on(&self, _: &ObjectRef, _: u64, _: u64, _: u64) -> PluginResult<u64> {
        Ok(1)
    }
    fn decommit_on(&self, _: &ObjectRef, _: u64, _: u64, _: u64) -> PluginResult<u64> {
        Ok(1)
    }
}

impl SharedMapping for Stub {
    fn create(&self, _: &Request) -> PluginResult<Block> {
        Err(PluginError::out_of_memory("stub"))
    }
    fn map(&self, _: &ObjectRef, _: u64, _: &ObjectRef, _: u64, _: u64, _: Access) -> PluginResult<()> {
        Ok(())
    }
    fn unmap(&self, _: &ObjectRef, _: u64, _: u64) -> PluginResult<()> {
        Ok(())
    }
    fn retain(&self, _: &ObjectRef) -> PluginResult<()> {
        Ok(())
    }
    fn release(&self, _: &ObjectRef) -> PluginResult<()> {
        Ok(())
    }
    const CAN_QUEUE_MAPS: bool = true;
    fn map_on(
        &self,
        _: &ObjectRef,
        _: u64,
        _: &ObjectRef,
        _: u64,
        _: u64,
        _: Access,
        _: u64,
    ) -> PluginResult<u64> {
        Ok(1)
    }
    fn unmap_on(&self, _: &ObjectRef, _: u64, _: u64, _: u64) -> PluginResult<u64> {
        Ok(1)
    }
}

impl StreamSync for Stub {
    fn stream_create(&self) -> PluginResult<u64> {
        Ok(1)
    }
    fn stream_destroy(&self, _: u64) -> PluginResult<()> {
        Ok(())
    }
    fn enqueue_host_fn(&self, _: u64, f: HostFn) -> PluginResult<()> {
        f.call();
        Ok(())
    }
    fn fence_record(&self, _: u64) -> PluginResult<u64> {
        Ok(1)
    }
    fn fence_query(&self, _: u64) -> PluginResult<FenceState> {
        Ok(FenceState::Complete)
    }
    fn fence_wait(&self, _: u64, _: Duration) -> PluginResult<FenceState> {
        Ok(FenceState::Complete)
    }
    fn fence_destroy(&self, _: u64) -> PluginResult<()> {
        Ok(())
    }
    const CAN_WAIT_FENCE: bool = true;
    fn stream_wait_fence(&self, _: u64, _: u64) -> PluginResult<()> {
        Ok(())
    }
}

impl PeerAccess for Stub {
    fn can_access_peer(&self, _: MemplugDevice) -> PluginResult<u32> {
        Ok(0)
    }
    fn set_peer_access(&self, _: &ObjectRef, _: u64, _: u64, _: MemplugDevice, _: u32) -> PluginResult<()> {
        Ok(())
    }
}

fn stub_plugin() -> ExportedPlugin {
    let b =
        MechanismBuilder::new("rules", 5, CPU3, Stub).virtual_backing().shared_mapping().sync().peer_access();
    PluginBuilder::new("rules", "1").mechanism(b.build()).live_objects(|| 0).build()
}
memplug_sdk::declare_entry!(sdk_entry, stub_plugin);

/// The descriptor the SDK negotiated, copied so that one thing can be
/// changed in it; `None`: the table is not published (NULL pointer).
struct Tables {
    mechanism: MemplugMechanism,
    virtual_backing: Option<MemplugVirtualBacking>,
    shared_mapping: Option<MemplugSharedMapping>,
    sync: Option<MemplugSync>,
    peer_access: Option<MemplugPeerAccess>,
}

thread_local! {
    /// The change the next negotiation makes (the host calls the entry on
    /// the loading thread).
    static CHANGE: Cell<fn(&mut Tables)> = const { Cell::new(|_| {}) };
}

unsafe fn copied<T: Copy>(p: *const T) -> Option<T> {
    // SAFETY: the SDK's tables are full current structs, live until unload.
    (!p.is_null()).then(|| unsafe { *p })
}

/// The SDK's entry, then the change, on leaked copies of its tables.
unsafe extern "C" fn changed_entry(
    host: *const MemplugHostInfo,
    out: *mut MemplugNegotiation,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    // SAFETY: the host's arguments, passed on.
    let st = unsafe { sdk_entry(host, out, sink) };
    if st != MEMPLUG_STATUS_OK {
        return st;
    }
    // SAFETY: on success the SDK wrote a descriptor with one mechanism.
    unsafe {
        let mut plugin = *(*out).plugin;
        let m = *plugin.mechanisms;
        let mut t = Tables {
            mechanism: *m,
            virtual_backing: copied(m.read().virtual_backing),
            shared_mapping: copied(m.read().shared_mapping),
            sync: copied(m.read().sync),
            peer_access: copied(m.read().peer_access),
        };
        CHANGE.with(|c| c.get())(&mut t);
        fn leak<T>(v: Option<T>) -> *const T {
            v.map_or(std::ptr::null(), |v| Box::leak(Box::new(v)) as *const T)
        }
        t.mechanism.virtual_backing = leak(t.virtual_backing);
        t.mechanism.shared_mapping = leak(t.shared_mapping);
        t.mechanism.sync = leak(t.sync);
        t.mechanism.peer_access = leak(t.peer_access);
        let list: &'static [*const MemplugMechanism; 1] =
            Box::leak(Box::new([Box::leak(Box::new(t.mechanism)) as *const _]));
        plugin.mechanisms = list.as_ptr();
        (*out).plugin = Box::leak(Box::new(plugin));
    }
    MEMPLUG_STATUS_OK
}

fn load(max_minor: u32, change: fn(&mut Tables)) -> Result<Plugin, String> {
    CHANGE.with(|c| c.set(change));
    let opts = LoadOptions { max_minor, ..LoadOptions::default() };
    // SAFETY: the SDK's plugin, its descriptor copied and changed.
    let r = unsafe { Plugin::from_entry(changed_entry, "rules", &opts) };
    CHANGE.with(|c| c.set(|_| {}));
    r.map_err(|e| e.to_string())
}

fn refused(max_minor: u32, change: fn(&mut Tables), parts: &[&str]) {
    match load(max_minor, change) {
        Ok(p) => {
            panic!("loaded at 1.{max_minor} ({:?}); expected a refusal saying {parts:?}", p.abi_version())
        }
        Err(msg) => {
            for part in parts {
                assert!(msg.contains(part), "the refusal does not say {part:?}: {msg}");
            }
        }
    }
}

/// Unchanged, the plugin loads at 1.2 with both capabilities and at 1.1
/// with neither (the SDK answers each host with its minor's descriptor).
#[test]
fn the_unchanged_plugin_loads_at_1_2_and_at_1_1() {
    let p = load(2, |_| {}).unwrap();
    let c = p.mechanisms()[0].capabilities();
    assert!(c.peer_access() && c.queued_binding(), "{c:?}");
    assert!(p.mechanisms()[0].peer_access().is_some());
    let p = load(1, |t| {
        // What the SDK published for 1.1: nothing of 1.2.
        assert_eq!(t.mechanism.capabilities & (MEMPLUG_CAP_PEER_ACCESS | MEMPLUG_CAP_QUEUED_BINDING), 0);
        assert!(t.mechanism.struct_size < MEMPLUG_MECHANISM_SIZE_1_2 || t.peer_access.is_none());
    })
    .unwrap();
    assert_eq!(p.abi_version(), (1, 1));
    let c = p.mechanisms()[0].capabilities();
    assert!(!c.peer_access() && !c.queued_binding() && p.mechanisms()[0].peer_access().is_none(), "{c:?}");
}

/// `MEMPLUG_CAP_PEER_ACCESS`: only at an agreed minor of at least 2, and
/// present if and only if the `peer_access` pointer is.
#[test]
fn the_host_refuses_peer_access_claimed_against_the_rules() {
    refused(
        1,
        |t| t.mechanism.capabilities |= MEMPLUG_CAP_PEER_ACCESS,
        &["MEMPLUG_CAP_PEER_ACCESS", "above the agreed minor"],
    );
    refused(2, |t| t.peer_access = None, &["MEMPLUG_CAP_PEER_ACCESS is set", "peer_access pointer is NULL"]);
    refused(
        2,
        |t| t.mechanism.capabilities &= !MEMPLUG_CAP_PEER_ACCESS,
        &["peer_access pointer is set", "MEMPLUG_CAP_PEER_ACCESS is not"],
    );
    refused(
        2,
        |t| {
            let p = t.peer_access.as_mut().unwrap();
            p.set_peer_access = None;
        },
        &["set_peer_access"],
    );
}

/// A mechanism whose `struct_size` ends before `peer_access` (80, the size
/// before it was appended) or cuts it (84) has not published it: the host
/// reads whole 8-byte words only, so with the flag the pointer is missing,
/// and without it the bytes past the prefix are never looked at.
#[test]
fn a_mechanism_cut_before_or_inside_peer_access_has_not_published_it() {
    for size in [MEMPLUG_MECHANISM_SIZE_1_2 - 8, MEMPLUG_MECHANISM_SIZE_1_2 - 4] {
        let msg = match size {
            80 => load(2, |t| t.mechanism.struct_size = 80),
            _ => load(2, |t| t.mechanism.struct_size = 84),
        }
        .err()
        .unwrap_or_else(|| panic!("a {size}-byte mechanism claiming peer access loaded"));
        assert!(msg.contains("peer_access pointer is NULL"), "{size}: {msg}");
        let p = match size {
            80 => load(2, |t| {
                t.mechanism.struct_size = 80;
                t.mechanism.capabilities &= !MEMPLUG_CAP_PEER_ACCESS;
            }),
            _ => load(2, |t| {
                t.mechanism.struct_size = 84;
                t.mechanism.capabilities &= !MEMPLUG_CAP_PEER_ACCESS;
            }),
        }
        .unwrap_or_else(|e| panic!("{size}: the pointer past the whole words was read: {e}"));
        let m = &p.mechanisms()[0];
        assert!(!m.capabilities().peer_access() && m.peer_access().is_none());
        assert!(m.capabilities().queued_binding(), "the rest of the mechanism is kept");
    }
}

/// `MEMPLUG_CAP_QUEUED_BINDING`: only at 1.2, only with virtual backing and
/// sync, with tables long enough for `commit_on`/`decommit_on` (and, with a
/// shared mapping, `map_on`/`unmap_on`), whose slots are then required.
#[test]
fn the_host_refuses_queued_binding_claimed_against_the_rules() {
    refused(
        1,
        |t| t.mechanism.capabilities |= MEMPLUG_CAP_QUEUED_BINDING,
        &["MEMPLUG_CAP_QUEUED_BINDING", "above the agreed minor"],
    );
    refused(
        2,
        |t| {
            t.mechanism.capabilities &= !MEMPLUG_CAP_SYNC;
            t.sync = None;
        },
        &["MEMPLUG_CAP_QUEUED_BINDING needs MEMPLUG_CAP_VIRTUAL_BACKING and MEMPLUG_CAP_SYNC"],
    );
    refused(
        2,
        |t| {
            t.mechanism.capabilities &= !MEMPLUG_CAP_VIRTUAL_BACKING;
            t.virtual_backing = None;
        },
        &["MEMPLUG_CAP_QUEUED_BINDING needs MEMPLUG_CAP_VIRTUAL_BACKING and MEMPLUG_CAP_SYNC"],
    );
    refused(
        2,
        |t| t.virtual_backing.as_mut().unwrap().struct_size = MEMPLUG_VIRTUAL_BACKING_SIZE_1_0,
        &["virtual_backing table is 48 bytes", "too short for commit_on/decommit_on (64)"],
    );
    // 60 bytes cut `decommit_on`: too short, never half-read.
    refused(
        2,
        |t| t.virtual_backing.as_mut().unwrap().struct_size = MEMPLUG_VIRTUAL_BACKING_SIZE_1_2 - 4,
        &["virtual_backing table is 60 bytes", "too short"],
    );
    refused(
        2,
        |t| t.shared_mapping.as_mut().unwrap().struct_size = MEMPLUG_SHARED_MAPPING_SIZE_1_2 - 16,
        &["shared_mapping table is 80 bytes", "too short for map_on/unmap_on (96)"],
    );
    refused(2, |t| t.virtual_backing.as_mut().unwrap().commit_on = None, &["commit_on"]);
    refused(2, |t| t.shared_mapping.as_mut().unwrap().unmap_on = None, &["unmap_on"]);
}

static STRAY_CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

unsafe extern "C" fn stray_wait(
    _: *mut core::ffi::c_void,
    _: u64,
    _: u64,
    _: *const MemplugMessageSink,
) -> MemplugStatus {
    STRAY_CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    MEMPLUG_STATUS_OK
}

unsafe extern "C" fn stray_commit_on(
    _: *mut core::ffi::c_void,
    _: *const MemplugObjectRef,
    _: u64,
    _: u64,
    _: u64,
    out: *mut u64,
    _: *const MemplugMessageSink,
) -> MemplugStatus {
    STRAY_CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    // SAFETY: the host's out-parameter, were it ever called.
    unsafe { *out = 1 };
    MEMPLUG_STATUS_OK
}

/// Below 1.2 the queued slots and the 1.2 sync slots are not read, whatever
/// the plugin left in tables of the 1.2 length: without the bits (which a
/// 1.1 plugin cannot claim) the host answers them `Unsupported` itself and
/// never calls the plugin's.
#[test]
fn at_1_1_the_slots_of_1_2_are_never_called() {
    let p = load(1, |t| {
        let v = t.virtual_backing.as_mut().unwrap();
        v.struct_size = MEMPLUG_VIRTUAL_BACKING_SIZE_1_2;
        v.commit_on = Some(stray_commit_on);
        let y = t.sync.as_mut().unwrap();
        y.struct_size = MEMPLUG_SYNC_SIZE_1_2;
        y.stream_wait_fence = Some(stray_wait);
    })
    .unwrap();
    assert_eq!(p.abi_version(), (1, 1));
    let m = &p.mechanisms()[0];
    let sync = m.sync().unwrap();
    let stream = sync.stream_create().unwrap();
    let f = sync.fence_record(&stream).unwrap();
    let e = sync.stream_wait_fence(&stream, &f).unwrap_err();
    assert_eq!(e.status, Status::Unsupported, "{e}");
    // SAFETY: test harness; the reservation is released below.
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let res = vb.reserve(4 * G).unwrap();
    let e = vb.commit_on(&res, 0, G, &stream).unwrap_err();
    assert_eq!(e.status, Status::Unsupported, "{e}");
    vb.release(res).unwrap();
    sync.fence_destroy(f).unwrap();
    sync.stream_destroy(stream).unwrap();
    assert_eq!(STRAY_CALLS.load(std::sync::atomic::Ordering::SeqCst), 0, "a 1.2 slot was called at 1.1");
}
