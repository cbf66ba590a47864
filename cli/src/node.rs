//! `memplug node serve` and `memplug node status`: the node authority as a
//! process of its own, and a look at its books (see the `memplug-node`
//! crate for the protocol and the rules).

use crate::exit;
use clap::Subcommand;
use memplug_node::wire::{self, Frame, Msg};
use memplug_node::{Authority, AuthorityConfig};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Subcommand)]
pub enum NodeCommand {
    /// Run a node authority: lease each device's capacity to the processes
    /// that join on SOCKET (MEMPLUG_NODE_SOCKET), pressing others when a
    /// lease does not fit; runs until killed.
    Serve {
        /// The socket's path.
        #[arg(long)]
        socket: PathBuf,
        /// A device and its capacity: NAME=BYTES with an optional K/M/G/T
        /// suffix (e.g. cpu0=8G, cuda0=70G); repeat for each device.
        #[arg(long = "device", value_name = "NAME=BYTES", required = true, value_parser = parse_device)]
        devices: Vec<(String, u64)>,
        /// Budget moves in multiples of this (default 2M).
        #[arg(long, default_value = "2M", value_parser = parse_bytes)]
        chunk: u64,
        /// The socket file's mode, octal: who may join (default 600).
        #[arg(long, default_value = "600", value_parser = parse_mode)]
        mode: u32,
        /// How long a process has to answer a ticket before it is skipped.
        #[arg(long, default_value = "2000")]
        ticket_timeout_ms: u64,
        /// UID=BYTES: the most a user may lease over all devices; repeat.
        #[arg(long = "quota", value_name = "UID=BYTES", value_parser = parse_quota)]
        quotas: Vec<(u32, u64)>,
        /// GID=BYTES: the most the processes of a group (their primary
        /// group) may lease together over all devices; repeat.
        #[arg(long = "group-quota", value_name = "GID=BYTES", value_parser = parse_group_quota)]
        group_quotas: Vec<(u32, u64)>,
    },
    /// Two processes on one budget: an inference server (this process,
    /// which also serves the node) with experts and KV, and a trainer (a
    /// process of its own) whose allocations make the server offload
    /// experts through cross-process tickets; the experts come back at the
    /// same addresses when the trainer lets go, and every ledger balances.
    /// Exits 1 if a check fails.
    Demo {
        /// One JSON document (events, samples, ledgers, checks) instead of
        /// text.
        #[arg(long)]
        json: bool,
        /// Also draw the budget of both processes over time as an SVG
        /// chart in FILE.
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<PathBuf>,
    },
    /// The demo's trainer (started by `memplug node demo`).
    #[command(hide = true)]
    DemoTrainer {
        #[arg(long)]
        socket: PathBuf,
    },
    /// Print the books of the authority on SOCKET: per device capacity and
    /// leased bytes, per process its leases and tickets.
    Status {
        #[arg(long)]
        socket: PathBuf,
        /// Prometheus text instead of JSON.
        #[arg(long)]
        prometheus: bool,
    },
}

pub fn run(c: NodeCommand) -> u8 {
    match c {
        NodeCommand::Serve { socket, devices, chunk, mode, ticket_timeout_ms, quotas, group_quotas } => {
            let mut config = AuthorityConfig::new(socket, devices);
            config.chunk = chunk;
            config.mode = mode;
            config.ticket_timeout = Duration::from_millis(ticket_timeout_ms);
            config.quotas = quotas;
            config.group_quotas = group_quotas;
            match Authority::start(config) {
                Ok(a) => {
                    println!("memplug node: serving {}", a.socket().display());
                    loop {
                        std::thread::park();
                    }
                }
                Err(e) => {
                    eprintln!("memplug node serve: {e}");
                    exit::COULD_NOT_RUN
                }
            }
        }
        NodeCommand::Demo { json, plot } => crate::node_demo::run(crate::node_demo::Args { json, plot }),
        NodeCommand::DemoTrainer { socket } => crate::node_demo::trainer(&socket),
        NodeCommand::Status { socket, prometheus } => match status(&socket, prometheus) {
            Ok(text) => {
                println!("{text}");
                exit::OK
            }
            Err(e) => {
                eprintln!("memplug node status: {}: {e}", socket.display());
                exit::COULD_NOT_RUN
            }
        },
    }
}

fn status(socket: &PathBuf, prometheus: bool) -> std::io::Result<String> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    wire::write_msg(&mut s, &Msg::Status { prometheus })?;
    match wire::read_frame(&mut s)? {
        Frame::Msg(Msg::StatusReply { text }) => Ok(text),
        other => Err(std::io::Error::other(format!("unexpected reply: {other:?}"))),
    }
}

fn parse_bytes(v: &str) -> Result<u64, String> {
    let t = v.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (digits, shift) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 30),
        Some('T' | 't') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = digits.parse().map_err(|_| format!("{v:?} is not a byte count (e.g. 64M, 8G)"))?;
    n.checked_mul(1 << shift).ok_or_else(|| format!("{v:?} is too large"))
}

fn parse_device(v: &str) -> Result<(String, u64), String> {
    let (name, bytes) = v.split_once('=').ok_or_else(|| format!("{v:?}: expected NAME=BYTES"))?;
    if name.is_empty() {
        return Err(format!("{v:?}: no device name"));
    }
    Ok((name.to_string(), parse_bytes(bytes)?))
}

fn parse_quota(v: &str) -> Result<(u32, u64), String> {
    let (uid, bytes) = v.split_once('=').ok_or_else(|| format!("{v:?}: expected UID=BYTES"))?;
    Ok((uid.parse().map_err(|_| format!("{uid:?} is not a user id"))?, parse_bytes(bytes)?))
}

fn parse_group_quota(v: &str) -> Result<(u32, u64), String> {
    let (gid, bytes) = v.split_once('=').ok_or_else(|| format!("{v:?}: expected GID=BYTES"))?;
    Ok((gid.parse().map_err(|_| format!("{gid:?} is not a group id"))?, parse_bytes(bytes)?))
}

fn parse_mode(v: &str) -> Result<u32, String> {
    u32::from_str_radix(v, 8).map_err(|_| format!("{v:?} is not an octal mode"))
}
