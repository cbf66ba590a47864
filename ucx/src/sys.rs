//! The handful of UCP calls this crate makes, declared by hand and resolved
//! at run time from `libucp.so.0`.
//!
//! Why by hand and at run time, not bindgen and `-lucp`:
//! * the crate must build on a machine without UCX (the workspace builds
//!   everywhere; only this crate's tests need UCX, and they skip with a
//!   message when it is absent). Linking `-lucp` would fail the build;
//!   bindgen would need the headers and libclang at build time;
//! * `libucp.so.0` is the ABI name (the soname Debian's `libucx0` ships);
//!   the unversioned `libucp.so` exists only with the `-dev` package;
//! * the declarations are few, and `tests/layout.rs` compiles a C program
//!   against the system's `<ucp/api/ucp.h>` (when present) that prints
//!   every size, offset and constant used here, and compares: a UCX whose
//!   ABI moved fails that test rather than corrupting memory.
//!
//! Only the fields and flags this crate sets are named; structs are
//! declared whole (every field up to the end) so UCX never reads past
//! them, and zero-initialised so unused fields are what UCX expects for a
//! field whose `field_mask` bit is clear.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

/// `ucs_status_t`: a packed (one byte) signed enum in UCX 1.x.
pub type ucs_status_t = i8;
pub type ucs_status_ptr_t = *mut c_void;
pub type ucp_context_h = *mut c_void;
pub type ucp_worker_h = *mut c_void;
pub type ucp_ep_h = *mut c_void;
pub type ucp_mem_h = *mut c_void;
pub type ucp_rkey_h = *mut c_void;
pub type ucp_config_t = c_void;
pub type ucp_address_t = c_void;

pub const UCS_OK: ucs_status_t = 0;
pub const UCS_INPROGRESS: ucs_status_t = 1;
pub const UCS_ERR_UNREACHABLE: ucs_status_t = -6;
pub const UCS_ERR_CANCELED: ucs_status_t = -16;
pub const UCS_ERR_TIMED_OUT: ucs_status_t = -20;
pub const UCS_ERR_LAST: ucs_status_t = -100;

pub const UCP_API_MAJOR: c_uint = 1;
/// The oldest minor this crate's structs match (Debian bookworm: 1.13).
pub const UCP_API_MINOR: c_uint = 13;

pub const UCP_PARAM_FIELD_FEATURES: u64 = 1 << 0;
pub const UCP_PARAM_FIELD_MT_WORKERS_SHARED: u64 = 1 << 5;
pub const UCP_FEATURE_RMA: u64 = 1 << 1;
pub const UCP_WORKER_PARAM_FIELD_THREAD_MODE: u64 = 1 << 0;
pub const UCS_THREAD_MODE_SERIALIZED: c_int = 1;
pub const UCP_EP_PARAM_FIELD_REMOTE_ADDRESS: u64 = 1 << 0;
pub const UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE: u64 = 1 << 1;
pub const UCP_EP_PARAM_FIELD_ERR_HANDLER: u64 = 1 << 2;
pub const UCP_ERR_HANDLING_MODE_NONE: c_int = 0;
pub const UCP_ERR_HANDLING_MODE_PEER: c_int = 1;
pub const UCP_EP_CLOSE_FLAG_FORCE: u32 = 1 << 0;
pub const UCP_MEM_MAP_PARAM_FIELD_ADDRESS: u64 = 1 << 0;
pub const UCP_MEM_MAP_PARAM_FIELD_LENGTH: u64 = 1 << 1;
pub const UCP_MEM_MAP_PARAM_FIELD_PROT: u64 = 1 << 3;
pub const UCP_MEM_MAP_PROT_LOCAL_READ: c_uint = 1 << 0;
pub const UCP_MEM_MAP_PROT_LOCAL_WRITE: c_uint = 1 << 1;
pub const UCP_MEM_MAP_PROT_REMOTE_READ: c_uint = 1 << 8;
pub const UCP_MEM_MAP_PROT_REMOTE_WRITE: c_uint = 1 << 9;
pub const UCP_OP_ATTR_FIELD_FLAGS: u32 = 1 << 4;

#[repr(C)]
pub struct ucp_params_t {
    pub field_mask: u64,
    pub features: u64,
    pub request_size: usize,
    pub request_init: *mut c_void,
    pub request_cleanup: *mut c_void,
    pub tag_sender_mask: u64,
    pub mt_workers_shared: c_int,
    pub estimated_num_eps: usize,
    pub estimated_num_ppn: usize,
    pub name: *const c_char,
}

/// `ucs_cpu_set_t`: `CPU_SETSIZE` (1024) bits.
#[repr(C)]
pub struct ucs_cpu_set_t {
    pub bits: [libc::c_ulong; 1024 / (8 * std::mem::size_of::<libc::c_ulong>())],
}

#[repr(C)]
pub struct ucp_worker_params_t {
    pub field_mask: u64,
    pub thread_mode: c_int,
    pub cpu_mask: ucs_cpu_set_t,
    pub events: c_uint,
    pub user_data: *mut c_void,
    pub event_fd: c_int,
    pub flags: u64,
    pub name: *const c_char,
    pub am_alignment: usize,
    pub client_id: u64,
}

pub type ucp_err_handler_cb_t = unsafe extern "C" fn(arg: *mut c_void, ep: ucp_ep_h, status: ucs_status_t);

#[repr(C)]
pub struct ucp_err_handler_t {
    pub cb: Option<ucp_err_handler_cb_t>,
    pub arg: *mut c_void,
}

#[repr(C)]
pub struct ucs_sock_addr_t {
    pub addr: *const c_void,
    pub addrlen: libc::socklen_t,
}

#[repr(C)]
pub struct ucp_ep_params_t {
    pub field_mask: u64,
    pub address: *const ucp_address_t,
    pub err_mode: c_int,
    pub err_handler: ucp_err_handler_t,
    pub user_data: *mut c_void,
    pub flags: c_uint,
    pub sockaddr: ucs_sock_addr_t,
    pub conn_request: *mut c_void,
    pub name: *const c_char,
    pub local_sockaddr: ucs_sock_addr_t,
}

#[repr(C)]
pub struct ucp_mem_map_params_t {
    pub field_mask: u64,
    pub address: *mut c_void,
    pub length: usize,
    pub flags: c_uint,
    pub prot: c_uint,
    pub memory_type: c_int,
}

#[repr(C)]
pub struct ucp_request_param_t {
    pub op_attr_mask: u32,
    pub flags: u32,
    pub request: *mut c_void,
    /// A union of callbacks; none is set here (requests are polled).
    pub cb: *mut c_void,
    pub datatype: u64,
    pub user_data: *mut c_void,
    pub reply_buffer: *mut c_void,
    pub memory_type: c_int,
    pub recv_info: *mut c_void,
    pub memh: ucp_mem_h,
}

macro_rules! zeroed_default {
    ($($t:ty),*) => {$(
        impl Default for $t {
            fn default() -> Self {
                // SAFETY: plain C data (integers, raw pointers, an optional
                // function pointer): all-zero is a valid value of each, and
                // what UCX expects of a field whose mask bit is clear.
                unsafe { std::mem::zeroed() }
            }
        }
    )*};
}
zeroed_default!(
    ucp_params_t,
    ucp_worker_params_t,
    ucp_ep_params_t,
    ucp_mem_map_params_t,
    ucp_request_param_t
);

/// The UCP entry points, resolved once from `libucp.so.0`.
pub struct Ucp {
    _lib: libloading::Library,
    pub config_read:
        unsafe extern "C" fn(*const c_char, *const c_char, *mut *mut ucp_config_t) -> ucs_status_t,
    pub config_release: unsafe extern "C" fn(*mut ucp_config_t),
    pub config_modify: unsafe extern "C" fn(*mut ucp_config_t, *const c_char, *const c_char) -> ucs_status_t,
    pub init_version: unsafe extern "C" fn(
        c_uint,
        c_uint,
        *const ucp_params_t,
        *const ucp_config_t,
        *mut ucp_context_h,
    ) -> ucs_status_t,
    pub cleanup: unsafe extern "C" fn(ucp_context_h),
    pub get_version: unsafe extern "C" fn(*mut c_uint, *mut c_uint, *mut c_uint),
    pub worker_create:
        unsafe extern "C" fn(ucp_context_h, *const ucp_worker_params_t, *mut ucp_worker_h) -> ucs_status_t,
    pub worker_destroy: unsafe extern "C" fn(ucp_worker_h),
    pub worker_get_address:
        unsafe extern "C" fn(ucp_worker_h, *mut *mut ucp_address_t, *mut usize) -> ucs_status_t,
    pub worker_release_address: unsafe extern "C" fn(ucp_worker_h, *mut ucp_address_t),
    pub worker_progress: unsafe extern "C" fn(ucp_worker_h) -> c_uint,
    pub ep_create: unsafe extern "C" fn(ucp_worker_h, *const ucp_ep_params_t, *mut ucp_ep_h) -> ucs_status_t,
    pub ep_close_nbx: unsafe extern "C" fn(ucp_ep_h, *const ucp_request_param_t) -> ucs_status_ptr_t,
    pub ep_flush_nbx: unsafe extern "C" fn(ucp_ep_h, *const ucp_request_param_t) -> ucs_status_ptr_t,
    pub mem_map:
        unsafe extern "C" fn(ucp_context_h, *const ucp_mem_map_params_t, *mut ucp_mem_h) -> ucs_status_t,
    pub mem_unmap: unsafe extern "C" fn(ucp_context_h, ucp_mem_h) -> ucs_status_t,
    pub rkey_pack:
        unsafe extern "C" fn(ucp_context_h, ucp_mem_h, *mut *mut c_void, *mut usize) -> ucs_status_t,
    pub rkey_buffer_release: unsafe extern "C" fn(*mut c_void),
    pub ep_rkey_unpack: unsafe extern "C" fn(ucp_ep_h, *const c_void, *mut ucp_rkey_h) -> ucs_status_t,
    pub rkey_destroy: unsafe extern "C" fn(ucp_rkey_h),
    pub put_nbx: unsafe extern "C" fn(
        ucp_ep_h,
        *const c_void,
        usize,
        u64,
        ucp_rkey_h,
        *const ucp_request_param_t,
    ) -> ucs_status_ptr_t,
    pub get_nbx: unsafe extern "C" fn(
        ucp_ep_h,
        *mut c_void,
        usize,
        u64,
        ucp_rkey_h,
        *const ucp_request_param_t,
    ) -> ucs_status_ptr_t,
    pub request_check_status: unsafe extern "C" fn(*mut c_void) -> ucs_status_t,
    pub request_free: unsafe extern "C" fn(*mut c_void),
    pub status_string: unsafe extern "C" fn(ucs_status_t) -> *const c_char,
}

/// The library's ABI name; `MEMPLUG_UCX_LIBUCP` overrides it (a UCX built
/// elsewhere), ignored in setuid/setgid processes as plugin overrides are.
const LIBUCP: &str = "libucp.so.0";

static UCP: OnceLock<Result<Ucp, String>> = OnceLock::new();

impl Ucp {
    /// The loaded library, or why it could not be loaded (cached: one
    /// attempt per process).
    pub fn get() -> Result<&'static Ucp, String> {
        UCP.get_or_init(Ucp::load).as_ref().map_err(Clone::clone)
    }

    fn load() -> Result<Ucp, String> {
        // SAFETY: getuid/geteuid/getgid/getegid have no preconditions.
        let privileged = unsafe { libc::getuid() != libc::geteuid() || libc::getgid() != libc::getegid() };
        let name = match std::env::var_os("MEMPLUG_UCX_LIBUCP") {
            Some(p) if !privileged => p,
            _ => LIBUCP.into(),
        };
        // SAFETY: loading UCX runs its constructors (ucs/ucm initialisation),
        // which is what linking it would do too.
        let lib = unsafe { libloading::Library::new(&name) }.map_err(|e| {
            format!(
                "UCX is not available: cannot load {} ({e}); install libucx0 (Debian: apt-get install \
                 libucx-dev ucx-utils, or scripts/setup.sh test)",
                name.to_string_lossy()
            )
        })?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is declared with the C signature of the
                // field it fills (checked against the header by
                // tests/layout.rs); the library outlives the copy (held in
                // `_lib`).
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("UCX library lacks {}: {e}", $name))?
            };
        }
        let ucp = Ucp {
            config_read: sym!("ucp_config_read"),
            config_release: sym!("ucp_config_release"),
            config_modify: sym!("ucp_config_modify"),
            init_version: sym!("ucp_init_version"),
            cleanup: sym!("ucp_cleanup"),
            get_version: sym!("ucp_get_version"),
            worker_create: sym!("ucp_worker_create"),
            worker_destroy: sym!("ucp_worker_destroy"),
            worker_get_address: sym!("ucp_worker_get_address"),
            worker_release_address: sym!("ucp_worker_release_address"),
            worker_progress: sym!("ucp_worker_progress"),
            ep_create: sym!("ucp_ep_create"),
            ep_close_nbx: sym!("ucp_ep_close_nbx"),
            ep_flush_nbx: sym!("ucp_ep_flush_nbx"),
            mem_map: sym!("ucp_mem_map"),
            mem_unmap: sym!("ucp_mem_unmap"),
            rkey_pack: sym!("ucp_rkey_pack"),
            rkey_buffer_release: sym!("ucp_rkey_buffer_release"),
            ep_rkey_unpack: sym!("ucp_ep_rkey_unpack"),
            rkey_destroy: sym!("ucp_rkey_destroy"),
            put_nbx: sym!("ucp_put_nbx"),
            get_nbx: sym!("ucp_get_nbx"),
            request_check_status: sym!("ucp_request_check_status"),
            request_free: sym!("ucp_request_free"),
            // In libucs, a dependency of libucp: dlsym on the handle
            // searches the libraries it loaded.
            status_string: sym!("ucs_status_string"),
            _lib: lib,
        };
        let (mut major, mut minor, mut release) = (0, 0, 0);
        // SAFETY: three valid out-pointers.
        unsafe { (ucp.get_version)(&mut major, &mut minor, &mut release) };
        if major != UCP_API_MAJOR || minor < UCP_API_MINOR {
            return Err(format!(
                "UCX {major}.{minor}.{release} is too old or of another major version: this crate's \
                 declarations match UCX {UCP_API_MAJOR}.{UCP_API_MINOR} and later 1.x"
            ));
        }
        Ok(ucp)
    }

    /// UCX's text for a status.
    pub fn describe(&self, status: ucs_status_t) -> String {
        // SAFETY: ucs_status_string returns a static string for any value.
        let p = unsafe { (self.status_string)(status) };
        if p.is_null() {
            return format!("status {status}");
        }
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// `UCS_PTR_IS_ERR`.
pub fn ptr_is_err(p: ucs_status_ptr_t) -> bool {
    (p as usize) >= (UCS_ERR_LAST as isize as usize)
}

/// `UCS_PTR_STATUS` for a pointer that is not a request: `UCS_OK` (null) or
/// an error.
pub fn ptr_status(p: ucs_status_ptr_t) -> ucs_status_t {
    if ptr_is_err(p) {
        p as isize as ucs_status_t
    } else {
        UCS_OK
    }
}
