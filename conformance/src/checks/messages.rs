//! The plugin-wide checks judged at the end of a run: `messages.*`,
//! `structs.writes_within_size`, `structs.out_untouched_on_failure` and
//! `lifecycle.unload_ready`.

use super::descriptor::PluginView;
use super::{ensure, fail, Checked, Ctx, Results};
use crate::os::{in_child, ChildEnd};
use crate::raw::{request, status_name, Guarded, Mech};
use memplug_sdk::abi::*;
use std::collections::BTreeSet;
use std::time::Duration;

/// Statuses that report a state rather than refuse a call: no message is
/// owed for them.
const NOT_REFUSALS: &[MemplugStatus] = &[MEMPLUG_STATUS_OK, MEMPLUG_STATUS_NOT_READY, MEMPLUG_STATUS_TIMEOUT];

fn listed(items: BTreeSet<String>) -> String {
    let n = items.len();
    let mut v: Vec<String> = items.into_iter().take(6).collect();
    if n > 6 {
        v.push(format!("… ({} more)", n - 6));
    }
    v.join(", ")
}

/// Judges what the log holds: every check before these ran in its own
/// process, and its process sent the kit what it logged, so `ctx.log` (a
/// copy of the kit's) holds the whole run.
pub(crate) fn finish(res: &mut Results, ctx: &Ctx, plugin: &PluginView, mechs: &[Mech]) {
    let calls = ctx.log.calls();
    let leaks = res.leaks().to_vec();
    res.run("messages.present", None, || {
        let refusals: Vec<_> = calls.iter().filter(|c| !NOT_REFUSALS.contains(&c.status)).collect();
        let silent: BTreeSet<String> = refusals
            .iter()
            .filter(|c| !c.writes.iter().any(|w| w.len > 0 && !w.null_msg))
            .map(|c| format!("{} ({})", c.slot, status_name(c.status)))
            .collect();
        ensure!(silent.is_empty(), "refusals without a message: {}", listed(silent));
        ensure!(!refusals.is_empty(), "no call was refused during the run: nothing to judge");
        Ok(format!("{} refused calls, each explained through the sink", refusals.len()))
    });
    res.run("messages.bounded", None, || {
        let writes: Vec<_> = calls.iter().flat_map(|c| c.writes.iter().map(move |w| (c.slot, w))).collect();
        let mut bad = BTreeSet::new();
        for (slot, w) in &writes {
            if w.len > MEMPLUG_MESSAGE_MAX as usize {
                bad.insert(format!("{slot}: {} bytes (max {MEMPLUG_MESSAGE_MAX})", w.len));
            }
            if w.null_msg && w.len > 0 {
                bad.insert(format!("{slot}: NULL message of length {}", w.len));
            }
            if !w.utf8 {
                bad.insert(format!("{slot}: not UTF-8 ({:?})", w.text));
            }
        }
        ensure!(bad.is_empty(), "{}", listed(bad));
        let longest = writes.iter().map(|(_, w)| w.len).max().unwrap_or(0);
        Ok(format!("{} messages, the longest {longest} bytes", writes.len()))
    });
    res.run("messages.calling_thread", None, || {
        let foreign: BTreeSet<String> = calls
            .iter()
            .filter(|c| c.writes.iter().any(|w| w.foreign_thread))
            .map(|c| c.slot.to_string())
            .collect();
        ensure!(
            foreign.is_empty(),
            "messages written from another thread than the caller's, by: {}",
            listed(foreign)
        );
        Ok("every message came from the calling thread".into())
    });
    res.run("messages.sink_after_return", None, || {
        let (kept, count) = ctx.log.late.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if count > 0 {
            let shown: BTreeSet<String> = kept.iter().map(|(slot, t)| format!("{slot} (\"{t}\")")).collect();
            fail!(
                "the plugin wrote {count} message(s) into a sink after the call that passed it had returned: {}. A \
                 sink is valid only during the call (the caller's stack may hold it); write before returning, on \
                 the calling thread, and keep no pointer to it",
                listed(shown)
            );
        }
        Ok("no message was written into a sink after its call returned".into())
    });
    res.run("messages.null_sink", None, || null_sink(ctx, mechs));
    res.run("structs.writes_within_size", None, || {
        let o = ctx.log.overruns.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let what: BTreeSet<String> = o.iter().map(|(slot, d)| format!("{slot} {d}")).collect();
        ensure!(what.is_empty(), "{}", listed(what));
        Ok("every output stayed within its struct_size".into())
    });
    res.run("structs.out_untouched_on_failure", None, || {
        let w = ctx.log.written_on_failure.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let what: BTreeSet<String> =
            w.iter().map(|(slot, s)| format!("{slot} ({})", status_name(*s))).collect();
        ensure!(what.is_empty(), "outputs written by failed calls: {}", listed(what));
        Ok("failed calls left their outputs alone".into())
    });
    res.run("lifecycle.unload_ready", None, || {
        // This process made nothing: what it counts is what the plugin
        // counts with nothing made. Each check before ran in a process of
        // its own, and the kit compared the count before and after it.
        let live = plugin.live();
        if live != 0 {
            fail!(
                "live_objects is {live} with nothing made (in a fresh process, after negotiation and the \
                 descriptor checks); a host would never unload this plugin"
            );
        }
        if !leaks.is_empty() {
            fail!(
                "live_objects did not come back after {} check(s) released everything they made: {}; a host \
                 would never unload this plugin",
                leaks.len(),
                listed(leaks.into_iter().collect())
            );
        }
        if let Some(unload) = plugin.unload {
            // SAFETY: published slot, called once, after the last call.
            unsafe { unload(plugin.ctx) };
            return Ok("live_objects is 0 and came back after every check; unload was called".into());
        }
        Ok("live_objects is 0 and came back after every check (no unload slot published)".into())
    });
}

/// Refused calls with a NULL sink, and with a sink whose `write` is NULL,
/// in a child: a crash there fails the check, not the run.
fn null_sink(ctx: &Ctx, mechs: &[Mech]) -> Checked {
    let entry = ctx.entry;
    let n = mechs.len();
    let mechs = mechs.to_vec();
    let end = in_child(Duration::from_secs(5), move || {
        let no_write = MemplugMessageSink { ctx: core::ptr::null_mut(), write: None };
        for sink in [core::ptr::null(), &no_write as *const MemplugMessageSink] {
            let info = MemplugHostInfo {
                struct_size: MEMPLUG_HOST_INFO_SIZE_1_0,
                abi_major: 2,
                min_minor: 0,
                max_minor: 0,
                host_name: core::ptr::null(),
                services: core::ptr::null(),
            };
            let mut out = Guarded::new(MEMPLUG_NEGOTIATION_SIZE_1_0);
            // SAFETY: valid pointers; the sink is deliberately NULL or
            // without a write function.
            unsafe { entry(&info, out.ptr(), sink) };
            for m in &mechs {
                let (Some(allocate), Some(deallocate)) = (m.alloc.allocate, m.alloc.deallocate) else {
                    continue;
                };
                let req = request(m, 0, m.props.min_alignment);
                let mut b = Guarded::new(MEMPLUG_BLOCK_SIZE_1_0);
                let never = MemplugObjectRef {
                    struct_size: MEMPLUG_OBJECT_REF_SIZE_1_0,
                    reserved0: 0,
                    mechanism_id: m.id,
                    device: m.device,
                    object_id: 1,
                    addr: 0x1000,
                    size: 64,
                    handle: 0x7ead_beef,
                };
                // SAFETY: published slots with valid pointers.
                unsafe {
                    allocate(m.ctx, &req, b.ptr(), sink);
                    deallocate(m.ctx, &never, sink);
                }
            }
        }
        0
    });
    match end {
        ChildEnd::Exited(0) => Ok(format!(
            "refused negotiation, allocate and deallocate of {} mechanism(s) survived a NULL sink and a sink \
             without write",
            n
        )),
        other => fail!("the child making refused calls with a NULL sink {}", other.describe()),
    }
}
