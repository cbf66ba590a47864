//! `memplug inspect`.

use crate::exit::{COULD_NOT_RUN, OK};
use crate::locate;
use crate::output::{complain, Stdout};
use crate::schema::{self, CouldNotRun};
use memplug_host::{Descriptor, DeviceIdentity, Mechanism, Plugin};
use memplug_sdk::abi::*;
use serde::Serialize;
use std::io::Write;
use std::path::Path;

/// `memplug inspect --json` (`docs/cli.md`).
#[derive(Serialize)]
struct PluginView {
    /// [`schema::INSPECT`].
    schema_version: u32,
    /// True: the plugin loaded and was read (a plugin that cannot be
    /// loaded gets [`CouldNotRun`] instead).
    ok: bool,
    counts: Counts,
    name: String,
    version: String,
    origin: String,
    abi: String,
    plugin_abi_range: String,
    mechanisms: Vec<MechanismView>,
}

#[derive(Serialize, Default)]
struct Counts {
    /// The mechanisms the plugin publishes (the length of `mechanisms`).
    mechanisms: usize,
}

#[derive(Serialize)]
struct MechanismView {
    name: String,
    id: u64,
    device: String,
    capabilities: Vec<&'static str>,
    unknown_capability_bits: u32,
    min_alignment: u64,
    max_alignment: u64,
    granularity: u64,
    stream_adopt: Option<bool>,
    memory: Option<MemoryView>,
    /// ABI 1.2's memory descriptor; `null` when the plugin agreed on an
    /// older minor (the host reads none of it then).
    descriptor: Option<DescriptorView>,
    /// ABI 1.2's device identity; `null` when the plugin published none
    /// (or agreed on an older minor).
    identity: Option<IdentityView>,
    /// ABI 1.3's `copy_kinds` (`device`, `host`, `peer`); `null` below 1.3.
    copy_kinds: Option<Vec<&'static str>>,
    /// `MEMPLUG_COPY_*` bits this host does not know.
    unknown_copy_kind_bits: u32,
    /// The optional slots the host can see published, as `table.slot`
    /// (`allocator.memory_info`, `sync.stream_adopt`, `sync.copy`,
    /// `shared_mapping.export_fd`, `shared_mapping.import_fd`).
    optional_slots: Vec<&'static str>,
}

#[derive(Serialize)]
struct DescriptorView {
    /// Zero: the same as `granularity`.
    recommended_granularity: u64,
    /// Page sizes in bytes, smallest first (empty: not said).
    page_sizes: Vec<u64>,
    attributes: Vec<&'static str>,
    /// `MEMPLUG_ATTR_*` bits this host does not know (a later minor's).
    unknown_attribute_bits: u32,
    export_types: Vec<&'static str>,
    /// `MEMPLUG_HANDLE_*` bits this host does not know.
    unknown_export_type_bits: u32,
    location: LocationView,
    maps_at_offsets: bool,
}

#[derive(Serialize)]
struct LocationView {
    /// `any` (not said), `device`, `host`, `numa_node`, `tier`, or
    /// `unknown(N)`.
    kind: String,
    /// The NUMA node or tier `kind` names; zero otherwise.
    id: u32,
}

#[derive(Serialize)]
struct IdentityView {
    /// Each field is `null` unless its `MEMPLUG_IDENTITY_*` bit is set.
    uuid: Option<String>,
    /// `domain:bus:device.function`, in hex, as `lspci -D` writes it.
    pci: Option<String>,
    sub_device: Option<u32>,
    numa_node: Option<u32>,
}

const ATTRIBUTES: &[(u32, &str)] = &[
    (MEMPLUG_ATTR_DEVICE_LOCAL, "device_local"),
    (MEMPLUG_ATTR_HOST_VISIBLE, "host_visible"),
    (MEMPLUG_ATTR_HOST_COHERENT, "host_coherent"),
    (MEMPLUG_ATTR_PINNED, "pinned"),
    (MEMPLUG_ATTR_COMPRESSED, "compressed"),
    (MEMPLUG_ATTR_RDMA, "rdma"),
    (MEMPLUG_ATTR_READ_ONLY_ENFORCED, "read_only_enforced"),
    (MEMPLUG_ATTR_ZERO_FILLED, "zero_filled"),
];

const HANDLES: &[(u32, &str)] = &[
    (MEMPLUG_HANDLE_OPAQUE_FD, "opaque_fd"),
    (MEMPLUG_HANDLE_DMABUF_FD, "dmabuf_fd"),
    (MEMPLUG_HANDLE_MEMFD, "memfd"),
    (MEMPLUG_HANDLE_WIN32, "win32"),
    (MEMPLUG_HANDLE_VENDOR_BLOB, "vendor_blob"),
];

/// The names of the known bits of `bits`, and the bits left unnamed.
fn named(bits: u32, table: &[(u32, &'static str)]) -> (Vec<&'static str>, u32) {
    let names = table.iter().filter(|(b, _)| bits & b != 0).map(|(_, n)| *n).collect();
    let known = table.iter().fold(0, |acc, (b, _)| acc | b);
    (names, bits & !known)
}

fn location_kind(kind: u32) -> String {
    match kind {
        MEMPLUG_LOCATION_ANY => "any".into(),
        MEMPLUG_LOCATION_DEVICE => "device".into(),
        MEMPLUG_LOCATION_HOST => "host".into(),
        MEMPLUG_LOCATION_NUMA_NODE => "numa_node".into(),
        MEMPLUG_LOCATION_TIER => "tier".into(),
        k => format!("unknown({k})"),
    }
}

fn descriptor_view(d: &Descriptor) -> DescriptorView {
    let (attributes, unknown_attribute_bits) = named(d.attributes, ATTRIBUTES);
    let (export_types, unknown_export_type_bits) = named(d.export_types, HANDLES);
    DescriptorView {
        recommended_granularity: d.recommended_granularity,
        page_sizes: (0..64).filter(|k| d.page_sizes & (1u64 << k) != 0).map(|k| 1u64 << k).collect(),
        attributes,
        unknown_attribute_bits,
        export_types,
        unknown_export_type_bits,
        location: LocationView { kind: location_kind(d.location.kind), id: d.location.id },
        maps_at_offsets: d.maps_at_offsets,
    }
}

fn identity_view(i: &DeviceIdentity) -> IdentityView {
    let has = |bit: u32| i.valid & bit != 0;
    let u = &i.uuid;
    let hex = |r: std::ops::Range<usize>| u[r].iter().map(|b| format!("{b:02x}")).collect::<String>();
    IdentityView {
        uuid: has(MEMPLUG_IDENTITY_UUID)
            .then(|| format!("{}-{}-{}-{}-{}", hex(0..4), hex(4..6), hex(6..8), hex(8..10), hex(10..16))),
        pci: has(MEMPLUG_IDENTITY_PCI).then(|| {
            format!("{:04x}:{:02x}:{:02x}.{:x}", i.pci_domain, i.pci_bus, i.pci_device, i.pci_function)
        }),
        sub_device: has(MEMPLUG_IDENTITY_SUB_DEVICE).then_some(i.sub_device),
        numa_node: has(MEMPLUG_IDENTITY_NUMA_NODE).then_some(i.numa_node),
    }
}

/// `4096` as `4 KiB`, `2097152` as `2 MiB`.
fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

#[derive(Serialize)]
struct MemoryView {
    free_bytes: u64,
    total_bytes: u64,
}

fn view(p: &Plugin) -> PluginView {
    let (lo, hi) = p.plugin_minor_range();
    let (major, minor) = p.abi_version();
    PluginView {
        schema_version: schema::INSPECT,
        ok: true,
        counts: Counts { mechanisms: p.mechanisms().len() },
        name: p.name().into(),
        version: p.version().into(),
        origin: p.origin().into(),
        abi: format!("{major}.{minor}"),
        plugin_abi_range: format!("{major}.{lo}..={major}.{hi}"),
        mechanisms: p.mechanisms().iter().map(|m| mechanism_view(m, minor)).collect(),
    }
}

fn mechanism_view(m: &Mechanism, minor: u32) -> MechanismView {
    let props = m.properties();
    let info = m.memory_info();
    MechanismView {
        name: m.name().into(),
        id: m.id(),
        device: m.device().to_string(),
        capabilities: m.capabilities().names(),
        unknown_capability_bits: m.capabilities().unknown_bits(),
        min_alignment: props.min_alignment,
        max_alignment: props.max_alignment,
        granularity: props.granularity,
        stream_adopt: m.sync().map(|s| s.can_adopt()),
        memory: info
            .as_ref()
            .and_then(|r| r.as_ref().ok())
            .map(|i| MemoryView { free_bytes: i.free_bytes, total_bytes: i.total_bytes }),
        descriptor: (minor >= 2).then(|| descriptor_view(&props.descriptor)),
        identity: m.identity().as_ref().map(identity_view),
        copy_kinds: (minor >= 3).then(|| props.copy_kinds.names()),
        unknown_copy_kind_bits: props.copy_kinds.unknown_bits(),
        optional_slots: optional_slots(m, info.is_some()),
    }
}

/// The optional slots a mechanism publishes, as far as the host's API
/// tells (`sync.stream_wait_fence` and `sync.stream_adopt_typed` it does
/// not expose yet, so they are not listed).
fn optional_slots(m: &Mechanism, memory_info: bool) -> Vec<&'static str> {
    let mut v = Vec::new();
    if memory_info {
        v.push("allocator.memory_info");
    }
    if let Some(s) = m.sync() {
        if s.can_adopt() {
            v.push("sync.stream_adopt");
        }
        if s.can_copy() {
            v.push("sync.copy");
        }
    }
    // The slots a capability brings: the loader refused a flag without
    // its slots and slots without their flag.
    let caps = m.capabilities().names();
    let has = |c: &str| caps.contains(&c);
    if has("shared_export") {
        v.extend(["shared_mapping.export_fd", "shared_mapping.import_fd"]);
    }
    if has("typed_export") {
        v.extend(["shared_mapping.export_handle", "shared_mapping.import_handle"]);
    }
    if has("queued_binding") {
        v.extend(["virtual_backing.commit_on", "virtual_backing.decommit_on"]);
        if has("shared_mapping") {
            v.extend(["shared_mapping.map_on", "shared_mapping.unmap_on"]);
        }
    }
    if has("peer_access") {
        v.extend(["peer_access.can_access_peer", "peer_access.set_peer_access"]);
    }
    v
}

fn print_table(out: &mut impl Write, v: &PluginView) -> std::io::Result<()> {
    writeln!(out, "plugin      {} {}", v.name, v.version)?;
    writeln!(out, "origin      {}", v.origin)?;
    writeln!(out, "abi         {} (plugin speaks {})", v.abi, v.plugin_abi_range)?;
    writeln!(out, "mechanisms  {}", v.mechanisms.len())?;
    for m in &v.mechanisms {
        writeln!(out)?;
        writeln!(out, "  mechanism     {} (id {})", m.name, m.id)?;
        writeln!(out, "  device        {}", m.device)?;
        let mut caps = m.capabilities.join(", ");
        if m.unknown_capability_bits != 0 {
            caps.push_str(&format!(", unknown bits {:#x} (ignored)", m.unknown_capability_bits));
        }
        writeln!(out, "  capabilities  {caps}")?;
        writeln!(out, "  alignment     min {} B, max {} B", m.min_alignment, m.max_alignment)?;
        writeln!(
            out,
            "  granularity   {}",
            if m.granularity == 0 { "-".to_string() } else { format!("{} B", m.granularity) }
        )?;
        if let Some(adopt) = m.stream_adopt {
            writeln!(out, "  stream adopt  {}", if adopt { "yes" } else { "no (plugin-made streams only)" })?;
        }
        match &m.memory {
            Some(mem) => writeln!(
                out,
                "  memory        {:.1} GiB free of {:.1} GiB",
                mem.free_bytes as f64 / (1u64 << 30) as f64,
                mem.total_bytes as f64 / (1u64 << 30) as f64
            )?,
            None => writeln!(out, "  memory        not reported by this mechanism")?,
        }
        match &m.descriptor {
            Some(d) => print_descriptor(out, d)?,
            None => writeln!(out, "  descriptor    - (ABI 1.2)")?,
        }
        match &m.copy_kinds {
            Some(k) if k.is_empty() && m.unknown_copy_kind_bits == 0 => {
                writeln!(out, "  copy kinds    - (no copy slot)")?
            }
            Some(k) => {
                let mut t = k.join(", ");
                if m.unknown_copy_kind_bits != 0 {
                    t.push_str(&format!(", unknown bits {:#x}", m.unknown_copy_kind_bits));
                }
                writeln!(out, "  copy kinds    {t}")?
            }
            None => writeln!(out, "  copy kinds    - (ABI 1.3)")?,
        }
        let slots = if m.optional_slots.is_empty() { "-".to_string() } else { m.optional_slots.join(", ") };
        writeln!(out, "  optional      {slots}")?;
        if let Some(i) = &m.identity {
            let mut parts = Vec::new();
            if let Some(u) = &i.uuid {
                parts.push(format!("uuid {u}"));
            }
            if let Some(p) = &i.pci {
                parts.push(format!("pci {p}"));
            }
            if let Some(s) = i.sub_device {
                parts.push(format!("sub-device {s}"));
            }
            if let Some(n) = i.numa_node {
                parts.push(format!("numa node {n}"));
            }
            let text =
                if parts.is_empty() { "published, nothing valid".to_string() } else { parts.join(", ") };
            writeln!(out, "  identity      {text}")?;
        }
    }
    Ok(())
}

fn print_descriptor(out: &mut impl Write, d: &DescriptorView) -> std::io::Result<()> {
    let list = |v: &[&str], unknown: u32| {
        let mut s = if v.is_empty() { "-".to_string() } else { v.join(", ") };
        if unknown != 0 {
            s.push_str(&format!(", unknown bits {unknown:#x}"));
        }
        s
    };
    let pages = if d.page_sizes.is_empty() {
        "-".to_string()
    } else {
        d.page_sizes.iter().map(|p| bytes(*p)).collect::<Vec<_>>().join(", ")
    };
    writeln!(out, "  page sizes    {pages}")?;
    if d.recommended_granularity != 0 {
        writeln!(out, "  recommended   granularity {}", bytes(d.recommended_granularity))?;
    }
    writeln!(out, "  attributes    {}", list(&d.attributes, d.unknown_attribute_bits))?;
    writeln!(out, "  export types  {}", list(&d.export_types, d.unknown_export_type_bits))?;
    let loc = match d.location.kind.as_str() {
        "numa_node" | "tier" => format!("{} {}", d.location.kind, d.location.id),
        "any" => "- (not said)".to_string(),
        k => k.to_string(),
    };
    writeln!(out, "  location      {loc}")?;
    writeln!(
        out,
        "  maps          {}",
        if d.maps_at_offsets { "at any granularity-aligned offset" } else { "whole objects only" }
    )?;
    Ok(())
}

/// `memplug inspect [PLUGIN] [--json]`; returns the exit status.
pub fn run(plugin: Option<&Path>, json: bool) -> u8 {
    let mut out = Stdout::default();
    let p = match locate::load(plugin) {
        Ok(p) => p,
        Err(e) => {
            let why = e.to_string();
            if json {
                // Serialising a string and a number cannot fail.
                if let Ok(s) = schema::to_json(&CouldNotRun::new(schema::INSPECT, &why, Counts::default())) {
                    out.write(&s);
                }
            }
            complain(&why);
            return COULD_NOT_RUN;
        }
    };
    let v = view(&p);
    if json {
        match schema::to_json(&v) {
            Ok(s) => out.write(&s),
            Err(e) => {
                complain(&format!("cannot write the JSON document: {e}"));
                return COULD_NOT_RUN;
            }
        }
    } else {
        let mut text = Vec::new();
        // Writing into a Vec cannot fail.
        let _ = print_table(&mut text, &v);
        out.write(&String::from_utf8_lossy(&text));
    }
    out.status(OK)
}
