//! The host side of `MemplugMessageSink`: a capture that lives on the
//! caller's stack for one call. Success costs two stores; only a failure
//! allocates, to keep the plugin's message.

use core::ffi::{c_char, c_void};
use memplug_sdk::abi::{MemplugMessageSink, MEMPLUG_MESSAGE_MAX};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Collects what a plugin writes during one call. Keeps the last message,
/// truncated to `MEMPLUG_MESSAGE_MAX` bytes on a character boundary.
#[derive(Default)]
pub(crate) struct Capture {
    message: Option<String>,
    /// The message is the host's own (a call it refused), not the plugin's.
    by_host: bool,
}

impl Capture {
    /// A sink pointing at `self`. The returned value must not outlive
    /// `self`; it is passed to exactly one plugin call.
    #[inline]
    pub(crate) fn sink(&mut self) -> MemplugMessageSink {
        MemplugMessageSink { ctx: (self as *mut Capture).cast(), write: Some(capture_write) }
    }

    /// A message the host writes itself (a call it refused).
    pub(crate) fn set(&mut self, message: String) {
        self.message = Some(message);
        self.by_host = true;
    }

    pub(crate) fn take(&mut self) -> Option<String> {
        self.message.take()
    }

    /// Whether anything was written (the one test a successful call pays
    /// for routing plugin messages to the log hook).
    #[inline(always)]
    pub(crate) fn has_message(&self) -> bool {
        self.message.is_some()
    }

    /// The plugin's message, if it wrote one (not the host's).
    pub(crate) fn plugin_message(&self) -> Option<&str> {
        self.message.as_deref().filter(|_| !self.by_host)
    }
}

/// Bounds a plugin message: lossy UTF-8, at most `MEMPLUG_MESSAGE_MAX`
/// bytes, cut on a character boundary, control characters other than
/// newline and tab replaced (messages end up in logs and terminals).
pub(crate) fn bounded_message(bytes: &[u8]) -> String {
    let max = MEMPLUG_MESSAGE_MAX as usize;
    let bytes = &bytes[..bytes.len().min(max)];
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(text.len().min(max));
    for c in text.chars().map(|c| if c.is_control() && c != '\n' && c != '\t' { '\u{fffd}' } else { c }) {
        // Replacement characters are 3 bytes: bound the result, not only
        // the input, and cut on a character boundary.
        if out.len() + c.len_utf8() > max {
            break;
        }
        out.push(c);
    }
    out
}

unsafe extern "C" fn capture_write(ctx: *mut c_void, msg: *const c_char, len: usize) {
    // Called by plugin code: nothing may unwind back into it.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Some(cap) = ctx.cast::<Capture>().as_mut() else {
            return;
        };
        if msg.is_null() {
            return;
        }
        // Read no more than we keep, whatever length the plugin claims.
        let n = len.min(MEMPLUG_MESSAGE_MAX as usize);
        let bytes = core::slice::from_raw_parts(msg.cast::<u8>(), n);
        cap.message = Some(bounded_message(bytes));
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_and_invalid_messages_are_bounded() {
        let long = vec![b'x'; 5000];
        assert_eq!(bounded_message(&long).len(), MEMPLUG_MESSAGE_MAX as usize);
        assert_eq!(bounded_message(b"a\xffb\x1b"), "a\u{fffd}b\u{fffd}");
        // Invalid bytes grow when replaced; the result stays bounded.
        assert!(bounded_message(&[0xff; 2000]).len() <= MEMPLUG_MESSAGE_MAX as usize);
    }

    #[test]
    fn sink_keeps_last_message() {
        let mut cap = Capture::default();
        let sink = cap.sink();
        unsafe {
            (sink.write.unwrap())(sink.ctx, b"first".as_ptr().cast(), 5);
            (sink.write.unwrap())(sink.ctx, b"second!".as_ptr().cast(), 6);
        }
        assert_eq!(cap.take().as_deref(), Some("second"));
    }
}
