//! The plugin's allocator called straight through its vtable, with no host
//! wrapper: the baseline the host's overhead is measured against in the
//! benchmarks (`benches/mechanism.rs`, `benches/binding.rs`) and in the
//! instruction counts (`examples/hotpath.rs`, which includes this file by
//! path, run by `scripts/callgrind.sh`). Not part of the library.

use memplug_sdk::abi::*;
use std::ffi::c_void;

/// Raw allocate/deallocate slots of one mechanism, after negotiation.
#[derive(Clone, Copy)]
pub struct DirectAllocator {
    ctx: *mut c_void,
    mechanism_id: u64,
    device: MemplugDevice,
    allocate: unsafe extern "C" fn(
        *mut c_void,
        *const MemplugRequest,
        *mut MemplugBlock,
        *const MemplugMessageSink,
    ) -> MemplugStatus,
    deallocate: unsafe extern "C" fn(
        *mut c_void,
        *const MemplugObjectRef,
        *const MemplugMessageSink,
    ) -> MemplugStatus,
}

impl DirectAllocator {
    /// Negotiates with `entry` and takes the first mechanism's allocator.
    ///
    /// # Safety
    /// `entry` must be a well-behaved `memplug_plugin_v1`, and the library
    /// it comes from must stay loaded while this value is used.
    pub unsafe fn first_mechanism(entry: MemplugEntryV1) -> Option<DirectAllocator> {
        let host = MemplugHostInfo {
            struct_size: MEMPLUG_HOST_INFO_SIZE_1_0,
            abi_major: 1,
            min_minor: 0,
            max_minor: MEMPLUG_ABI_MINOR,
            host_name: core::ptr::null(),
            services: core::ptr::null(),
        };
        let mut out = MemplugNegotiation {
            struct_size: MEMPLUG_NEGOTIATION_SIZE_1_0,
            agreed_minor: 0,
            plugin: core::ptr::null(),
        };
        if entry(&host, &mut out, core::ptr::null()) != MEMPLUG_STATUS_OK || out.plugin.is_null() {
            return None;
        }
        let m = &**(*out.plugin).mechanisms;
        let a = &*m.allocator;
        Some(DirectAllocator {
            ctx: m.ctx,
            mechanism_id: m.mechanism_id,
            device: m.device,
            allocate: a.allocate?,
            deallocate: a.deallocate?,
        })
    }

    /// One allocate+deallocate pair; returns the address (for `black_box`).
    #[inline]
    pub fn pair(&self, size: u64, alignment: u64, object_id: u64) -> u64 {
        let req = MemplugRequest {
            struct_size: MEMPLUG_REQUEST_SIZE_1_0,
            flags: 0,
            size,
            alignment,
            object_id,
            device: self.device,
            class_tag: 0,
            reserved0: 0,
            ..Default::default()
        };
        let mut b = MemplugBlock { struct_size: MEMPLUG_BLOCK_SIZE_1_0, ..Default::default() };
        // SAFETY: slots of a negotiated plugin; pointers live for the calls.
        unsafe {
            let st = (self.allocate)(self.ctx, &req, &mut b, core::ptr::null());
            if st != MEMPLUG_STATUS_OK {
                failed("allocate", st);
            }
            let r = MemplugObjectRef {
                struct_size: MEMPLUG_OBJECT_REF_SIZE_1_0,
                reserved0: 0,
                mechanism_id: self.mechanism_id,
                device: self.device,
                object_id,
                addr: b.addr,
                size: b.size,
                handle: b.handle,
            };
            let st = (self.deallocate)(self.ctx, &r, core::ptr::null());
            if st != MEMPLUG_STATUS_OK {
                failed("deallocate", st);
            }
        }
        b.addr
    }
}

/// The panic of a failed slot call, out of line: an `assert_eq!` in the
/// loop would keep each status in memory for its message, two stores per
/// pair that callgrind would count as the path's.
#[cold]
#[inline(never)]
fn failed(slot: &str, status: MemplugStatus) -> ! {
    panic!("direct {slot} failed with status {status}")
}
