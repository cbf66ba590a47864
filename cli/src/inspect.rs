//! `memplug inspect`.

use crate::locate;
use memplug_host::{Mechanism, Plugin};
use serde::Serialize;
use std::io::Write;
use std::path::Path;

#[derive(Serialize)]
struct PluginView {
    name: String,
    version: String,
    origin: String,
    abi: String,
    plugin_abi_range: String,
    mechanisms: Vec<MechanismView>,
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
        name: p.name().into(),
        version: p.version().into(),
        origin: p.origin().into(),
        abi: format!("{major}.{minor}"),
        plugin_abi_range: format!("{major}.{lo}..={major}.{hi}"),
        mechanisms: p.mechanisms().iter().map(mechanism_view).collect(),
    }
}

fn mechanism_view(m: &Mechanism) -> MechanismView {
    let props = m.properties();
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
        memory: m
            .memory_info()
            .and_then(|r| r.ok())
            .map(|i| MemoryView { free_bytes: i.free_bytes, total_bytes: i.total_bytes }),
    }
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
    }
    Ok(())
}

pub fn run(plugin: Option<&Path>, json: bool) -> Result<(), Box<dyn std::error::Error>> {
    let p = locate::load(plugin)?;
    let v = view(&p);
    let mut out = std::io::stdout().lock();
    let written =
        if json { writeln!(out, "{}", serde_json::to_string_pretty(&v)?) } else { print_table(&mut out, &v) };
    match written {
        // A reader that stops early (`| head`) is not an error.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}
