//! What the C API tests share: the CPU plugin's path, this thread's last
//! error message, and an assertion that a call succeeded that prints it.

use memplug_host_capi::*;
use std::ffi::CString;
use std::ptr::null_mut;

/// The built CPU plugin library, as a C string for the load functions.
pub fn plugin_path() -> CString {
    let p = memplug_test_support::find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN");
    CString::new(p.to_str().unwrap()).unwrap()
}

/// This thread's last error message.
pub fn last_error() -> String {
    let n = unsafe { memplug_host_last_error_message(null_mut(), 0) };
    let mut buf = vec![0u8; n + 1];
    unsafe { memplug_host_last_error_message(buf.as_mut_ptr().cast(), buf.len()) };
    buf.truncate(n);
    String::from_utf8(buf).unwrap()
}

/// Asserts `s` is OK, showing the last error otherwise.
#[track_caller]
pub fn ok(s: MemplugHostStatus) {
    assert_eq!(s, MemplugHostStatus::Ok, "{}", last_error());
}
