//! `memplug`: the front door. `demo [--json]` runs a scripted LLM-serving
//! scenario on the reference CPU plugin under a hard budget and checks it
//! against the kernel; `inspect [PLUGIN] [--json]` shows what a plugin
//! publishes (without PLUGIN, the reference CPU plugin);
//! `conformance [PLUGIN] [--mechanism NAME] [--json]` runs the vendor
//! conformance kit on it.

mod conformance;
mod demo;
mod inspect;
mod locate;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "memplug", version, about = "memplug: a C-ABI plugin SDK for device-memory mechanisms")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a scripted LLM-serving scenario on the reference CPU plugin under
    /// a hard 64 MiB budget: weights evicted under pressure, a shared
    /// prefix, KV regions growing at stable addresses, an OutOfBudget that
    /// rolls back, a free ordered behind a fence; print the timeline and a
    /// ledger that ends at zero, checked against /proc/self/{pagemap,smaps}.
    /// Exits non-zero if any check fails.
    Demo {
        /// Print one JSON document (scenario, timeline, measurements,
        /// ledger, checks) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run the vendor conformance kit on a plugin: negotiation, descriptor,
    /// identity, alignment, ranges, residency, sharing, fences, threads,
    /// messages, exports. Exits non-zero if any check fails.
    Conformance {
        /// Path of the plugin library; the reference CPU plugin if omitted.
        plugin: Option<PathBuf>,
        /// Check only this mechanism (plugin-wide checks still run).
        #[arg(long)]
        mechanism: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show a plugin's ABI version, mechanisms, devices, capabilities,
    /// granularity and alignment.
    Inspect {
        /// Path of the plugin library; the reference CPU plugin if omitted.
        plugin: Option<PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo { json } => demo::run(json),
        Command::Conformance { plugin, mechanism, json } => {
            conformance::run(plugin.as_deref(), mechanism.as_deref(), json)
        }
        Command::Inspect { plugin, json } => inspect::run(plugin.as_deref(), json),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("memplug: {e}");
            ExitCode::FAILURE
        }
    }
}
