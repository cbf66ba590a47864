//! `memplug`: the front door. `demo [--json]` runs a scripted LLM-serving
//! scenario on the reference CPU plugin under a hard budget and checks it
//! against the kernel; `inspect [PLUGIN] [--json]` shows what a plugin
//! publishes (without PLUGIN, the reference CPU plugin);
//! `conformance [PLUGIN] [--mechanism NAME] [--json] [--junit FILE]
//! [--timeout SECONDS]` runs the vendor conformance kit on it, each check in
//! its own process (exit statuses: `conformance::EXIT_CODES`).

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
    /// messages, exports. Each check runs in its own process; exits 0 when
    /// every check passed, 1 when one failed, crashed or timed out, 2 on
    /// bad usage, 3 when the kit could not run on the plugin.
    #[command(after_help = conformance::EXIT_CODES)]
    Conformance {
        /// Path of the plugin library; the reference CPU plugin if omitted.
        plugin: Option<PathBuf>,
        /// Check only this mechanism (plugin-wide checks still run).
        #[arg(long)]
        mechanism: Option<String>,
        /// Print one JSON document (schema: docs/conformance-json.md)
        /// instead of a table.
        #[arg(long)]
        json: bool,
        /// Also write a JUnit XML report (one testcase per check) to FILE.
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
        /// Kill a check's process, and report the check as timed out, after
        /// SECONDS without a sign of life.
        #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = conformance::parse_timeout)]
        timeout: std::time::Duration,
    },
    /// Show a plugin's ABI version, mechanisms, devices, capabilities,
    /// granularity and alignment, and (ABI 1.2) each mechanism's memory
    /// descriptor and device identity.
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
        Command::Conformance { plugin, mechanism, json, junit, timeout } => {
            return conformance::run(conformance::Args { plugin, mechanism, json, junit, timeout });
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
