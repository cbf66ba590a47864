//! The matrix's look at ABI 1.3 in a Rust host cell: the stream-ordered
//! copy. Where 1.3 was agreed and the subject publishes the copy, its
//! spaces are exactly the published ones and bytes cross through the host
//! on a stream; everywhere else (a plugin of 1.2 or older, a 1.3 plugin
//! under a host pinned lower, a 1.3 plugin without the slot) the host
//! reads no copy spaces and answers the copy itself with `Unsupported`.

use super::Subject;
use memplug_host::{CopyKinds, Mechanism, Status};
use std::time::Duration;

pub(super) fn copy_checks(
    s: &Subject,
    m: &Mechanism,
    agreed: u32,
    problems: &mut Vec<String>,
) -> Vec<String> {
    let mut fail = |what: String| problems.push(format!("mechanism '{}': {what}", m.name()));
    let kinds = m.properties().copy_kinds;
    let want = if agreed >= 3 { s.copy_kinds_1_3 } else { None };
    let Some(sync) = m.sync() else {
        if kinds != CopyKinds::NONE {
            fail(format!("copy spaces {kinds:?} without a sync capability"));
        }
        return vec!["copy: no sync capability".into()];
    };
    let Some(want) = want else {
        if kinds != CopyKinds::NONE || sync.can_copy() {
            fail(format!("at 1.{agreed} the host sees copy spaces {kinds:?} or a copy slot"));
        }
        let st = sync.stream_create();
        match st {
            Ok(stream) => {
                let (mut a, b) = ([0u8; 16], [7u8; 16]);
                // SAFETY: two buffers of this frame; the host refuses the
                // copy before any plugin sees it.
                let r = unsafe { sync.copy(&stream, a.as_mut_ptr() as u64, b.as_ptr() as u64, 16) };
                if !matches!(&r, Err(e) if e.status == Status::Unsupported) || a != [0; 16] {
                    fail(format!("copy at 1.{agreed} without the slot answered {r:?}"));
                }
                let _ = sync.stream_destroy(stream);
            }
            Err(e) => fail(format!("stream_create: {e}")),
        }
        return vec![format!("copy: Unsupported from the host at 1.{agreed}")];
    };
    if kinds != CopyKinds(want) || !sync.can_copy() {
        fail(format!("copy spaces {kinds:?} (slot {}), published {:?}", sync.can_copy(), CopyKinds(want)));
        return Vec::new();
    }
    match round_trip(m) {
        Ok(()) => vec![format!("copy: {kinds:?}, bytes copied on a stream")],
        Err(e) => {
            fail(format!("copy: {e}"));
            Vec::new()
        }
    }
}

/// Host memory → an allocation → another allocation → host memory, on one
/// stream, then one fence: the bytes arrive whole.
fn round_trip(m: &Mechanism) -> Result<(), String> {
    let sync = m.sync().ok_or("no sync")?;
    // SAFETY: test memory, given back below.
    let alloc = unsafe { m.ungoverned() }.allocator();
    let a = alloc.allocate(4096, 64).map_err(|e| e.to_string())?;
    let b = alloc.allocate(4096, 64).map_err(|e| e.to_string())?;
    let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut out = vec![0u8; 4096];
    let stream = sync.stream_create().map_err(|e| e.to_string())?;
    // SAFETY: the buffers outlive the fence waited for below; the
    // allocations are this mechanism's and live until after it.
    let r = unsafe {
        sync.copy(&stream, a.addr(), src.as_ptr() as u64, 4096)
            .and_then(|()| sync.copy(&stream, b.addr(), a.addr(), 4096))
            .and_then(|()| sync.copy(&stream, out.as_mut_ptr() as u64, b.addr(), 4096))
    };
    let done = r.and_then(|()| sync.fence_record(&stream)).and_then(|f| {
        let ok = sync.fence_wait(&f, Duration::from_secs(20));
        let _ = sync.fence_destroy(f);
        ok
    });
    let _ = sync.stream_destroy(stream);
    let _ = alloc.deallocate(a);
    let _ = alloc.deallocate(b);
    match done {
        Ok(true) if out == src => Ok(()),
        Ok(true) => Err("the bytes did not arrive whole".into()),
        Ok(false) => Err("the fence after the copies did not complete".into()),
        Err(e) => Err(e.to_string()),
    }
}
