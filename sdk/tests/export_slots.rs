//! The export layer's contract, seen from a host: bad out-params are
//! refused before the plugin makes anything (nothing is stranded), short
//! host structs are refused, longer ones are read as prefixes, and pending
//! fences answer with a code and no message.

use memplug_sdk::abi::*;
use memplug_sdk::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

static MADE: AtomicU64 = AtomicU64::new(0);
const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

struct Counting;
impl Allocator for Counting {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 8, max_alignment: 8, granularity: 4096 }
    }
    fn allocate(&self, r: &Request) -> PluginResult<Block> {
        MADE.fetch_add(1, Ordering::SeqCst);
        Ok(Block { addr: 0x1000, size: r.size, handle: 9 })
    }
    fn deallocate(&self, _: &ObjectRef) -> PluginResult<()> {
        Ok(())
    }
}
impl StreamSync for Counting {
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
        Ok(FenceState::Pending)
    }
    fn fence_wait(&self, _: u64, _: Duration) -> PluginResult<FenceState> {
        Ok(FenceState::Pending)
    }
    fn fence_destroy(&self, _: u64) -> PluginResult<()> {
        Ok(())
    }
}

fn plugin() -> ExportedPlugin {
    PluginBuilder::new("counting", "1")
        .mechanism(MechanismBuilder::new("c", 1, CPU0, Counting).sync().build())
        .live_objects(|| 0)
        .build()
}
declare_entry!(entry, plugin);

struct Msgs(Vec<String>);
unsafe extern "C" fn keep(ctx: *mut std::ffi::c_void, msg: *const std::ffi::c_char, len: usize) {
    let m = &mut *(ctx as *mut Msgs);
    m.0.push(String::from_utf8_lossy(std::slice::from_raw_parts(msg.cast(), len)).into_owned());
}

fn mechanism() -> &'static MemplugMechanism {
    let host = MemplugHostInfo {
        struct_size: MEMPLUG_HOST_INFO_SIZE_1_0,
        abi_major: 1,
        min_minor: 0,
        max_minor: 0,
        host_name: std::ptr::null(),
        services: core::ptr::null(),
    };
    let mut out = MemplugNegotiation {
        struct_size: MEMPLUG_NEGOTIATION_SIZE_1_0,
        agreed_minor: 9,
        plugin: std::ptr::null(),
    };
    unsafe {
        assert_eq!(entry(&host, &mut out, std::ptr::null()), MEMPLUG_STATUS_OK);
        assert_eq!(out.agreed_minor, 0);
        &**(*out.plugin).mechanisms
    }
}

fn request(struct_size: u32) -> MemplugRequest {
    MemplugRequest {
        struct_size,
        flags: 0,
        size: 64,
        alignment: 8,
        object_id: 1,
        device: CPU0,
        class_tag: 0,
        reserved0: 0,
        ..Default::default()
    }
}

#[test]
fn a_bad_out_param_is_refused_before_anything_is_made() {
    let m = mechanism();
    let a = unsafe { &*m.allocator };
    let mut msgs = Msgs(Vec::new());
    let sink = MemplugMessageSink { ctx: (&mut msgs as *mut Msgs).cast(), write: Some(keep) };
    let before = MADE.load(Ordering::SeqCst);
    let req = request(MEMPLUG_REQUEST_SIZE_1_0);
    let st = unsafe { a.allocate.unwrap()(m.ctx, &req, std::ptr::null_mut(), &sink) };
    assert_eq!(st, MEMPLUG_STATUS_INVALID_ARGUMENT);
    let mut short = MemplugBlock { struct_size: 8, ..Default::default() };
    let st = unsafe { a.allocate.unwrap()(m.ctx, &req, &mut short, &sink) };
    assert_eq!(st, MEMPLUG_STATUS_INVALID_ARGUMENT);
    assert_eq!(short, MemplugBlock { struct_size: 8, ..Default::default() }, "nothing written on failure");
    assert_eq!(
        MADE.load(Ordering::SeqCst),
        before,
        "the plugin was asked to allocate for an out-param it cannot fill"
    );
    assert!(msgs.0[0].contains("out block is NULL"), "{:?}", msgs.0);
    assert!(msgs.0[1].contains("struct_size is 8"), "{:?}", msgs.0);
}

#[test]
fn short_requests_are_refused_and_long_ones_read_as_prefixes() {
    let m = mechanism();
    let a = unsafe { &*m.allocator };
    let mut out = MemplugBlock { struct_size: MEMPLUG_BLOCK_SIZE_1_0, ..Default::default() };
    let short = request(MEMPLUG_REQUEST_SIZE_1_0 - 8);
    assert_eq!(
        unsafe { a.allocate.unwrap()(m.ctx, &short, &mut out, std::ptr::null()) },
        MEMPLUG_STATUS_INVALID_ARGUMENT
    );
    // A newer host's longer request: the plugin reads the part it knows.
    #[repr(C)]
    struct Longer {
        base: MemplugRequest,
        future: [u64; 4],
    }
    let long = Longer { base: request(std::mem::size_of::<Longer>() as u32), future: [u64::MAX; 4] };
    assert_eq!(
        unsafe { a.allocate.unwrap()(m.ctx, &long.base, &mut out, std::ptr::null()) },
        MEMPLUG_STATUS_OK
    );
    assert_eq!((out.addr, out.size, out.handle, out.struct_size), (0x1000, 64, 9, MEMPLUG_BLOCK_SIZE_1_0));
}

#[test]
fn pending_fences_answer_with_a_code_and_no_message() {
    let m = mechanism();
    let s = unsafe { &*m.sync };
    let mut msgs = Msgs(Vec::new());
    let sink = MemplugMessageSink { ctx: (&mut msgs as *mut Msgs).cast(), write: Some(keep) };
    assert_eq!(unsafe { s.fence_query.unwrap()(m.ctx, 1, &sink) }, MEMPLUG_STATUS_NOT_READY);
    assert_eq!(unsafe { s.fence_wait.unwrap()(m.ctx, 1, 1000, &sink) }, MEMPLUG_STATUS_TIMEOUT);
    assert!(msgs.0.is_empty(), "{:?}", msgs.0);
}
