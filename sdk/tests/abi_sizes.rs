//! Frozen facts of the ABI's structs: 1.0 sizes never change, 1.1 fields
//! start where 1.0 ended, frozen structs never grow, and capability and
//! class numbers are what they were. (That the size table matches the
//! structs is `memplug_sdk::facts`' own test.)

use core::mem::{offset_of, size_of};
use memplug_sdk::abi::*;

#[test]
fn the_1_0_sizes_never_change() {
    let frozen = [24, 16, 72, 72, 32, 24, 40, 32, 56, 40, 48, 48, 72];
    let of_1_0 = memplug_sdk::facts::SIZES.iter().filter(|f| f.since_minor == 0);
    assert_eq!(of_1_0.clone().count(), frozen.len(), "one frozen size per growable struct of 1.0");
    for (fact, want) in of_1_0.zip(frozen) {
        let (name, v10) = (fact.name, fact.size_1_0);
        assert_eq!(v10, want, "{name}: a released size is frozen");
    }
}

#[test]
fn the_1_1_sizes_never_change() {
    let frozen = [24, 16, 72, 72, 32, 24, 48, 32, 56, 40, 48, 64, 72];
    let of_1_0 = memplug_sdk::facts::SIZES.iter().filter(|f| f.since_minor == 0);
    for (fact, want) in of_1_0.zip(frozen) {
        assert_eq!(fact.size_1_1, want, "{}: a released size is frozen", fact.name);
    }
}

#[test]
fn the_1_2_sizes_never_change() {
    // Released with the 1.2 header (abi-tests/frozen/1.2), in the order of
    // the size table; structs new in 1.2 included.
    let frozen: Vec<(&str, u32)> = memplug_sdk::facts::SIZES.iter().map(|f| (f.name, f.size_1_2)).collect();
    let want = [
        ("MemplugHostInfo", 32),
        ("MemplugNegotiation", 16),
        ("MemplugPlugin", 72),
        ("MemplugMechanism", 88),
        ("MemplugProperties", 72),
        ("MemplugMemoryInfo", 24),
        ("MemplugRequest", 72),
        ("MemplugBlock", 32),
        ("MemplugObjectRef", 56),
        ("MemplugAllocator", 40),
        ("MemplugVirtualBacking", 64),
        ("MemplugSharedMapping", 96),
        ("MemplugSync", 88),
        ("MemplugHostServices", 24),
        ("MemplugDeviceIdentity", 48),
        ("MemplugHandle", 96),
        ("MemplugPeerAccess", 24),
    ];
    for (name, size) in want {
        let got =
            frozen.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("{name} not in the table"));
        assert_eq!(got.1, size, "{name}: a released size is frozen");
    }
    assert_eq!(frozen.len(), want.len(), "a growable struct of 1.2 is missing here: {frozen:?}");
}

#[test]
fn the_1_2_fields_start_where_1_1_ended() {
    assert_eq!(offset_of!(MemplugHostInfo, services), size_1_1::HOST_INFO as usize);
    assert_eq!(MEMPLUG_STATUS_DEVICE_LOST, MEMPLUG_STATUS_BUSY + 1, "the next code, never a reused one");
}

#[test]
fn frozen_structs_never_grow() {
    // "Frozen: this struct never grows" (MemplugDevice, MemplugMessageSink).
    assert_eq!(size_of::<MemplugDevice>(), 8);
    assert_eq!(size_of::<MemplugMessageSink>(), 16);
}

#[test]
fn the_1_1_fields_start_where_1_0_ended() {
    assert_eq!(offset_of!(MemplugRequest, class_tag), size_1_0::REQUEST as usize);
    assert_eq!(offset_of!(MemplugSharedMapping, export_fd), size_1_0::SHARED_MAPPING as usize);
    assert_eq!(offset_of!(MemplugSharedMapping, import_fd), size_1_0::SHARED_MAPPING as usize + 8);
}

#[test]
fn capability_and_class_numbers() {
    assert_eq!(MEMPLUG_CAP_ALL_1_0 & MEMPLUG_CAP_SHARED_EXPORT, 0, "a new bit, never a reused one");
    assert_eq!(MEMPLUG_CAP_ALL_1_1, 0x1f);
    let classes = [
        MEMPLUG_CLASS_OTHER,
        MEMPLUG_CLASS_WEIGHTS,
        MEMPLUG_CLASS_KV,
        MEMPLUG_CLASS_ACTIVATIONS,
        MEMPLUG_CLASS_WORKSPACE,
    ];
    assert_eq!(classes, [0, 1, 2, 3, 4]);
}

#[test]
fn the_1_3_fields_start_where_1_2_ended() {
    // 1.3 is open (not frozen): its sizes may still grow, but what it has
    // appended starts at the 1.2 end, and every other struct keeps its 1.2
    // size.
    assert_eq!(offset_of!(MemplugProperties, copy_kinds), size_1_2::PROPERTIES as usize);
    assert_eq!(offset_of!(MemplugSync, copy), size_1_2::SYNC as usize);
    for f in memplug_sdk::facts::SIZES {
        if !matches!(f.name, "MemplugProperties" | "MemplugSync") {
            assert_eq!(f.size_1_3, f.size_1_2, "{}: 1.3 did not grow it", f.name);
        }
    }
    let copy = [MEMPLUG_COPY_DEVICE, MEMPLUG_COPY_HOST, MEMPLUG_COPY_PEER];
    assert_eq!(copy, [1, 2, 4], "the copy spaces are bits 0-2");
    assert_eq!(MEMPLUG_COPY_ALL_1_3, 7);
}
