//! `memplug conformance`: runs the vendor conformance kit
//! (`memplug-conformance`) on a plugin library and prints its report, as a
//! table or as JSON. Exits non-zero when any check fails.

use crate::locate;
use memplug_conformance::{Options, Outcome, Report};
use std::error::Error;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Widest detail column of the table before it is cut (JSON has it whole).
const DETAIL_WIDTH: usize = 120;

pub fn run(plugin: Option<&Path>, mechanism: Option<&str>, json: bool) -> Result<(), Box<dyn Error>> {
    let path: PathBuf = match plugin {
        Some(p) => p.to_path_buf(),
        None => locate::cpu_plugin_path().ok_or_else(|| {
            format!(
                "the reference CPU plugin library ({}) was not found next to this executable; pass a \
                 plugin path or set {}",
                locate::CPU_PLUGIN_FILE,
                locate::CPU_PLUGIN_ENV
            )
        })?,
    };
    let opts = Options { mechanism: mechanism.map(str::to_string), ..Options::default() };
    let report = memplug_conformance::run(&path, &opts)?;
    let text = if json { serde_json::to_string_pretty(&report)? + "\n" } else { render(&report) };
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        // A reader that stopped early (`| head`) is not a failure.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
        _ => {}
    }
    let failed: Vec<&str> = report.failures().map(|c| c.name).collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("{} conformance check(s) failed: {}", failed.len(), failed.join(", ")).into())
    }
}

fn cut(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let mut t: String = s.chars().take(width - 1).collect();
    t.push('…');
    t
}

fn render(r: &Report) -> String {
    let mut s = String::new();
    let name = match (&r.plugin_name, &r.plugin_version) {
        (Some(n), Some(v)) => format!("{n} {v}"),
        _ => "(plugin not identified)".into(),
    };
    s += &format!("memplug conformance: {name}\n");
    s += &format!("library   {}\n", r.plugin_path.display());
    if let Some(abi) = &r.abi {
        s += &format!("abi       {abi} (plugin speaks {})\n", r.plugin_abi_range.as_deref().unwrap_or("?"));
    }
    for m in &r.mechanisms {
        s += &format!("mechanism {} (id {}, {}): {}\n", m.name, m.id, m.device, m.capabilities.join(", "));
    }
    s += "\n";
    let w_name = r.checks.iter().map(|c| c.name.len()).max().unwrap_or(5).max(5);
    let w_mech =
        r.checks.iter().map(|c| c.mechanism.as_deref().unwrap_or("-").len()).max().unwrap_or(9).max(9);
    s += &format!("{:<w_name$}  {:<w_mech$}  RESULT  DETAIL\n", "CHECK", "MECHANISM");
    for c in &r.checks {
        let result = match c.outcome {
            Outcome::Pass => "pass",
            Outcome::Fail => "FAIL",
            Outcome::Skip => "skip",
        };
        s += &format!(
            "{:<w_name$}  {:<w_mech$}  {result:<6}  {}\n",
            c.name,
            c.mechanism.as_deref().unwrap_or("-"),
            cut(&c.detail, DETAIL_WIDTH)
        );
    }
    s += &format!(
        "\n{} passed, {} failed, {} skipped\n",
        r.count(Outcome::Pass),
        r.count(Outcome::Fail),
        r.count(Outcome::Skip)
    );
    s
}
