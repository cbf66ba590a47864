//! `memplug inspect`.

use crate::locate;
use memplug_host::{Mechanism, Plugin};
use serde::Serialize;
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
            .allocator()
            .memory_info()
            .and_then(|r| r.ok())
            .map(|i| MemoryView { free_bytes: i.free_bytes, total_bytes: i.total_bytes }),
    }
}

fn print_table(v: &PluginView) {
    println!("plugin      {} {}", v.name, v.version);
    println!("origin      {}", v.origin);
    println!("abi         {} (plugin speaks {})", v.abi, v.plugin_abi_range);
    println!("mechanisms  {}", v.mechanisms.len());
    for m in &v.mechanisms {
        println!();
        println!("  mechanism     {} (id {})", m.name, m.id);
        println!("  device        {}", m.device);
        let mut caps = m.capabilities.join(", ");
        if m.unknown_capability_bits != 0 {
            caps.push_str(&format!(", unknown bits {:#x} (ignored)", m.unknown_capability_bits));
        }
        println!("  capabilities  {caps}");
        println!("  alignment     min {} B, max {} B", m.min_alignment, m.max_alignment);
        println!("  granularity   {}", if m.granularity == 0 { "-".to_string() } else { format!("{} B", m.granularity) });
        if let Some(adopt) = m.stream_adopt {
            println!("  stream adopt  {}", if adopt { "yes" } else { "no (plugin-made streams only)" });
        }
        match &m.memory {
            Some(mem) => println!(
                "  memory        {:.1} GiB free of {:.1} GiB",
                mem.free_bytes as f64 / (1u64 << 30) as f64,
                mem.total_bytes as f64 / (1u64 << 30) as f64
            ),
            None => println!("  memory        not reported by this mechanism"),
        }
    }
}

pub fn run(plugin: Option<&Path>, json: bool) -> Result<(), Box<dyn std::error::Error>> {
    let p = locate::load(plugin)?;
    let v = view(&p);
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_table(&v);
    }
    Ok(())
}
