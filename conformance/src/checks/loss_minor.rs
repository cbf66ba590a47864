//! `loss.none_below_1_2`: a loss seen by a host that agreed on a minor
//! below 1.2.
//!
//! `MEMPLUG_STATUS_DEVICE_LOST` (15) is ABI 1.2's: the header says a plugin
//! that agreed on a lower minor never returns it, and such a host reads it
//! as `MEMPLUG_STATUS_INTERNAL` (a bug report, not a lost device). A plugin
//! that latches a loss once for every host it serves (the easy way to write
//! one) answers 15 to all of them. So the kit negotiates a fresh instance
//! as a 1.1 host (24-byte host info, no services: the plugin cannot report
//! the loss, only latch it), pulls the trigger, and calls every slot of the
//! mechanism as `loss.every_slot_device_lost` does.

use super::fresh::{fresh_at, pull};
use super::loss::{before, sweep};
use super::{fail, skip, Checked, Ctx};
use crate::raw::{status_name, Mech};
use memplug_sdk::abi::*;

/// The newest minor of the host this check plays.
const HOST_MAX: u32 = 1;

pub(super) fn none_below_1_2(ctx: &Ctx, m: &Mech) -> Checked {
    let f = fresh_at(ctx, HOST_MAX)?;
    if f.min_minor > HOST_MAX {
        skip!(
            "the plugin speaks 1.{}..=1.{}: no host below ABI 1.2 can load it, so no such host can be told \
             DEVICE_LOST",
            f.min_minor,
            f.max_minor
        );
    }
    let (t, trig) = f.trigger()?;
    let fm = f.mech(m.id, m.props)?;
    let gran = m.props.granularity.max(crate::os::page_size());
    let b = before(&fm, &f.log, gran)?;
    // Without services the trigger may well answer that it could not
    // report (INVALID_STATE): the mechanism may still have latched the
    // loss, which is what is looked at.
    let st = pull(t, trig, m.id);
    let answers = sweep(&fm, &f.log, &b, gran);
    let reports = f.services.count();
    if reports > 0 {
        fail!(
            "agreed on ABI 1.{} with a host that passed no services table (a 24-byte host info), yet called the \
             kit's report_device_lost {reports} time(s): the services pointer was read past the host info's \
             struct_size",
            f.agreed
        );
    }
    let lost: Vec<&str> =
        answers.iter().filter(|(_, s)| *s == MEMPLUG_STATUS_DEVICE_LOST).map(|(slot, _)| *slot).collect();
    if !lost.is_empty() {
        fail!(
            "agreed on ABI 1.{} (a host speaking 1.0..=1.{HOST_MAX}); after {}({}) answered {}, {} answered \
             DEVICE_LOST (15): that status is ABI 1.2's, and a host that agreed on a lower minor reads it as \
             INTERNAL. Answer MEMPLUG_STATUS_DEVICE_UNAVAILABLE at an agreed minor below 1.2 (keep the agreed \
             minor per negotiation)",
            f.agreed,
            t.symbol,
            m.id,
            status_name(st),
            lost.join(", ")
        );
    }
    // Grouped by status: one line however many slots there are.
    let mut by: std::collections::BTreeMap<String, usize> = Default::default();
    for (_, s) in &answers {
        *by.entry(status_name(*s)).or_default() += 1;
    }
    let seen: Vec<String> = by.iter().map(|(s, n)| format!("{n} answered {s}")).collect();
    Ok(format!(
        "agreed on ABI 1.{}; {}({}) answered {}; then no slot answered DEVICE_LOST ({} slots called: {})",
        f.agreed,
        t.symbol,
        m.id,
        status_name(st),
        answers.len(),
        seen.join(", ")
    ))
}
