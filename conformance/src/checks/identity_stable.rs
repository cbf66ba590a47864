//! `descriptor.identity_stable`: the device identity is, as the header
//! says, "plugin-owned, immutable, valid until unload".
//!
//! A host reads the identity once and matches devices with it (a UUID, a
//! PCI address, a NUMA node): one that changes between calls makes the
//! host's match depend on when it looked. The kit keeps a copy of the
//! identity's bytes, makes the calls a host makes (properties, allocate
//! and free, reserve and release), and compares after each.

use super::descriptor_claims::needs_1_2;
use super::{fail, skip, Checked, Ctx, Scope};
use crate::raw::{request, Mech};
use memplug_sdk::abi::*;

/// The identity's bytes (its `struct_size`, at most 256).
fn bytes(m: &Mech) -> Vec<u8> {
    // SAFETY: a non-NULL identity of at least the 1.2 size
    // (descriptor.identity judges it), plugin-owned and valid until unload.
    unsafe {
        let declared = (*m.identity).struct_size.clamp(MEMPLUG_DEVICE_IDENTITY_SIZE_1_2, 256) as usize;
        core::slice::from_raw_parts(m.identity.cast::<u8>(), declared).to_vec()
    }
}

/// A call the host makes, named, between two looks at the identity.
type Step<'a> = (&'static str, Box<dyn FnMut(&mut Scope) + 'a>);

pub(super) fn identity_stable(ctx: &Ctx, m: &Mech) -> Checked {
    needs_1_2(m, "the device identity")?;
    if m.identity.is_null() {
        skip!("the mechanism publishes no identity (NULL): nothing to keep stable");
    }
    // SAFETY: as in `bytes`.
    if unsafe { (*m.identity).struct_size } < MEMPLUG_DEVICE_IDENTITY_SIZE_1_2 {
        skip!("the identity is shorter than ABI 1.2's (descriptor.identity fails for it)");
    }
    let first = bytes(m);
    let mut s = Scope::new(ctx, m);
    let align = m.props.min_alignment.max(1);
    let mut steps: Vec<Step> = vec![
        (
            "properties",
            Box::new(|_| {
                let _ = m.properties(&ctx.log, MEMPLUG_PROPERTIES_SIZE_1_2);
            }),
        ),
        (
            "a second properties",
            Box::new(|_| {
                let _ = m.properties(&ctx.log, MEMPLUG_PROPERTIES_SIZE_1_2);
            }),
        ),
        (
            "allocate and deallocate",
            Box::new(move |s: &mut Scope| {
                let made = s.allocate(&request(m, 4096, align));
                if made.status == MEMPLUG_STATUS_OK {
                    let _ = s.free(&made.obj);
                }
            }),
        ),
    ];
    if m.vb.is_some() {
        let g = m.props.granularity.max(1);
        steps.push((
            "reserve and release",
            Box::new(move |s: &mut Scope| {
                let made = s.reserve(g);
                if made.status == MEMPLUG_STATUS_OK {
                    let _ = s.release_reservation(&made.obj);
                }
            }),
        ));
    }
    let mut done = Vec::new();
    for (what, step) in steps.iter_mut() {
        step(&mut s);
        done.push(*what);
        let now = bytes(m);
        if now != first {
            let at: Vec<String> = first
                .iter()
                .zip(&now)
                .enumerate()
                .filter(|(_, (a, b))| a != b)
                .take(8)
                .map(|(i, (a, b))| format!("byte {i}: {a:#04x} -> {b:#04x}"))
                .collect();
            fail!(
                "the device identity changed after {what} ({}): it is plugin-owned and immutable until unload (a \
                 host matches devices with what it read once); build it before negotiation answers and never write \
                 it again",
                at.join(", ")
            );
        }
    }
    Ok(format!("the identity's {} bytes stayed the same through {}", first.len(), done.join(", ")))
}
