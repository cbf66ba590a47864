//! `descriptor.minor_0_is_1_0` and `descriptor.minor_1_is_1_1`: the
//! descriptor a host of an older minor gets describes the mechanism as that
//! minor defines it.

use super::*;
use crate::checks::{ensure, expect, fail, skip, Checked, Ctx, Verdict};
use memplug_sdk::prefix::{self, PrefixError};

/// `descriptor.minor_0_is_1_0`: the descriptor a host speaking only 1.0
/// gets describes this mechanism as 1.0 defines it.
pub(super) fn minor_0_is_1_0(ctx: &Ctx, plugin: &PluginView, desc: &MemplugMechanism) -> Checked {
    if plugin.min_minor > 0 {
        skip!("the plugin's oldest minor is 1.{}: it does not speak 1.0", plugin.min_minor);
    }
    let (st, n) = crate::checks::negotiation::negotiate_range(ctx, 0, 0);
    expect(st, &[MEMPLUG_STATUS_OK], "negotiation with a host speaking only 1.0 (minors 0..=0)")?;
    ensure!(n.agreed_minor == 0, "a host speaking only 1.0 agreed on 1.{}", n.agreed_minor);
    let at = n.plugin as usize;
    ensure!(
        at == 0 || (at >= 4096 && at % core::mem::align_of::<MemplugPlugin>() == 0),
        "negotiated at 1.0, the plugin descriptor pointer {at:#x} cannot point at a descriptor"
    );
    // SAFETY: plugin-owned descriptor, at least struct_size bytes.
    let d: MemplugPlugin = match unsafe { prefix::read(n.plugin) } {
        Ok(d) => d,
        Err(PrefixError::Null) => fail!("negotiated at 1.0, the plugin descriptor is NULL"),
        Err(PrefixError::Short { declared, .. }) => {
            fail!("negotiated at 1.0, the plugin descriptor's struct_size {declared} is shorter than 1.0's")
        }
    };
    ensure!(
        d.mechanism_count <= MAX_MECHANISMS && (d.mechanism_count == 0 || !d.mechanisms.is_null()),
        "negotiated at 1.0, the descriptor lists {} mechanisms at {:p}",
        d.mechanism_count,
        d.mechanisms
    );
    for i in 0..d.mechanism_count as usize {
        // SAFETY: `mechanism_count` pointers, as the descriptor says.
        let p = unsafe { *d.mechanisms.add(i) };
        // SAFETY: plugin-owned descriptor, at least struct_size bytes.
        let Ok(mech) = (unsafe { prefix::read::<MemplugMechanism>(p) }) else {
            continue;
        };
        if mech.mechanism_id != desc.mechanism_id {
            continue;
        }
        let added = mech.capabilities & !MEMPLUG_CAP_ALL_1_0;
        ensure!(
            added == 0,
            "negotiated at 1.0, the mechanism sets capability bits {added:#x} ({}), which later minors added: a \
             plugin hands a 1.0 host its 1.0 descriptor (a host refuses the mechanism)",
            later_bits(added)
        );
        old_properties(ctx, &mech, 0)?;
        return Ok(format!(
            "a host speaking only 1.0 agreed on 1.0; the mechanism's capabilities there: {}; properties kept to the \
             1.0 size",
            capability_names(mech.capabilities).join(", ")
        ));
    }
    Ok("a host speaking only 1.0 agreed on 1.0; its descriptor does not list this mechanism (one of a later minor)".into())
}

/// Names of capability bits of later minors, for details.
fn later_bits(bits: u32) -> String {
    let mut names: Vec<&str> = Vec::new();
    if bits & MEMPLUG_CAP_SHARED_EXPORT != 0 {
        names.push("MEMPLUG_CAP_SHARED_EXPORT, ABI 1.1");
    }
    if bits & MEMPLUG_CAP_TYPED_EXPORT != 0 {
        names.push("MEMPLUG_CAP_TYPED_EXPORT, ABI 1.2");
    }
    if bits & MEMPLUG_CAP_PEER_ACCESS != 0 {
        names.push("MEMPLUG_CAP_PEER_ACCESS, ABI 1.2");
    }
    if bits & MEMPLUG_CAP_QUEUED_BINDING != 0 {
        names.push("MEMPLUG_CAP_QUEUED_BINDING, ABI 1.2");
    }
    if bits & !MEMPLUG_CAP_ALL_1_2 != 0 {
        names.push("bits no minor this kit knows defines");
    }
    names.join("; ")
}

/// `descriptor.minor_1_is_1_1`: the descriptor a host speaking up to 1.1
/// gets describes this mechanism as 1.1 defines it: no capability bit 1.2
/// added, and none of 1.2's descriptor reaches it (the identity only in a
/// 1.2-sized mechanism, which a 1.1 host does not read; properties never
/// written past the 1.1 size it passes).
pub(super) fn minor_1_is_1_1(ctx: &Ctx, plugin: &PluginView, desc: &MemplugMechanism) -> Checked {
    if plugin.min_minor > 1 {
        skip!("the plugin's oldest minor is 1.{}: it does not speak 1.1", plugin.min_minor);
    }
    if plugin.max_minor < 1 {
        skip!("the plugin speaks only ABI 1.0 (descriptor.minor_0_is_1_0 judges that view)");
    }
    let (st, n) = crate::checks::negotiation::negotiate_range(ctx, 0, 1);
    expect(st, &[MEMPLUG_STATUS_OK], "negotiation with a host speaking 1.0..=1.1")?;
    ensure!(
        n.agreed_minor == 1,
        "a host speaking 1.0..=1.1 agreed on 1.{} (the plugin speaks 1.1)",
        n.agreed_minor
    );
    let at = n.plugin as usize;
    ensure!(
        at >= 4096 && at % core::mem::align_of::<MemplugPlugin>() == 0,
        "negotiated at 1.1, the plugin descriptor pointer {at:#x} cannot point at a descriptor"
    );
    // SAFETY: plugin-owned descriptor, at least struct_size bytes.
    let d: MemplugPlugin = match unsafe { prefix::read(n.plugin) } {
        Ok(d) => d,
        Err(PrefixError::Null) => fail!("negotiated at 1.1, the plugin descriptor is NULL"),
        Err(PrefixError::Short { declared, .. }) => {
            fail!("negotiated at 1.1, the plugin descriptor's struct_size {declared} is shorter than 1.0's")
        }
    };
    ensure!(
        d.mechanism_count <= MAX_MECHANISMS && (d.mechanism_count == 0 || !d.mechanisms.is_null()),
        "negotiated at 1.1, the descriptor lists {} mechanisms at {:p}",
        d.mechanism_count,
        d.mechanisms
    );
    for i in 0..d.mechanism_count as usize {
        // SAFETY: `mechanism_count` pointers, as the descriptor says.
        let p = unsafe { *d.mechanisms.add(i) };
        // SAFETY: plugin-owned descriptor, at least struct_size bytes.
        let Ok((mech, declared)) = (unsafe { prefix::read_with_size::<MemplugMechanism>(p) }) else {
            continue;
        };
        if mech.mechanism_id != desc.mechanism_id {
            continue;
        }
        let added = mech.capabilities & !MEMPLUG_CAP_ALL_1_1;
        ensure!(
            added == 0,
            "negotiated at 1.1, the mechanism sets capability bits {added:#x} ({}): a plugin hands a 1.1 host its \
             1.1 descriptor (a host refuses the mechanism)",
            later_bits(added)
        );
        let mut notes = Vec::new();
        if declared >= MEMPLUG_MECHANISM_SIZE_1_2 && !mech.identity.is_null() {
            // Allowed (a table may be longer than the agreed minor
            // defines), and ignored by a 1.1 host.
            notes.push(format!(
                "its {declared}-byte descriptor points at an identity, which a 1.1 host does not read"
            ));
        }
        old_properties(ctx, &mech, 1)?;
        let notes = if notes.is_empty() { String::new() } else { format!("; note: {}", notes.join("; ")) };
        return Ok(format!(
            "a host speaking 1.0..=1.1 agreed on 1.1; the mechanism's capabilities there: {}; properties kept to \
             the 1.1 size{notes}",
            capability_names(mech.capabilities).join(", ")
        ));
    }
    Ok("a host speaking 1.0..=1.1 agreed on 1.1; its descriptor does not list this mechanism (one of a later minor)"
        .into())
}

/// The properties a host of `minor` (0 or 1) asks for, through the
/// mechanism it was handed: at that minor's size, nothing written past it.
fn old_properties(ctx: &Ctx, mech: &MemplugMechanism, minor: u32) -> Result<(), Verdict> {
    if mech.allocator.is_null() {
        return Ok(());
    }
    // SAFETY: plugin-owned vtable, at least struct_size bytes.
    let Ok(a) = (unsafe { prefix::read::<MemplugAllocator>(mech.allocator) }) else {
        return Ok(());
    };
    let Some(f) = a.properties else {
        return Ok(());
    };
    let size = if minor == 0 { MEMPLUG_PROPERTIES_SIZE_1_0 } else { MEMPLUG_PROPERTIES_SIZE_1_1 };
    let mut out = crate::raw::Guarded::new(size);
    // SAFETY: a published slot; the buffer outlives the call.
    let (st, _) =
        crate::sink::call(&ctx.log, "allocator.properties", |sink| unsafe { f(mech.ctx, out.ptr(), sink) });
    expect(st, &[MEMPLUG_STATUS_OK], &format!("negotiated at 1.{minor}, properties"))?;
    ensure!(
        out.tail_intact(),
        "negotiated at 1.{minor}, properties wrote past the struct_size {size} a 1.{minor} host passes (its memory \
         descriptor reached a host that did not ask for it)"
    );
    Ok(())
}
