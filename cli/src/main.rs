//! `memplug`: the front door. `demo [--json] [--plot FILE.svg] [--trace
//! FILE]` runs a scripted LLM-serving scenario on the reference CPU plugin
//! under a hard budget and checks it against the kernel; `inspect [PLUGIN]
//! [--json]` shows what a plugin publishes (without PLUGIN, the reference
//! CPU plugin); `conformance [PLUGIN] [--mechanism NAME] [--json] [--junit
//! FILE] [--timeout SECONDS]` runs the vendor conformance kit on it, each
//! check in its own process. Exit statuses: [`exit`]; the `--json`
//! schemas: [`schema`] and `docs/cli.md`.

mod chart;
mod conformance;
mod demo;
mod exit;
mod inspect;
mod locate;
mod node;
mod node_demo;
mod node_demo_plot;
mod output;
mod schema;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "memplug",
    version,
    about = "memplug: a C-ABI plugin SDK for device-memory mechanisms",
    after_help = exit::HELP
)]
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
    /// Exits 1 if any check fails.
    Demo {
        /// Print one JSON document (scenario, scenes, timeline,
        /// measurements, ledger, checks, counts) instead of text.
        #[arg(long)]
        json: bool,
        /// Also draw the pool's use per allocation class over time, with
        /// pressure tickets, evictions and the kernel's resident figures,
        /// as an SVG chart in FILE.
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<PathBuf>,
        /// Also write the timeline as a Chrome/Perfetto trace (Trace Event
        /// Format JSON) to FILE: open it in ui.perfetto.dev or
        /// chrome://tracing.
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
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
        /// Stop each thread storm of the concurrency checks after N stalls
        /// (the kit's default catches an unlocked handle table in 100 runs
        /// of 100; fewer are quicker and catch less: for runs that are not
        /// about thread safety).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        storm_stalls: Option<u32>,
    },
    /// Show a plugin's ABI version, mechanisms, devices, capabilities,
    /// granularity and alignment, and (ABI 1.2) each mechanism's memory
    /// descriptor and device identity.
    Inspect {
        /// Path of the plugin library; the reference CPU plugin if omitted.
        plugin: Option<PathBuf>,
        /// Print one JSON document (schema: docs/cli.md) instead of a
        /// table.
        #[arg(long)]
        json: bool,
    },
    /// One budget for every process on a device: `serve` runs a node
    /// authority on a Unix socket, `status` prints its books.
    #[command(subcommand)]
    Node(node::NodeCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    ExitCode::from(match cli.command {
        Command::Demo { json, plot, trace } => demo::run(demo::Args { json, plot, trace }),
        Command::Conformance { plugin, mechanism, json, junit, timeout, storm_stalls } => {
            let storm_stalls = storm_stalls.map(|n| n as usize);
            conformance::run(conformance::Args { plugin, mechanism, json, junit, timeout, storm_stalls })
        }
        Command::Inspect { plugin, json } => inspect::run(plugin.as_deref(), json),
        Command::Node(c) => node::run(c),
    })
}
