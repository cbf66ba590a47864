//! `memplug`: the front door. `inspect [PLUGIN] [--json]` shows what a
//! plugin publishes; without PLUGIN it inspects the reference CPU plugin.

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
