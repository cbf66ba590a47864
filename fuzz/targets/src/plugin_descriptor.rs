//! Fuzz target `plugin_descriptor`: the loader against a plugin whose
//! every published byte the fuzzer chooses.
//!
//! The input becomes a plugin's answer to negotiation — entry status and
//! message, agreed minor, the `MemplugPlugin` descriptor, its mechanism
//! array, each `MemplugMechanism`, their allocator / virtual backing /
//! shared mapping (with the 1.1 `export_fd`/`import_fd` slots and
//! `MEMPLUG_CAP_SHARED_EXPORT`, the 1.2 `export_handle`/`import_handle`
//! slots and `MEMPLUG_CAP_TYPED_EXPORT`, the 1.2 `map_on`/`unmap_on`) /
//! sync sub-vtables (with the optional 1.2 `stream_wait_fence` and
//! `stream_adopt_typed`), the virtual backing's 1.2 `commit_on`/
//! `decommit_on` and `MEMPLUG_CAP_QUEUED_BINDING`, the 1.2 device identity
//! and peer access table (`MEMPLUG_CAP_PEER_ACCESS`) each may point at
//! (read only from a struct holding the whole pointer: the host reads
//! prefixes in whole 8-byte words), and each mechanism's answer to
//! `allocator.properties` (with the 1.2 memory descriptor) — laid out in
//! fuzz-owned memory
//! ([`GuardedArena`]: every buffer ends at an unreadable page). The fuzzer
//! picks `struct_size` values (short, exact, the 1.0 size, longer with
//! trailing bytes, absurd), placements (aligned or at odd addresses),
//! counts (short, or longer than the array when an entry is NULL), flags,
//! ids, names (terminated or not, empty, not UTF-8, around the host's
//! 256-byte bound), device kinds, which pointers and slots are NULL,
//! minor ranges, load options, statuses and messages. Every pointer is NULL or points into that memory, and every
//! function pointer is NULL or one of the well-behaved functions below, so
//! what is tested is the host's validation, not the impossibility of
//! surviving a wild pointer.
//!
//! The plugin is handed to [`Plugin::from_entry`] through [`fuzz_entry`],
//! which reads the prepared answer from a thread-local. An independent
//! model of the ABI rules (`expect`) decides whether the plugin is
//! well-formed. The target fails (panics) when:
//!
//! * the host accepts a malformed plugin or refuses a well-formed one;
//! * a refusal's kind is not one the model found (e.g. `ShortStruct` for a
//!   plugin whose only fault is a NULL slot), or an entry failure loses the
//!   plugin's status or message;
//! * a loaded plugin reports anything (name, version, agreed minor, minor
//!   range, mechanisms, ids, names, devices, capability flags, properties
//!   and their 1.2 descriptor, identities, optional slots, live objects)
//!   other than what the input published;
//! * the host calls a slot other than `allocator.properties` while
//!   loading, calls the entry more than once, or the unload callback at the
//!   wrong time;
//! * the host reads past a buffer (a fault on a guard page) or panics.

use crate::arena::{GuardedArena, Placement};
use crate::input::{bytes, interesting_u64, rare, status};
use arbitrary::{Result, Unstructured};
use memplug_host::{
    CopyKinds, Descriptor, LoadError, LoadOptions, Location, Plugin, Properties, Status, HOST_MAX_MINOR,
    HOST_MIN_MINOR,
};
use memplug_sdk::abi::*;
use memplug_sdk::facts::{Need, Vtable};
use memplug_sdk::prefix::Prefixed;
use std::cell::Cell;
use std::collections::HashSet;
use std::ffi::{c_char, c_void, CStr};
use std::mem::{align_of, offset_of, size_of};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes the host reads at most while looking for a string's terminator
/// (the SDK's `prefix::MAX_NAME`, which the loader reads strings with). An
/// unterminated string is given exactly this many bytes before its guard
/// page.
const HOST_MAX_NAME: usize = memplug_sdk::prefix::MAX_NAME;

// ----- the input -------------------------------------------------------------

/// A `struct_size` and where the struct lies.
#[derive(Debug, Clone)]
struct Shape {
    declared: u32,
    odd: bool,
    /// Bytes after the fields this ABI knows (a newer minor's fields).
    tail: Vec<u8>,
}

impl Shape {
    /// Usually the size of `T` as this ABI defines it; rarely the 1.0 size,
    /// shorter, longer, or absurd.
    fn decode<T: Prefixed>(u: &mut Unstructured<'_>) -> Result<Shape> {
        let min = T::SIZE_1_0;
        let size = size_of::<T>() as u32;
        let declared = if rare(u, 12)? {
            let sizes = [min, 0, 3, 4, min - 1, size - 1, size + 1, size + 8, size + 64, u32::MAX];
            if rare(u, 8)? {
                u.arbitrary()?
            } else {
                *u.choose(&sizes)?
            }
        } else {
            size
        };
        let odd = rare(u, 16)?;
        let tail = if declared > size { bytes(u, 64)? } else { Vec::new() };
        Ok(Shape { declared, odd, tail })
    }
}

/// A message a plugin writes through the host's sink.
#[derive(Debug, Clone)]
struct Message {
    /// Passes a NULL `msg` (with a non-zero length) instead of the bytes.
    null: bool,
    bytes: Vec<u8>,
}

impl Message {
    fn decode(u: &mut Unstructured<'_>) -> Result<Message> {
        let null = rare(u, 16)?;
        let bytes = if rare(u, 8)? {
            // Long: past MEMPLUG_MESSAGE_MAX, sometimes not UTF-8.
            let n = u.int_in_range(1000..=2100)?;
            let fill = if rare(u, 2)? { 0xe9 } else { b'm' };
            vec![fill; n]
        } else {
            bytes(u, 80)?
        };
        Ok(Message { null, bytes })
    }

    fn decode_opt(u: &mut Unstructured<'_>, likely: bool) -> Result<Option<Message>> {
        let present = if likely { !rare(u, 4)? } else { rare(u, 16)? };
        if present {
            Ok(Some(Message::decode(u)?))
        } else {
            Ok(None)
        }
    }

    /// What the host keeps of it (`host/src/sink.rs`): at most
    /// `MEMPLUG_MESSAGE_MAX` bytes, lossy UTF-8, control characters other
    /// than newline and tab replaced. Written independently of the host.
    fn kept(&self) -> Option<String> {
        if self.null {
            return None;
        }
        let max = MEMPLUG_MESSAGE_MAX as usize;
        let b = &self.bytes[..self.bytes.len().min(max)];
        // Sanitised, then bounded to MEMPLUG_MESSAGE_MAX bytes on a
        // character boundary (a replacement character takes 3 bytes).
        let mut kept = String::new();
        for c in String::from_utf8_lossy(b).chars().map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                '\u{fffd}'
            } else {
                c
            }
        }) {
            if kept.len() + c.len_utf8() > max {
                break;
            }
            kept.push(c);
        }
        Some(kept)
    }
}

/// A NUL-terminated (or not) string the plugin publishes.
#[derive(Debug, Clone)]
struct Text {
    /// Exactly the bytes in the buffer, terminator included.
    buffer: Vec<u8>,
}

impl Text {
    fn decode(u: &mut Unstructured<'_>, default: &str, collide: &[&str]) -> Result<Option<Text>> {
        if rare(u, 16)? {
            return Ok(None);
        }
        let terminated = |mut b: Vec<u8>| {
            b.push(0);
            Text { buffer: b }
        };
        if !rare(u, 6)? {
            return Ok(Some(terminated(default.as_bytes().to_vec())));
        }
        Ok(Some(match u.int_in_range(0..=6)? {
            0 => terminated(Vec::new()),
            1 => terminated(bytes(u, 300)?),
            2 => {
                // No terminator within the host's bound: exactly that many
                // bytes, then the guard page.
                let mut b = bytes(u, HOST_MAX_NAME)?;
                b.resize(HOST_MAX_NAME, b'x');
                Text { buffer: b }
            }
            3 => {
                let n = u.int_in_range(HOST_MAX_NAME - 3..=HOST_MAX_NAME + 2)?;
                terminated(vec![b'a'; n])
            }
            4 => terminated(u.choose(collide)?.as_bytes().to_vec()),
            5 => terminated(vec![b'n', 0xff, 0xfe]),
            _ => terminated("m\u{e9}canisme-\u{1f680}".as_bytes().to_vec()),
        }))
    }

    /// What a reader that honours the 256-byte bound finds, in the escaped
    /// form the host keeps names in (see [`escaped`]).
    fn read(&self) -> std::result::Result<String, &'static str> {
        self.read_raw().map(|s| escaped(&s))
    }

    fn read_raw(&self) -> std::result::Result<String, &'static str> {
        let window = &self.buffer[..self.buffer.len().min(HOST_MAX_NAME)];
        let Some(end) = window.iter().position(|&b| b == 0) else {
            assert!(self.buffer.len() >= HOST_MAX_NAME, "the target built a short unterminated string");
            return Err("no terminator within the bound");
        };
        match std::str::from_utf8(&window[..end]) {
            Ok("") => Err("empty"),
            Ok(s) => Ok(s.to_string()),
            Err(_) => Err("not UTF-8"),
        }
    }
}

/// A plugin's text as the host stores it (`memplug_host::escape_untrusted`
/// documents the rules; written here independently of it): a backslash
/// doubled; tab, line feed and carriage return as `\t`, `\n`, `\r`; other
/// control characters as `\xNN` below U+0080 and `\u{NN}` above; the
/// characters that reorder or hide text (bidirectional marks, embeddings,
/// overrides and isolates, zero-width characters, the byte order mark, the
/// line and paragraph separators) as `\u{NNNN}`; everything else kept.
fn escaped(s: &str) -> String {
    let hides =
        |c: char| matches!(c as u32, 0x061c | 0x200b..=0x200f | 0x2028..=0x202e | 0x2060..=0x2069 | 0xfeff);
    let mut out = String::new();
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() && (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() || hides(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// A sub-vtable: its shape and which slots are non-NULL.
#[derive(Debug, Clone)]
struct Table {
    shape: Shape,
    /// The table's 1.0 size (`memplug_sdk::facts`).
    size_1_0: u32,
    /// Each slot the ABI defines (`memplug_sdk::facts`, in declaration
    /// order): its name, its need, and whether the plugin publishes it.
    slots: Vec<(&'static str, Need, bool)>,
}

impl Table {
    /// A table of `T`: required slots are usually published, the others
    /// one time in two.
    fn decode<T: Vtable>(u: &mut Unstructured<'_>) -> Result<Table> {
        let shape = Shape::decode::<T>(u)?;
        let mut slots = Vec::with_capacity(T::SLOTS.len());
        for s in T::SLOTS {
            let published = if s.need == Need::Required { !rare(u, 24)? } else { u.arbitrary()? };
            slots.push((s.name, s.need, published));
        }
        Ok(Table { shape, size_1_0: T::SIZE_1_0, slots })
    }

    fn index(&self, name: &str) -> usize {
        self.slots.iter().position(|s| s.0 == name).unwrap_or_else(|| panic!("the ABI has no slot {name}"))
    }

    fn published(&self, name: &str) -> bool {
        self.slots[self.index(name)].2
    }

    fn set(&mut self, name: &str, published: bool) {
        let i = self.index(name);
        self.slots[i].2 = published;
    }

    /// `f` when the slot `name` is published, else NULL.
    fn slot<F>(&self, name: &str, f: F) -> Option<F> {
        self.published(name).then_some(f)
    }

    /// Whether a slot the ABI always requires is NULL.
    fn lacks_required(&self) -> bool {
        self.slots.iter().any(|&(_, need, published)| need == Need::Required && !published)
    }
}

/// The answer a mechanism's `allocator.properties` gives.
#[derive(Debug, Clone)]
struct PropsAnswer {
    status: u32,
    message: Option<Message>,
    /// Writes the fields (else leaves the host's zeroes).
    write: bool,
    min_alignment: u64,
    max_alignment: u64,
    granularity: u64,
    /// The 1.2 fields, written when the host's struct reaches them.
    descriptor: MemplugProperties,
}

impl PropsAnswer {
    fn decode(u: &mut Unstructured<'_>) -> Result<PropsAnswer> {
        let status = status(u, 12)?;
        let message = Message::decode_opt(u, status != MEMPLUG_STATUS_OK)?;
        let write = !rare(u, 16)?;
        let alignments = [0, 1, 2, 3, 8, 16, 48, 4096, 1 << 63, u64::MAX];
        let min_alignment = if rare(u, 10)? { interesting_u64(u, &alignments)? } else { 16 };
        let max_alignment = if rare(u, 10)? { interesting_u64(u, &alignments)? } else { 1 << 20 };
        let granularity = if rare(u, 10)? {
            interesting_u64(u, &[0, 1, 3, 4096, 6144, 65536, 1 << 63, u64::MAX])?
        } else {
            4096
        };
        Ok(PropsAnswer {
            status,
            message,
            write,
            min_alignment,
            max_alignment,
            granularity,
            descriptor: zeroed(),
        })
    }

    /// The 1.2 memory descriptor: usually plausible, rarely a recommended
    /// granularity that is no power-of-two multiple of the granularity, or
    /// bits of a later minor.
    fn decode_descriptor(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let d = &mut self.descriptor;
        d.recommended_granularity = if rare(u, 6)? {
            interesting_u64(u, &[0, 1, 4096, 6144, 1 << 16, 1 << 21, 1 << 63, u64::MAX])?
        } else {
            0
        };
        d.page_sizes = if rare(u, 4)? { u.arbitrary()? } else { 1 << 12 };
        d.attributes = u.arbitrary()?;
        d.export_types = u.arbitrary()?;
        d.location_kind = if rare(u, 6)? { u.arbitrary()? } else { u.int_in_range(0..=4)? };
        d.location_id = if rare(u, 4)? { u.arbitrary()? } else { 0 };
        d.flags = u.arbitrary()?;
        d.reserved1 = if rare(u, 16)? { u.arbitrary()? } else { 0 };
        Ok(())
    }
}

/// A 1.2 `MemplugDeviceIdentity` a mechanism points at.
#[derive(Debug, Clone)]
struct Identity {
    shape: Shape,
    value: MemplugDeviceIdentity,
}

impl Identity {
    fn decode(u: &mut Unstructured<'_>) -> Result<Identity> {
        let shape = Shape::decode::<MemplugDeviceIdentity>(u)?;
        let mut uuid = [0u8; 16];
        u.fill_buffer(&mut uuid)?;
        let value = MemplugDeviceIdentity {
            struct_size: 0,
            // Usually known bits; rarely a later minor's too.
            valid: if rare(u, 8)? { u.arbitrary()? } else { u.int_in_range(0..=15)? },
            uuid,
            pci_domain: u.arbitrary()?,
            pci_bus: u.arbitrary()?,
            pci_device: u.arbitrary()?,
            pci_function: u.arbitrary()?,
            sub_device: u.arbitrary()?,
            numa_node: u.arbitrary()?,
        };
        Ok(Identity { shape, value })
    }
}

#[derive(Debug, Clone)]
struct Mech {
    shape: Shape,
    capabilities: u32,
    id: u64,
    name: Option<Text>,
    device: MemplugDevice,
    ctx_null: bool,
    allocator: Option<Table>,
    virtual_backing: Option<Table>,
    shared_mapping: Option<Table>,
    sync: Option<Table>,
    props: PropsAnswer,
    /// The 1.2 identity (`None`: NULL).
    identity: Option<Identity>,
    /// The 1.2 peer access table (`None`: NULL).
    peer_access: Option<Table>,
}

/// Whether a `mechanism_count` of `u32::MAX` (with a NULL entry within the
/// array) is tried. Off while the host sizes an allocation by it and aborts:
/// `tests/host_bugs.rs`, `an_absurd_mechanism_count_is_refused_not_fatal`.
const ABSURD_COUNT: bool = true;
/// Whether a mechanism whose `struct_size` ends inside its 1.2 `identity`
/// pointer (73 to 79 bytes) is tried with an identity published. It was off
/// while the host read the pointer's first bytes from such a struct and
/// followed it (`tests/host_bugs.rs`,
/// `a_mechanism_too_short_for_its_identity_pointer_has_none`); the host now
/// reads prefixes in whole 8-byte words, so the cut pointer stays NULL.
const PARTIAL_IDENTITY: bool = true;
/// The `struct_size` from which a mechanism holds its 1.2 `identity`
/// pointer (offset 72..80): the host reads whole words only.
const MECHANISM_REACHES_IDENTITY: u32 = 80;
/// The `struct_size` from which a mechanism holds its 1.2 `peer_access`
/// pointer (offset 80..88, the end of the 1.2 struct).
const MECHANISM_REACHES_PEER_ACCESS: u32 = MEMPLUG_MECHANISM_SIZE_1_2;
/// Capability bits this ABI defines.
const KNOWN_CAPS: u32 = MEMPLUG_CAP_ALL_1_2;
/// Identity bits this ABI defines.
const KNOWN_IDENTITY: u32 = memplug_sdk::descriptor::IDENTITY_BITS;

impl Mech {
    fn decode(u: &mut Unstructured<'_>, index: usize) -> Result<Mech> {
        let shape = Shape::decode::<MemplugMechanism>(u)?;
        let allocator = if rare(u, 24)? { None } else { Some(Table::decode::<MemplugAllocator>(u)?) };
        let virtual_backing =
            if u.arbitrary()? { Some(Table::decode::<MemplugVirtualBacking>(u)?) } else { None };
        let mut export = false;
        let shared_mapping = if u.arbitrary()? {
            let mut t = Table::decode::<MemplugSharedMapping>(u)?;
            // The 1.1 export slots: both or neither, rarely one.
            export = u.arbitrary()?;
            t.set("export_fd", export ^ rare(u, 16)?);
            t.set("import_fd", export ^ rare(u, 16)?);
            Some(t)
        } else {
            None
        };
        let sync = if u.arbitrary()? { Some(Table::decode::<MemplugSync>(u)?) } else { None };
        let mut capabilities = MEMPLUG_CAP_ALLOCATOR;
        if export {
            capabilities |= MEMPLUG_CAP_SHARED_EXPORT;
        }
        for (t, bit) in [
            (&virtual_backing, MEMPLUG_CAP_VIRTUAL_BACKING),
            (&shared_mapping, MEMPLUG_CAP_SHARED_MAPPING),
            (&sync, MEMPLUG_CAP_SYNC),
        ] {
            if t.is_some() {
                capabilities |= bit;
            }
        }
        if rare(u, 12)? {
            // A flag that lies about its pointer (or its slots).
            capabilities ^= 1 << u.int_in_range(0..=5)?;
        }
        if rare(u, 12)? {
            // Bits of a newer minor: ignored by this host.
            capabilities |= u.arbitrary::<u32>()? & !KNOWN_CAPS;
        }
        let id = if rare(u, 16)? { interesting_u64(u, &[0, 1, 2, u64::MAX])? } else { index as u64 + 1 };
        let name = Text::decode(u, &format!("m{index}"), &["m0", "m1", "cpu"])?;
        let device = if rare(u, 8)? {
            MemplugDevice {
                kind: *u.choose(&[MEMPLUG_DEVICE_CPU, MEMPLUG_DEVICE_CUDA, 0, 3, u32::MAX])?,
                ordinal: u.arbitrary()?,
            }
        } else {
            MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 }
        };
        let ctx_null = rare(u, 24)?;
        let mut props = PropsAnswer::decode(u)?;
        // Decoded last, so older seeds still decode to what they did.
        let mut shared_mapping = shared_mapping;
        if let Some(t) = &mut shared_mapping {
            // The 1.2 typed export slots: both or neither, rarely one,
            // with the flag that claims them.
            let typed: bool = u.arbitrary()?;
            t.set("export_handle", typed ^ rare(u, 16)?);
            t.set("import_handle", typed ^ rare(u, 16)?);
            capabilities &= !MEMPLUG_CAP_TYPED_EXPORT;
            if typed ^ rare(u, 16)? {
                capabilities |= MEMPLUG_CAP_TYPED_EXPORT;
            }
        }
        props.decode_descriptor(u)?;
        let mut identity = if u.arbitrary()? { Some(Identity::decode(u)?) } else { None };
        // Decoded after the identity, so older seeds still decode alike.
        // Rarely a size around the 1.2 pointers (between the 1.1 size and
        // the 1.2 one): cutting the identity pointer (73 to 79 bytes), or
        // holding it but cutting the peer access pointer (80 to 87).
        let mut shape = shape;
        if rare(u, 5)? {
            let sizes = [73, 76, 79, 80, 80, 84, 87, MEMPLUG_MECHANISM_SIZE_1_1];
            shape.declared = if rare(u, 4)? {
                u.int_in_range(MEMPLUG_MECHANISM_SIZE_1_1..=MEMPLUG_MECHANISM_SIZE_1_2)?
            } else {
                *u.choose(&sizes)?
            };
        }
        let cut = (MEMPLUG_MECHANISM_SIZE_1_1 + 1..MECHANISM_REACHES_IDENTITY).contains(&shape.declared);
        if cut && !PARTIAL_IDENTITY {
            identity = None;
        }
        // ABI 1.2 peer access: the table with its flag, rarely one without
        // the other.
        let peer_access = if rare(u, 4)? { Some(Table::decode::<MemplugPeerAccess>(u)?) } else { None };
        capabilities &= !MEMPLUG_CAP_PEER_ACCESS;
        if peer_access.is_some() ^ rare(u, 16)? {
            capabilities |= MEMPLUG_CAP_PEER_ACCESS;
        }
        // ABI 1.2 queue-ordered binding: usually only with virtual backing
        // and sync, its slots with the flag (rarely one missing or without
        // it).
        let can_queue = virtual_backing.is_some() && sync.is_some();
        let queued = if can_queue { u.arbitrary()? } else { rare(u, 24)? };
        capabilities &= !MEMPLUG_CAP_QUEUED_BINDING;
        if queued ^ rare(u, 16)? {
            capabilities |= MEMPLUG_CAP_QUEUED_BINDING;
        }
        let mut virtual_backing = virtual_backing;
        if let Some(t) = &mut virtual_backing {
            t.set("commit_on", queued ^ rare(u, 16)?);
            t.set("decommit_on", queued ^ rare(u, 16)?);
        }
        if let Some(t) = &mut shared_mapping {
            t.set("map_on", queued ^ rare(u, 16)?);
            t.set("unmap_on", queued ^ rare(u, 16)?);
        }
        // ABI 1.3 copy spaces (decoded last, so older seeds decode alike):
        // usually non-zero exactly when the sync table publishes `copy`,
        // rarely the other way round or bits of a later minor.
        let says = sync.as_ref().is_some_and(|t| t.published("copy")) ^ rare(u, 16)?;
        props.descriptor.copy_kinds = match (says, rare(u, 8)?) {
            (false, _) => 0,
            (true, false) => u.int_in_range(1..=MEMPLUG_COPY_ALL_1_3)?,
            (true, true) => u.arbitrary()?,
        };
        Ok(Mech {
            shape,
            capabilities,
            id,
            name,
            device,
            ctx_null,
            allocator,
            virtual_backing,
            shared_mapping,
            sync,
            props,
            identity,
            peer_access,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Live {
    Null,
    Zero,
    One,
}

#[derive(Debug, Clone)]
struct PluginDesc {
    shape: Shape,
    abi_major: u32,
    min_minor: u32,
    max_minor: u32,
    name: Option<Text>,
    version: Option<Text>,
    ctx_null: bool,
    /// Entries of the array (`None`: a NULL entry).
    mechanisms: Vec<Option<Mech>>,
    /// `mechanism_count`: at most the array's length, or longer when an
    /// entry is NULL (a longer count with every entry valid would make the
    /// host read outside fuzz-owned memory).
    count: u32,
    array_null: bool,
    live: Live,
    unload: bool,
}

impl PluginDesc {
    fn decode(u: &mut Unstructured<'_>) -> Result<PluginDesc> {
        let shape = Shape::decode::<MemplugPlugin>(u)?;
        let abi_major = if rare(u, 16)? { *u.choose(&[0, 2, u32::MAX])? } else { MEMPLUG_ABI_MAJOR };
        let minor = |u: &mut Unstructured<'_>, default: u32| -> Result<u32> {
            if rare(u, 12)? {
                Ok(*u.choose(&[0, 1, 2, 3, u32::MAX])?)
            } else {
                Ok(default)
            }
        };
        let min_minor = minor(u, 0)?;
        let max_minor = minor(u, MEMPLUG_ABI_MINOR)?;
        let name = Text::decode(u, "fuzz-plugin", &["memplug-cpu"])?;
        let version = Text::decode(u, "1.2.3", &["0"])?;
        let n = 1 + u.int_in_range(0..=3)?;
        let mut mechanisms = Vec::with_capacity(n);
        for i in 0..n {
            mechanisms.push(if rare(u, 24)? { None } else { Some(Mech::decode(u, i)?) });
        }
        let count = if rare(u, 24)? {
            // Longer than the array. Safe only because an entry before its
            // end is NULL: a correct reader refuses there, reading no
            // further (and trusting the count for nothing else).
            let k = u.choose_index(n)?;
            mechanisms[k] = None;
            if ABSURD_COUNT {
                *u.choose(&[n as u32 + 1, 1 << 20, u32::MAX])?
            } else {
                *u.choose(&[n as u32 + 1, 1 << 20])?
            }
        } else if rare(u, 16)? {
            u.int_in_range(0..=n as u32)?
        } else {
            n as u32
        };
        let live = if rare(u, 12)? { *u.choose(&[Live::Null, Live::One])? } else { Live::Zero };
        Ok(PluginDesc {
            shape,
            abi_major,
            min_minor,
            max_minor,
            name,
            version,
            ctx_null: rare(u, 4)?,
            mechanisms,
            count,
            array_null: rare(u, 24)?,
            live,
            unload: u.arbitrary()?,
        })
    }
}

/// Everything the fuzzer chooses for one load.
#[derive(Debug, Clone)]
struct Input {
    opts_min_minor: u32,
    opts_max_minor: u32,
    status: u32,
    message: Option<Message>,
    write_minor: bool,
    agreed_minor: u32,
    write_plugin: bool,
    plugin: Option<PluginDesc>,
}

impl Input {
    fn decode(u: &mut Unstructured<'_>) -> Result<Input> {
        let (opts_min_minor, opts_max_minor) = if rare(u, 16)? {
            (u.int_in_range(0..=2)?, u.int_in_range(0..=2)?)
        } else {
            (HOST_MIN_MINOR, HOST_MAX_MINOR)
        };
        let status = status(u, 16)?;
        let message = Message::decode_opt(u, status != MEMPLUG_STATUS_OK)?;
        let write_plugin = !rare(u, 32)?;
        let plugin = if rare(u, 32)? { None } else { Some(PluginDesc::decode(u)?) };
        let write_minor = !rare(u, 32)?;
        // A plugin agrees on the newest minor both speak, rarely on another.
        // The host caps the options at the newest minor it knows.
        let newest =
            plugin.as_ref().map_or(HOST_MAX_MINOR, |p| opts_max_minor.min(HOST_MAX_MINOR).min(p.max_minor));
        let agreed_minor =
            if rare(u, 16)? { interesting_u64(u, &[0, 1, 2, u32::MAX as u64])? as u32 } else { newest };
        Ok(Input {
            opts_min_minor,
            opts_max_minor,
            status,
            message,
            write_minor,
            agreed_minor,
            write_plugin,
            plugin,
        })
    }
}

// ----- the plugin's side: answers and well-behaved functions ----------------

/// A message as the plugin functions see it: bytes in the arena.
#[derive(Clone, Copy)]
struct RawMessage {
    ptr: *const c_char,
    len: usize,
}

struct EntryAnswer {
    opts_min_minor: u32,
    opts_max_minor: u32,
    status: u32,
    message: Option<RawMessage>,
    write_minor: bool,
    agreed_minor: u32,
    write_plugin: bool,
    plugin: *const MemplugPlugin,
}

struct PropsRuntime {
    status: u32,
    message: Option<RawMessage>,
    write: bool,
    min_alignment: u64,
    max_alignment: u64,
    granularity: u64,
    descriptor: MemplugProperties,
}

/// Calls the plugin functions saw (per thread: loads on other threads do
/// not disturb the count).
struct Counts {
    entry: Cell<u32>,
    props: Cell<u32>,
    stubs: Cell<u32>,
    memory_info: Cell<u32>,
    unload: Cell<u32>,
    /// What the entry found wrong in the host's `MemplugHostInfo` or
    /// `MemplugNegotiation`.
    host_fault: Cell<Option<&'static str>>,
}

thread_local! {
    static ANSWER: Cell<*const EntryAnswer> = const { Cell::new(ptr::null()) };
    static COUNTS: Counts = const {
        Counts {
            entry: Cell::new(0),
            props: Cell::new(0),
            stubs: Cell::new(0),
            memory_info: Cell::new(0),
            unload: Cell::new(0),
            host_fault: Cell::new(None),
        }
    };
}

fn bump(f: impl FnOnce(&Counts) -> &Cell<u32>) {
    COUNTS.with(|c| {
        let cell = f(c);
        cell.set(cell.get() + 1)
    });
}

fn count(f: impl FnOnce(&Counts) -> &Cell<u32>) -> u32 {
    COUNTS.with(|c| f(c).get())
}

unsafe fn write_message(sink: *const MemplugMessageSink, m: Option<RawMessage>) {
    let (Some(m), Some(sink)) = (m, sink.as_ref()) else { return };
    if let Some(write) = sink.write {
        write(sink.ctx, m.ptr, m.len);
    }
}

/// Writes `value` at `offset` of a host-owned struct only if it lies within
/// the `struct_size` the host set: a well-behaved plugin writes no byte past
/// it.
unsafe fn write_within<S, V: Copy>(out: *mut S, offset: usize, value: V) {
    let size = out.cast::<u32>().read_unaligned() as usize;
    if offset + size_of::<V>() <= size {
        out.cast::<u8>().add(offset).cast::<V>().write_unaligned(value);
    }
}

/// The in-process entry: answers from the thread-local the target set.
///
/// # Safety
/// Called by the host as `memplug_plugin_v1`, on the thread that set the
/// answer.
pub unsafe extern "C" fn fuzz_entry(
    host: *const MemplugHostInfo,
    out: *mut MemplugNegotiation,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    bump(|c| &c.entry);
    let a = ANSWER.with(Cell::get);
    assert!(!a.is_null(), "fuzz_entry called without a prepared answer");
    let a = &*a;
    let fault = match host.as_ref() {
        None => Some("host info is NULL"),
        Some(h) if h.struct_size < MEMPLUG_HOST_INFO_SIZE_1_0 => Some("host info is short"),
        Some(h) if h.abi_major != MEMPLUG_ABI_MAJOR => Some("host info names another major"),
        Some(h) if (h.min_minor, h.max_minor) != (a.opts_min_minor, a.opts_max_minor) => {
            Some("host info's minor range is not the load options'")
        }
        Some(h) if !h.host_name.is_null() && CStr::from_ptr(h.host_name).to_str().is_err() => {
            Some("host name is not UTF-8")
        }
        Some(_) if out.is_null() => Some("negotiation output is NULL"),
        Some(_) if (*out).struct_size < MEMPLUG_NEGOTIATION_SIZE_1_0 => Some("negotiation output is short"),
        Some(_) => None,
    };
    if fault.is_some() {
        COUNTS.with(|c| c.host_fault.set(fault));
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    write_message(sink, a.message);
    if a.write_minor {
        write_within(out, offset_of!(MemplugNegotiation, agreed_minor), a.agreed_minor);
    }
    if a.write_plugin {
        write_within(out, offset_of!(MemplugNegotiation, plugin), a.plugin);
    }
    a.status
}

unsafe extern "C" fn properties(
    ctx: *mut c_void,
    out: *mut MemplugProperties,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    bump(|c| &c.props);
    let Some(a) = ctx.cast::<PropsRuntime>().as_ref() else {
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    };
    if out.is_null() {
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    write_message(sink, a.message);
    if a.write {
        write_within(out, offset_of!(MemplugProperties, min_alignment), a.min_alignment);
        write_within(out, offset_of!(MemplugProperties, max_alignment), a.max_alignment);
        write_within(out, offset_of!(MemplugProperties, granularity), a.granularity);
        // The 1.2 descriptor, as far as the host's struct reaches (a host
        // below 1.2 passes the 1.0 size: nothing of it is written).
        let d = &a.descriptor;
        write_within(out, offset_of!(MemplugProperties, recommended_granularity), d.recommended_granularity);
        write_within(out, offset_of!(MemplugProperties, page_sizes), d.page_sizes);
        write_within(out, offset_of!(MemplugProperties, attributes), d.attributes);
        write_within(out, offset_of!(MemplugProperties, export_types), d.export_types);
        write_within(out, offset_of!(MemplugProperties, location_kind), d.location_kind);
        write_within(out, offset_of!(MemplugProperties, location_id), d.location_id);
        write_within(out, offset_of!(MemplugProperties, flags), d.flags);
        write_within(out, offset_of!(MemplugProperties, reserved1), d.reserved1);
        // 1.3's copy spaces, only into an 80-byte (1.3) struct.
        write_within(out, offset_of!(MemplugProperties, copy_kinds), d.copy_kinds);
        write_within(out, offset_of!(MemplugProperties, reserved2), d.reserved2);
    }
    a.status
}

unsafe extern "C" fn live_zero(_: *mut c_void) -> u64 {
    0
}

unsafe extern "C" fn live_one(_: *mut c_void) -> u64 {
    1
}

unsafe extern "C" fn unload(_: *mut c_void) {
    bump(|c| &c.unload);
}

unsafe extern "C" fn memory_info(
    _: *mut c_void,
    _: *mut MemplugMemoryInfo,
    _: *const MemplugMessageSink,
) -> MemplugStatus {
    bump(|c| &c.memory_info);
    MEMPLUG_STATUS_UNSUPPORTED
}

/// Slots the host has no business calling while it loads: each counts the
/// call and refuses.
mod stubs {
    use super::*;

    type Sink = *const MemplugMessageSink;
    type Obj = *const MemplugObjectRef;

    fn called() -> MemplugStatus {
        bump(|c| &c.stubs);
        MEMPLUG_STATUS_UNSUPPORTED
    }

    pub unsafe extern "C" fn make(
        _: *mut c_void,
        _: *const MemplugRequest,
        _: *mut MemplugBlock,
        _: Sink,
    ) -> u32 {
        called()
    }
    pub unsafe extern "C" fn object(_: *mut c_void, _: Obj, _: Sink) -> u32 {
        called()
    }
    pub unsafe extern "C" fn range(_: *mut c_void, _: Obj, _: u64, _: u64, _: Sink) -> u32 {
        called()
    }
    pub unsafe extern "C" fn committed(_: *mut c_void, _: Obj, _: *mut u64, _: Sink) -> u32 {
        called()
    }
    #[allow(clippy::too_many_arguments)]
    pub unsafe extern "C" fn map(
        _: *mut c_void,
        _: Obj,
        _: u64,
        _: Obj,
        _: u64,
        _: u64,
        _: u32,
        _: Sink,
    ) -> u32 {
        called()
    }
    pub unsafe extern "C" fn export_fd(_: *mut c_void, _: Obj, _: *mut i32, _: Sink) -> u32 {
        called()
    }
    pub unsafe extern "C" fn import_fd(
        _: *mut c_void,
        _: i32,
        _: *const MemplugRequest,
        _: *mut MemplugBlock,
        _: Sink,
    ) -> u32 {
        called()
    }
    pub unsafe extern "C" fn export_handle(
        _: *mut c_void,
        _: Obj,
        _: u32,
        _: *mut MemplugHandle,
        _: Sink,
    ) -> u32 {
        called()
    }
    pub unsafe extern "C" fn import_handle(
        _: *mut c_void,
        _: *const MemplugHandle,
        _: *const MemplugRequest,
        _: *mut MemplugBlock,
        _: Sink,
    ) -> u32 {
        called()
    }
    pub unsafe extern "C" fn stream_create(_: *mut c_void, _: *mut u64, _: Sink) -> u32 {
        called()
    }
    pub unsafe extern "C" fn stream_adopt(_: *mut c_void, _: *mut c_void, _: *mut u64, _: Sink) -> u32 {
        called()
    }
    pub unsafe extern "C" fn handle(_: *mut c_void, _: u64, _: Sink) -> u32 {
        called()
    }
    pub unsafe extern "C" fn enqueue(
        _: *mut c_void,
        _: u64,
        _: MemplugHostFn,
        _: *mut c_void,
        _: Sink,
    ) -> u32 {
        called()
    }
    pub unsafe extern "C" fn record(_: *mut c_void, _: u64, _: *mut u64, _: Sink) -> u32 {
        called()
    }
    pub unsafe extern "C" fn wait(_: *mut c_void, _: u64, _: u64, _: Sink) -> u32 {
        called()
    }
    pub unsafe extern "C" fn copy(_: *mut c_void, _: u64, _: u64, _: u64, _: u64, _: Sink) -> u32 {
        called()
    }
    pub unsafe extern "C" fn range_on(
        _: *mut c_void,
        _: Obj,
        _: u64,
        _: u64,
        _: u64,
        _: *mut u64,
        _: Sink,
    ) -> u32 {
        called()
    }
    #[allow(clippy::too_many_arguments)]
    pub unsafe extern "C" fn map_on(
        _: *mut c_void,
        _: Obj,
        _: u64,
        _: Obj,
        _: u64,
        _: u64,
        _: u32,
        _: u64,
        _: *mut u64,
        _: Sink,
    ) -> u32 {
        called()
    }
    pub unsafe extern "C" fn adopt_typed(
        _: *mut c_void,
        _: u32,
        _: *mut c_void,
        _: *mut u64,
        _: Sink,
    ) -> u32 {
        called()
    }
    pub unsafe extern "C" fn can_access_peer(
        _: *mut c_void,
        _: *const MemplugDevice,
        _: *mut u32,
        _: Sink,
    ) -> u32 {
        called()
    }
    pub unsafe extern "C" fn set_peer_access(
        _: *mut c_void,
        _: Obj,
        _: u64,
        _: u64,
        _: *const MemplugDevice,
        _: u32,
        _: Sink,
    ) -> u32 {
        called()
    }
}

// ----- laying the plugin out in fuzz-owned memory ---------------------------

/// The plugin in memory; everything it points to lives as long as this.
struct Built {
    _arena: GuardedArena,
    entry: Box<EntryAnswer>,
    /// Boxed: each mechanism's `ctx` points at its answer, which must not
    /// move when the vector grows.
    #[allow(clippy::vec_box)]
    _props: Vec<Box<PropsRuntime>>,
}

/// An ABI struct with every field zero (NULL pointers and slots): valid for
/// each of them, and fields a newer minor appends stay zero.
fn zeroed<T: Copy>() -> T {
    // SAFETY: only used for the `#[repr(C)]` ABI structs, whose fields are
    // integers, raw pointers and `Option<extern fn>`: all valid as zero.
    unsafe { std::mem::zeroed() }
}

fn placement<T>(odd: bool) -> Placement {
    if odd {
        Placement::Odd
    } else {
        Placement::Aligned(align_of::<T>())
    }
}

/// Writes `value` with `shape`'s `struct_size` into a buffer of the bytes a
/// plugin with that `struct_size` publishes (at least the field itself;
/// known fields past a short size are cut; a longer size gets the tail).
fn place<T: Copy>(arena: &mut GuardedArena, mut value: T, shape: &Shape) -> *const T {
    let size = size_of::<T>();
    // SAFETY: every ABI struct starts with its `uint32_t struct_size`.
    unsafe { ptr::addr_of_mut!(value).cast::<u32>().write_unaligned(shape.declared) };
    let declared = shape.declared as usize;
    let len = if declared >= size { size + shape.tail.len().min(declared - size) } else { declared.max(4) };
    let p = arena.alloc(len, placement::<T>(shape.odd));
    // SAFETY: `p` has `len` bytes; the ABI structs have no implicit padding,
    // so every byte of `value` is initialised.
    unsafe {
        ptr::copy_nonoverlapping(ptr::addr_of!(value).cast::<u8>(), p, len.min(size));
        if len > size {
            ptr::copy_nonoverlapping(shape.tail.as_ptr(), p.add(size), len - size);
        }
    }
    p.cast_const().cast()
}

fn place_text(arena: &mut GuardedArena, t: &Option<Text>) -> *const c_char {
    match t {
        None => ptr::null(),
        Some(t) => arena.bytes(&t.buffer, Placement::Aligned(1)).cast_const().cast(),
    }
}

fn place_message(arena: &mut GuardedArena, m: &Option<Message>) -> Option<RawMessage> {
    m.as_ref().map(|m| RawMessage {
        ptr: if m.null {
            ptr::null()
        } else {
            arena.bytes(&m.bytes, Placement::Aligned(1)).cast_const().cast()
        },
        len: m.bytes.len().max(usize::from(m.null)),
    })
}

fn place_table<T: Copy>(
    arena: &mut GuardedArena,
    t: &Option<Table>,
    value: impl FnOnce(&Table) -> T,
) -> *const T {
    match t {
        None => ptr::null(),
        Some(t) => place(arena, value(t), &t.shape),
    }
}

fn build(input: &Input) -> Built {
    let mut arena = GuardedArena::new();
    let mut props = Vec::new();
    let plugin = match &input.plugin {
        None => ptr::null(),
        Some(p) => {
            let mut entries = Vec::with_capacity(p.mechanisms.len());
            for m in &p.mechanisms {
                let Some(m) = m else {
                    entries.push(ptr::null::<MemplugMechanism>());
                    continue;
                };
                let answer = Box::new(PropsRuntime {
                    status: m.props.status,
                    message: place_message(&mut arena, &m.props.message),
                    write: m.props.write,
                    min_alignment: m.props.min_alignment,
                    max_alignment: m.props.max_alignment,
                    granularity: m.props.granularity,
                    descriptor: m.props.descriptor,
                });
                let ctx = if m.ctx_null {
                    ptr::null_mut()
                } else {
                    ptr::addr_of!(*answer).cast_mut().cast::<c_void>()
                };
                props.push(answer);
                let allocator = place_table(&mut arena, &m.allocator, |t| {
                    let mut v: MemplugAllocator = zeroed();
                    v.properties = t.slot("properties", properties as _);
                    v.allocate = t.slot("allocate", stubs::make as _);
                    v.deallocate = t.slot("deallocate", stubs::object as _);
                    v.memory_info = t.slot("memory_info", memory_info as _);
                    v
                });
                let virtual_backing = place_table(&mut arena, &m.virtual_backing, |t| {
                    let mut v: MemplugVirtualBacking = zeroed();
                    v.reserve = t.slot("reserve", stubs::make as _);
                    v.commit = t.slot("commit", stubs::range as _);
                    v.decommit = t.slot("decommit", stubs::range as _);
                    v.committed_bytes = t.slot("committed_bytes", stubs::committed as _);
                    v.release = t.slot("release", stubs::object as _);
                    v.commit_on = t.slot("commit_on", stubs::range_on as _);
                    v.decommit_on = t.slot("decommit_on", stubs::range_on as _);
                    v
                });
                let shared_mapping = place_table(&mut arena, &m.shared_mapping, |t| {
                    let mut v: MemplugSharedMapping = zeroed();
                    v.create = t.slot("create", stubs::make as _);
                    v.map = t.slot("map", stubs::map as _);
                    v.unmap = t.slot("unmap", stubs::range as _);
                    v.retain = t.slot("retain", stubs::object as _);
                    v.release = t.slot("release", stubs::object as _);
                    v.export_fd = t.slot("export_fd", stubs::export_fd as _);
                    v.import_fd = t.slot("import_fd", stubs::import_fd as _);
                    v.export_handle = t.slot("export_handle", stubs::export_handle as _);
                    v.import_handle = t.slot("import_handle", stubs::import_handle as _);
                    v.map_on = t.slot("map_on", stubs::map_on as _);
                    v.unmap_on = t.slot("unmap_on", stubs::range_on as _);
                    v
                });
                let sync = place_table(&mut arena, &m.sync, |t| {
                    let mut v: MemplugSync = zeroed();
                    v.stream_create = t.slot("stream_create", stubs::stream_create as _);
                    v.stream_adopt = t.slot("stream_adopt", stubs::stream_adopt as _);
                    v.stream_destroy = t.slot("stream_destroy", stubs::handle as _);
                    v.enqueue_host_fn = t.slot("enqueue_host_fn", stubs::enqueue as _);
                    v.fence_record = t.slot("fence_record", stubs::record as _);
                    v.fence_query = t.slot("fence_query", stubs::handle as _);
                    v.fence_wait = t.slot("fence_wait", stubs::wait as _);
                    v.fence_destroy = t.slot("fence_destroy", stubs::handle as _);
                    v.stream_wait_fence = t.slot("stream_wait_fence", stubs::wait as _);
                    v.stream_adopt_typed = t.slot("stream_adopt_typed", stubs::adopt_typed as _);
                    v.copy = t.slot("copy", stubs::copy as _);
                    v
                });
                let peer_access = place_table(&mut arena, &m.peer_access, |t| {
                    let mut v: MemplugPeerAccess = zeroed();
                    v.can_access_peer = t.slot("can_access_peer", stubs::can_access_peer as _);
                    v.set_peer_access = t.slot("set_peer_access", stubs::set_peer_access as _);
                    v
                });
                let mut desc: MemplugMechanism = zeroed();
                desc.capabilities = m.capabilities;
                desc.mechanism_id = m.id;
                desc.name = place_text(&mut arena, &m.name);
                desc.device = m.device;
                desc.ctx = ctx;
                desc.allocator = allocator;
                desc.virtual_backing = virtual_backing;
                desc.shared_mapping = shared_mapping;
                desc.sync = sync;
                desc.identity = match &m.identity {
                    None => ptr::null(),
                    Some(id) => place(&mut arena, id.value, &id.shape),
                };
                desc.peer_access = peer_access;
                entries.push(place(&mut arena, desc, &m.shape));
            }
            let array = if p.array_null {
                ptr::null()
            } else {
                let a = arena
                    .alloc(entries.len() * size_of::<*const MemplugMechanism>(), Placement::Aligned(8))
                    .cast::<*const MemplugMechanism>();
                for (i, e) in entries.iter().enumerate() {
                    // SAFETY: `a` has room for `entries.len()` aligned pointers.
                    unsafe { a.add(i).write(*e) };
                }
                a.cast_const()
            };
            let name = place_text(&mut arena, &p.name);
            let version = place_text(&mut arena, &p.version);
            // The plugin context is opaque to the host: any fuzz-owned address.
            let ctx = if p.ctx_null { ptr::null_mut() } else { arena.alloc(8, Placement::Aligned(8)).cast() };
            let mut desc: MemplugPlugin = zeroed();
            desc.abi_major = p.abi_major;
            desc.min_minor = p.min_minor;
            desc.max_minor = p.max_minor;
            desc.name = name;
            desc.version = version;
            desc.ctx = ctx;
            desc.mechanism_count = p.count;
            desc.mechanisms = array;
            desc.live_objects = match p.live {
                Live::Null => None,
                Live::Zero => Some(live_zero),
                Live::One => Some(live_one),
            };
            desc.unload = p.unload.then_some(unload as _);
            place(&mut arena, desc, &p.shape)
        }
    };
    let entry = Box::new(EntryAnswer {
        opts_min_minor: input.opts_min_minor,
        // What the host tells the entry: its options capped at the newest
        // minor it knows.
        opts_max_minor: input.opts_max_minor.min(HOST_MAX_MINOR),
        status: input.status,
        message: place_message(&mut arena, &input.message),
        write_minor: input.write_minor,
        agreed_minor: input.agreed_minor,
        write_plugin: input.write_plugin,
        plugin,
    });
    Built { _arena: arena, entry, _props: props }
}

// ----- the model: what a correct loader does with this input ----------------

/// The kinds of refusal, as `LoadError` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    EntryFailed,
    VersionMismatch,
    ShortStruct,
    NullRequired,
    CapabilityMismatch,
    Malformed,
    Properties,
}

impl Kind {
    const ALL: [Kind; 7] = [
        Kind::EntryFailed,
        Kind::VersionMismatch,
        Kind::ShortStruct,
        Kind::NullRequired,
        Kind::CapabilityMismatch,
        Kind::Malformed,
        Kind::Properties,
    ];
}

/// Outcomes so far in this process: loads, then refusals by kind.
static OUTCOMES: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];

/// How many inputs loaded and how many were refused, by kind of refusal,
/// in this process so far (to see what an input set reaches).
pub fn outcomes() -> Vec<(String, u64)> {
    let mut v = vec![("loaded".to_string(), OUTCOMES[0].load(Ordering::Relaxed))];
    for (i, k) in Kind::ALL.iter().enumerate() {
        v.push((format!("{k:?}"), OUTCOMES[i + 1].load(Ordering::Relaxed)));
    }
    v
}

/// Mechanisms loaded with what ABI 1.2 added, in this process so far: a
/// peer access table, queue-ordered binding, an identity from a struct of
/// 80 to 87 bytes (the whole pointer, and no peer access pointer).
static LOADED_1_2: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];

/// How many loaded mechanisms had each 1.2 feature (see [`outcomes`]).
pub fn loaded_1_2() -> Vec<(String, u64)> {
    ["peer_access", "queued_binding", "identity_at_80"]
        .iter()
        .zip(&LOADED_1_2)
        .map(|(n, c)| (n.to_string(), c.load(Ordering::Relaxed)))
        .collect()
}

fn kind_of(e: &LoadError) -> Option<Kind> {
    Some(match e {
        LoadError::EntryFailed { .. } => Kind::EntryFailed,
        LoadError::VersionMismatch { .. } => Kind::VersionMismatch,
        LoadError::ShortStruct { .. } => Kind::ShortStruct,
        LoadError::NullRequired { .. } => Kind::NullRequired,
        LoadError::CapabilityMismatch { .. } => Kind::CapabilityMismatch,
        LoadError::Malformed { .. } => Kind::Malformed,
        LoadError::Properties { .. } => Kind::Properties,
        _ => return None,
    })
}

#[derive(Debug, PartialEq, Eq)]
struct ExpectedMech {
    name: String,
    id: u64,
    device: MemplugDevice,
    capabilities: u32,
    properties: Properties,
    virtual_backing: bool,
    /// `Some(can_export)` when the mechanism has shared mapping.
    shared_mapping: Option<bool>,
    /// `Some(can_adopt)` when the mechanism has sync.
    sync: Option<bool>,
    memory_info: bool,
    /// The 1.2 identity the host keeps (known `valid` bits only).
    identity: Option<MemplugDeviceIdentity>,
    /// Whether the host keeps a 1.2 peer access table.
    peer_access: bool,
}

#[derive(Debug)]
struct Expected {
    name: String,
    version: String,
    agreed_minor: u32,
    minors: (u32, u32),
    mechanisms: Vec<ExpectedMech>,
    live: u64,
    unload: bool,
}

/// Every fault a correct loader could report for this input (as far as it
/// can read), each with the kind of refusal it maps to; `Ok` when none.
fn expect(input: &Input) -> std::result::Result<Expected, Vec<(Kind, String)>> {
    let mut faults: Vec<(Kind, String)> = Vec::new();
    let mut fault = |k: Kind, s: String| faults.push((k, s));
    if input.status != MEMPLUG_STATUS_OK {
        let kind = if input.status == MEMPLUG_STATUS_VERSION_MISMATCH {
            Kind::VersionMismatch
        } else {
            Kind::EntryFailed
        };
        return Err(vec![(kind, format!("the entry returned {}", input.status))]);
    }
    let Some(p) = input.plugin.as_ref().filter(|_| input.write_plugin) else {
        return Err(vec![(Kind::NullRequired, "no plugin descriptor".into())]);
    };
    if p.shape.declared < MEMPLUG_PLUGIN_SIZE_1_0 {
        return Err(vec![(Kind::ShortStruct, "short plugin descriptor".into())]);
    }
    if p.abi_major != MEMPLUG_ABI_MAJOR {
        fault(Kind::Malformed, format!("abi_major {}", p.abi_major));
    }
    if p.min_minor > p.max_minor {
        fault(Kind::Malformed, "empty minor range".into());
    }
    let lo = input.opts_min_minor.max(p.min_minor);
    let hi = input.opts_max_minor.min(HOST_MAX_MINOR).min(p.max_minor);
    let agreed = if input.write_minor { input.agreed_minor } else { u32::MAX };
    if lo > hi {
        fault(Kind::VersionMismatch, format!("no common minor in {lo}..={hi}"));
    } else if !(lo..=hi).contains(&agreed) {
        fault(Kind::Malformed, format!("agreed minor {agreed} outside {lo}..={hi}"));
    }
    // Minor-range faults can also surface as the other kind when both
    // ranges are off at once (e.g. an empty plugin range seen as no overlap).
    if p.min_minor > p.max_minor || lo > hi {
        fault(Kind::VersionMismatch, "minor ranges".into());
        fault(Kind::Malformed, "minor ranges".into());
    }
    let mut text = |t: &Option<Text>, what: &str| match t {
        None => {
            fault(Kind::NullRequired, format!("{what} is NULL"));
            None
        }
        Some(t) => match t.read() {
            Ok(s) => Some(s),
            Err(e) => {
                fault(Kind::Malformed, format!("{what}: {e}"));
                None
            }
        },
    };
    let name = text(&p.name, "plugin name");
    let version = text(&p.version, "plugin version");
    let live = match p.live {
        Live::Null => {
            fault(Kind::NullRequired, "live_objects is NULL".into());
            0
        }
        Live::Zero => 0,
        Live::One => 1,
    };
    if p.count == 0 {
        fault(Kind::Malformed, "no mechanism".into());
    }
    let mut mechanisms = Vec::new();
    if p.array_null {
        fault(Kind::NullRequired, "mechanism array is NULL".into());
    } else {
        let mut ids = HashSet::new();
        let mut names = HashSet::new();
        for (i, m) in p.mechanisms.iter().take(p.count as usize).enumerate() {
            match expect_mechanism(i, m.as_ref(), agreed, &mut fault) {
                Some(e) => {
                    if !ids.insert(e.id) {
                        fault(Kind::Malformed, format!("duplicate id {}", e.id));
                    }
                    if !names.insert(e.name.clone()) {
                        fault(Kind::Malformed, format!("duplicate name {}", e.name));
                    }
                    mechanisms.push(e);
                }
                None => break,
            }
        }
    }
    if !faults.is_empty() {
        return Err(faults);
    }
    Ok(Expected {
        name: name.expect("no fault"),
        version: version.expect("no fault"),
        agreed_minor: agreed,
        minors: (p.min_minor, p.max_minor),
        mechanisms,
        live,
        unload: p.unload,
    })
}

/// One mechanism's faults; `None` when it has any (the loader stops there).
fn expect_mechanism(
    i: usize,
    m: Option<&Mech>,
    minor: u32,
    fault: &mut impl FnMut(Kind, String),
) -> Option<ExpectedMech> {
    let Some(m) = m else {
        fault(Kind::NullRequired, format!("mechanism #{i} is NULL"));
        return None;
    };
    if m.shape.declared < MEMPLUG_MECHANISM_SIZE_1_0 {
        fault(Kind::ShortStruct, format!("mechanism #{i} is short"));
        return None;
    }
    let mut ok = true;
    let mut bad = |k: Kind, s: String| {
        ok = false;
        fault(k, s)
    };
    let name = match &m.name {
        None => {
            bad(Kind::NullRequired, format!("mechanism #{i} name is NULL"));
            String::new()
        }
        Some(t) => t.read().unwrap_or_else(|e| {
            bad(Kind::Malformed, format!("mechanism #{i} name: {e}"));
            String::new()
        }),
    };
    if m.id == 0 {
        bad(Kind::Malformed, format!("mechanism #{i} has id 0"));
    }
    let caps = m.capabilities;
    if caps & MEMPLUG_CAP_ALLOCATOR == 0 || m.allocator.is_none() {
        bad(Kind::CapabilityMismatch, format!("mechanism #{i}: allocator flag or pointer missing"));
    }
    for (bit, t) in [
        (MEMPLUG_CAP_VIRTUAL_BACKING, &m.virtual_backing),
        (MEMPLUG_CAP_SHARED_MAPPING, &m.shared_mapping),
        (MEMPLUG_CAP_SYNC, &m.sync),
    ] {
        if (caps & bit != 0) != t.is_some() {
            bad(
                Kind::CapabilityMismatch,
                format!("mechanism #{i}: flag {bit:#x} disagrees with its pointer"),
            );
        }
    }
    let mut table = |t: &Option<Table>, what: &str| {
        if let Some(t) = t {
            if t.shape.declared < t.size_1_0 {
                bad(Kind::ShortStruct, format!("mechanism #{i} {what} is short"));
            } else if t.lacks_required() {
                bad(Kind::NullRequired, format!("mechanism #{i} {what} lacks a required slot"));
            }
        }
    };
    table(&m.allocator, "allocator");
    table(&m.virtual_backing, "virtual_backing");
    table(&m.shared_mapping, "shared_mapping");
    table(&m.sync, "sync");
    // ABI 1.1: MEMPLUG_CAP_SHARED_EXPORT needs an agreed minor of 1 or more,
    // the shared mapping capability, a table long enough for its two slots
    // and both slots; the slots without the flag contradict it (a reader
    // that agreed on 1.0 ignores them, as a 1.0 reader would).
    let export = caps & MEMPLUG_CAP_SHARED_EXPORT != 0;
    let sm = m.shared_mapping.as_ref();
    let long_sm = sm.is_some_and(|t| t.shape.declared >= MEMPLUG_SHARED_MAPPING_SIZE_1_1);
    let export_slots = sm.map_or((false, false), |t| (t.published("export_fd"), t.published("import_fd")));
    if export {
        if minor < 1 || caps & MEMPLUG_CAP_SHARED_MAPPING == 0 || (sm.is_some() && !long_sm) {
            bad(Kind::CapabilityMismatch, format!("mechanism #{i}: SHARED_EXPORT without its conditions"));
        } else if sm.is_some() && export_slots != (true, true) {
            bad(Kind::NullRequired, format!("mechanism #{i}: SHARED_EXPORT without export_fd/import_fd"));
        }
    } else if minor >= 1 && long_sm && (export_slots.0 || export_slots.1) {
        bad(Kind::CapabilityMismatch, format!("mechanism #{i}: export slots without SHARED_EXPORT"));
    }
    // ABI 1.2: MEMPLUG_CAP_TYPED_EXPORT likewise, at an agreed minor of 2
    // or more with a table of the 1.2 size and both typed slots. (Without
    // the shared mapping capability there is no table to hold them: the
    // flag alone is not judged, as the host reads no table.)
    let typed = caps & MEMPLUG_CAP_TYPED_EXPORT != 0;
    let long_sm_1_2 = sm.is_some_and(|t| t.shape.declared >= MEMPLUG_SHARED_MAPPING_SIZE_1_2);
    let typed_slots =
        sm.map_or((false, false), |t| (t.published("export_handle"), t.published("import_handle")));
    if typed && caps & MEMPLUG_CAP_SHARED_MAPPING == 0 {
        bad(Kind::CapabilityMismatch, format!("mechanism #{i}: TYPED_EXPORT without SHARED_MAPPING"));
    }
    if sm.is_some() {
        if typed {
            if minor < 2 || !long_sm_1_2 {
                bad(Kind::CapabilityMismatch, format!("mechanism #{i}: TYPED_EXPORT without its conditions"));
            } else if typed_slots != (true, true) {
                bad(
                    Kind::NullRequired,
                    format!("mechanism #{i}: TYPED_EXPORT without export_handle/import_handle"),
                );
            }
        } else if minor >= 2 && long_sm_1_2 && (typed_slots.0 || typed_slots.1) {
            bad(Kind::CapabilityMismatch, format!("mechanism #{i}: typed export slots without TYPED_EXPORT"));
        }
    }
    // ABI 1.2: queue-ordered binding, at an agreed minor of 2 or more, with
    // virtual backing and sync, a virtual backing table of the 1.2 size
    // with commit_on/decommit_on and, with a shared mapping, a table of the
    // 1.2 size with map_on/unmap_on. Without the flag the slots are
    // ignored (the host clears them).
    if caps & MEMPLUG_CAP_QUEUED_BINDING != 0 {
        if minor < 2 {
            bad(Kind::CapabilityMismatch, format!("mechanism #{i}: QUEUED_BINDING below 1.2"));
        } else if caps & MEMPLUG_CAP_VIRTUAL_BACKING == 0 || caps & MEMPLUG_CAP_SYNC == 0 {
            bad(Kind::CapabilityMismatch, format!("mechanism #{i}: QUEUED_BINDING without VB and SYNC"));
        } else {
            let tables = [
                (m.virtual_backing.as_ref(), MEMPLUG_VIRTUAL_BACKING_SIZE_1_2, ["commit_on", "decommit_on"]),
                (
                    m.shared_mapping.as_ref().filter(|_| caps & MEMPLUG_CAP_SHARED_MAPPING != 0),
                    MEMPLUG_SHARED_MAPPING_SIZE_1_2,
                    ["map_on", "unmap_on"],
                ),
            ];
            for (t, size, slots) in tables {
                let Some(t) = t else { continue };
                if t.shape.declared < size {
                    bad(
                        Kind::CapabilityMismatch,
                        format!("mechanism #{i}: QUEUED_BINDING with a short table"),
                    );
                } else if !slots.iter().all(|s| t.published(s)) {
                    bad(Kind::NullRequired, format!("mechanism #{i}: QUEUED_BINDING without {slots:?}"));
                }
            }
        }
    }
    // ABI 1.2: peer access, at an agreed minor of 2 or more: the flag and
    // the pointer agree (a struct too short to hold the whole pointer
    // publishes none), the table is at least its size with both slots.
    // Below 1.2 the flag is a contradiction and the pointer is ignored.
    let peer = caps & MEMPLUG_CAP_PEER_ACCESS != 0;
    let peer_seen = m.peer_access.as_ref().filter(|_| m.shape.declared >= MECHANISM_REACHES_PEER_ACCESS);
    let mut peer_access = false;
    if minor < 2 {
        if peer {
            bad(Kind::CapabilityMismatch, format!("mechanism #{i}: PEER_ACCESS below 1.2"));
        }
    } else {
        match (peer, peer_seen) {
            (false, None) => {}
            (true, None) | (false, Some(_)) => bad(
                Kind::CapabilityMismatch,
                format!("mechanism #{i}: PEER_ACCESS disagrees with its pointer"),
            ),
            (true, Some(t)) => {
                if t.shape.declared < t.size_1_0 {
                    bad(Kind::ShortStruct, format!("mechanism #{i}: peer_access is short"));
                } else if t.lacks_required() {
                    bad(Kind::NullRequired, format!("mechanism #{i}: peer_access lacks a slot"));
                }
                peer_access = true;
            }
        }
    }
    // ABI 1.2: the identity, read at an agreed minor of 2 or more when the
    // mechanism's struct holds the whole pointer and it is not NULL.
    let reaches_identity = m.shape.declared >= MECHANISM_REACHES_IDENTITY;
    let identity = match &m.identity {
        Some(id) if minor >= 2 && reaches_identity => {
            if id.shape.declared < MEMPLUG_DEVICE_IDENTITY_SIZE_1_2 {
                bad(Kind::ShortStruct, format!("mechanism #{i}: identity is short"));
                None
            } else {
                Some(MemplugDeviceIdentity {
                    struct_size: id.shape.declared,
                    valid: id.value.valid & KNOWN_IDENTITY,
                    ..id.value
                })
            }
        }
        _ => None,
    };
    let a = &m.props;
    if m.ctx_null || a.status != MEMPLUG_STATUS_OK {
        bad(Kind::Properties, format!("mechanism #{i}: properties fails"));
    }
    let (min, max, gran) =
        if a.write { (a.min_alignment, a.max_alignment, a.granularity) } else { (0, 0, 0) };
    if !min.is_power_of_two() || !max.is_power_of_two() || max < min {
        bad(Kind::Malformed, format!("mechanism #{i}: alignments {min}..{max}"));
    }
    let needs_granularity = caps & (MEMPLUG_CAP_VIRTUAL_BACKING | MEMPLUG_CAP_SHARED_MAPPING) != 0;
    if needs_granularity && !gran.is_power_of_two() {
        bad(Kind::Malformed, format!("mechanism #{i}: granularity {gran}"));
    }
    // ABI 1.2: the host asks for the descriptor only at an agreed minor of
    // 2 or more; it judges the recommended granularity and keeps the rest
    // as published (bits of a later minor included).
    let descriptor = if minor >= 2 && a.write {
        let d = &a.descriptor;
        let r = d.recommended_granularity;
        if r != 0 && (!r.is_power_of_two() || r % gran.max(1) != 0) {
            bad(Kind::Malformed, format!("mechanism #{i}: recommended_granularity {r:#x}"));
        }
        Descriptor {
            recommended_granularity: r,
            page_sizes: d.page_sizes,
            attributes: d.attributes,
            export_types: d.export_types,
            location: Location { kind: d.location_kind, id: d.location_id },
            maps_at_offsets: d.flags & MEMPLUG_PROP_MAPS_AT_OFFSETS != 0,
        }
    } else {
        Descriptor::default()
    };
    // ABI 1.3: the copy spaces (asked for in 80-byte properties only at an
    // agreed minor of 3 or more) and the `copy` slot (read only then, from
    // a sync table long enough to hold it) agree, or the load is refused.
    let copy_slot = minor >= 3
        && caps & MEMPLUG_CAP_SYNC != 0
        && m.sync.as_ref().is_some_and(|t| t.shape.declared >= MEMPLUG_SYNC_SIZE_1_3 && t.published("copy"));
    let copy_kinds = if minor >= 3 && a.write { a.descriptor.copy_kinds } else { 0 };
    if copy_slot != (copy_kinds != 0) {
        bad(
            Kind::Malformed,
            format!("mechanism #{i}: copy slot {copy_slot} with copy_kinds {copy_kinds:#x}"),
        );
    }
    if !ok {
        return None;
    }
    let alloc = m.allocator.as_ref().expect("checked");
    Some(ExpectedMech {
        name,
        id: m.id,
        device: m.device,
        capabilities: caps,
        properties: Properties {
            min_alignment: min,
            max_alignment: max,
            granularity: gran,
            descriptor,
            copy_kinds: CopyKinds(copy_kinds),
        },
        virtual_backing: m.virtual_backing.is_some(),
        shared_mapping: m.shared_mapping.as_ref().map(|_| export),
        sync: m.sync.as_ref().map(|t| t.published("stream_adopt")),
        memory_info: alloc.published("memory_info"),
        identity,
        peer_access,
    })
}

// ----- the target ------------------------------------------------------------

/// Runs one input. Panics (the fuzzer's crash) when the host misbehaves.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(input) = Input::decode(&mut u) else { return };
    check(&input);
}

/// The plugin an input decodes to (for reading a crash).
pub fn describe(data: &[u8]) -> String {
    match Input::decode(&mut Unstructured::new(data)) {
        Ok(input) => format!("{input:#?}"),
        Err(e) => format!("undecodable: {e}"),
    }
}

fn check(input: &Input) {
    let built = build(input);
    COUNTS.with(|c| {
        for cell in [&c.entry, &c.props, &c.stubs, &c.memory_info, &c.unload] {
            cell.set(0);
        }
        c.host_fault.set(None);
    });
    ANSWER.with(|a| a.set(&*built.entry));
    let opts = LoadOptions {
        min_minor: input.opts_min_minor,
        max_minor: input.opts_max_minor,
        ..LoadOptions::default()
    };
    // SAFETY: `fuzz_entry` and everything it publishes stay valid until
    // `built` drops, after the plugin (below).
    let loaded = unsafe { Plugin::from_entry(fuzz_entry, "fuzz", &opts) };
    ANSWER.with(|a| a.set(ptr::null()));
    if let Some(f) = COUNTS.with(|c| c.host_fault.get()) {
        panic!("the host passed the entry bad arguments: {f}");
    }
    assert_eq!(count(|c| &c.entry), 1, "the entry runs exactly once per load");
    assert_eq!(count(|c| &c.stubs), 0, "the host called a slot other than properties while loading");
    let expected = expect(input);
    let slot = match &loaded {
        Ok(_) => 0,
        Err(e) => kind_of(e).map_or(0, |k| 1 + Kind::ALL.iter().position(|x| *x == k).expect("listed")),
    };
    OUTCOMES[slot].fetch_add(1, Ordering::Relaxed);
    match (loaded, expected) {
        (Ok(plugin), Ok(e)) => {
            let mechs =
                input.plugin.iter().flat_map(|p| p.mechanisms.iter().take(p.count as usize).flatten());
            for (m, got) in mechs.zip(&e.mechanisms) {
                let at_80 =
                    (MECHANISM_REACHES_IDENTITY..MECHANISM_REACHES_PEER_ACCESS).contains(&m.shape.declared);
                for (i, hit) in [
                    got.peer_access,
                    got.capabilities & MEMPLUG_CAP_QUEUED_BINDING != 0,
                    at_80 && got.identity.is_some(),
                ]
                .into_iter()
                .enumerate()
                {
                    if hit {
                        LOADED_1_2[i].fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            check_loaded(plugin, &e)
        }
        (Err(err), Err(faults)) => check_refusal(input, &err, &faults),
        (Ok(plugin), Err(faults)) => {
            panic!("the host loaded a malformed plugin {plugin:?}\nfaults: {faults:?}\ninput: {input:#?}")
        }
        (Err(err), Ok(e)) => {
            panic!("the host refused a well-formed plugin: {err}\nexpected: {e:#?}\ninput: {input:#?}")
        }
    }
    assert!(count(|c| &c.unload) <= 1, "unload called more than once");
    drop(built);
}

fn check_refusal(input: &Input, err: &LoadError, faults: &[(Kind, String)]) {
    let text = err.to_string();
    assert!(!text.is_empty());
    let kind = kind_of(err).unwrap_or_else(|| panic!("an in-process load failed with {err:?}"));
    assert!(
        faults.iter().any(|(k, _)| *k == kind),
        "the host refused with {kind:?} ({err}), but the faults are {faults:?}\ninput: {input:#?}"
    );
    let no_message = || "the plugin gave no message".to_string();
    match err {
        LoadError::EntryFailed { status, raw, message, .. } => {
            assert_eq!(*raw, input.status);
            assert_eq!(*status, Status::from_raw_conservative(input.status));
            let want = input.message.as_ref().and_then(Message::kept).unwrap_or_else(no_message);
            assert_eq!(*message, want, "the entry's message was not kept as written");
        }
        LoadError::VersionMismatch { message, .. } if input.status == MEMPLUG_STATUS_VERSION_MISMATCH => {
            let want = input.message.as_ref().and_then(Message::kept).unwrap_or_else(no_message);
            assert_eq!(*message, want, "the entry's message was not kept as written");
        }
        LoadError::Properties { mechanism, source, .. } => {
            assert_ne!(source.raw, MEMPLUG_STATUS_OK);
            assert_eq!(source.status, Status::from_raw_conservative(source.raw));
            let p = input.plugin.as_ref().expect("properties ran");
            let candidates: Vec<&Mech> = p
                .mechanisms
                .iter()
                .flatten()
                .filter(|m| m.name.as_ref().and_then(|t| t.read().ok()).as_deref() == Some(mechanism))
                .collect();
            assert!(!candidates.is_empty(), "properties failed for an unknown mechanism '{mechanism}'");
            assert!(
                candidates.iter().any(|m| {
                    let want = if m.ctx_null {
                        (MEMPLUG_STATUS_INVALID_ARGUMENT, no_message())
                    } else {
                        (
                            m.props.status,
                            m.props.message.as_ref().and_then(Message::kept).unwrap_or_else(no_message),
                        )
                    };
                    want == (source.raw, source.message.clone())
                }),
                "properties failure {source:?} matches no mechanism's answer"
            );
        }
        _ => {}
    }
}

fn check_loaded(plugin: Plugin, e: &Expected) {
    assert_eq!(plugin.name(), e.name);
    assert_eq!(plugin.version(), e.version);
    assert!(plugin.origin().contains("fuzz"));
    assert_eq!(plugin.abi_version(), (MEMPLUG_ABI_MAJOR, e.agreed_minor));
    assert_eq!(plugin.plugin_minor_range(), e.minors);
    assert_eq!(count(|c| &c.props), e.mechanisms.len() as u32, "properties runs once per mechanism");
    let got: Vec<ExpectedMech> = plugin
        .mechanisms()
        .iter()
        .map(|m| ExpectedMech {
            name: m.name().to_string(),
            id: m.id(),
            device: m.device().0,
            capabilities: m.capabilities().0,
            properties: m.properties(),
            virtual_backing: unsafe { m.ungoverned() }.virtual_backing().is_some(),
            shared_mapping: unsafe { m.ungoverned() }.shared_mapping().map(|s| s.can_export()),
            sync: m.sync().map(|s| s.can_adopt()),
            memory_info: m.memory_info().is_some(),
            identity: m.identity(),
            peer_access: m.peer_access().is_some(),
        })
        .collect();
    assert_eq!(got, e.mechanisms);
    let with_info = e.mechanisms.iter().filter(|m| m.memory_info).count() as u32;
    assert_eq!(count(|c| &c.memory_info), with_info, "memory_info called without being published");
    for m in plugin.mechanisms() {
        assert!(plugin.mechanism(m.name()).is_some_and(|x| x.same_as(m)));
        assert_eq!(m.plugin_name(), e.name);
        if let Some(r) = m.memory_info() {
            let err = r.expect_err("the stub refuses");
            assert_eq!(err.raw, MEMPLUG_STATUS_UNSUPPORTED);
        }
    }
    assert_eq!(plugin.plugin_live_objects(), e.live);
    let report = plugin.live_report();
    assert!(report.objects.is_empty() && report.handles.is_empty(), "{report:?}");
    assert_eq!(report.plugin_reported, e.live);
    assert_eq!(count(|c| &c.stubs), 0, "a slot was called by merely inspecting the plugin");
    match plugin.unload() {
        Ok(()) => {
            assert_eq!(e.live, 0, "unloaded while the plugin reports live objects");
            assert_eq!(count(|c| &c.unload), u32::from(e.unload), "unload callback count");
        }
        Err(refused) => {
            assert_ne!(e.live, 0, "unload refused: {refused}");
            assert_eq!(refused.report.plugin_reported, e.live);
            drop(refused);
            assert_eq!(count(|c| &c.unload), 0, "unload called while the plugin reports live objects");
        }
    }
}
