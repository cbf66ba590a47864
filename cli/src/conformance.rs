//! `memplug conformance`: runs the vendor conformance kit
//! (`memplug-conformance`) on a plugin library, each check in its own
//! process, and prints its report: a table streamed as checks end, or one
//! JSON document (`docs/conformance-json.md`); `--junit FILE` also writes
//! a JUnit XML report. The exit status says how it went ([`EXIT_CODES`],
//! [`crate::exit`]).

use crate::exit::{COULD_NOT_RUN, FAILED, OK, USAGE};
use crate::locate;
use crate::output::{complain, Stdout};
use crate::schema;
use memplug_conformance::{printable, printable_text, CheckResult, Counts, Options, Outcome, Report, CHECKS};
use memplug_host::Plugin;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What `memplug conformance --help` says about exit statuses.
pub const EXIT_CODES: &str = "\
Each check runs in its own process: a check whose process crashes is reported as crashed (with its signal \
and the end of its output), one that gives no sign of life for --timeout seconds is killed and reported as \
timed out, and the run goes on. Text output streams one line per check as it ends.

Exit status:
  0  every check passed (skips allowed)
  1  a check failed, crashed or timed out, including a run stopped at a check it names (a file that is \
not a loadable library fails load.open, one without memplug_plugin_v1 load.entry_symbol, one that does not \
negotiate or answers malformed negotiation.accepts_host, an unreadable descriptor descriptor.plugin)
  2  usage error: a bad option or value, --mechanism naming no published mechanism, a --junit file that \
cannot be created
  3  the kit could not run and no check names why: the file is missing or is not a regular file, or a \
check's process could not be started
A closed stdout or stderr does not change the exit status.";

/// The arguments of `memplug conformance`.
pub struct Args {
    pub plugin: Option<PathBuf>,
    pub mechanism: Option<String>,
    pub json: bool,
    pub junit: Option<PathBuf>,
    pub timeout: Duration,
    /// `--storm-stalls`: [`Options::storm_stalls`].
    pub storm_stalls: Option<usize>,
}

/// Parses `--timeout SECONDS`: a positive number of seconds (fractions
/// allowed), at most a day.
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.trim().parse().map_err(|_| format!("'{s}' is not a number of seconds"))?;
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(format!("{s} is not between 0 (excluded) and 86400 seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

pub fn run(args: Args) -> u8 {
    let mut out = Stdout::default();
    let opts = Options {
        mechanism: args.mechanism.clone(),
        timeout: args.timeout,
        storm_stalls: args.storm_stalls,
        ..Options::default()
    };
    // Create the JUnit file first: a path that cannot be written is a
    // usage error, found before the run rather than after it.
    let junit = match &args.junit {
        Some(p) => match File::create(p) {
            Ok(f) => Some((p.clone(), f)),
            Err(e) => {
                complain(&format!("cannot create the JUnit report {}: {e}", p.display()));
                return USAGE;
            }
        },
        None => None,
    };
    // Without a path: the CPU plugin's library when found, else the copy
    // linked into this executable, as `inspect` does (a `cargo install`
    // has no library beside the command).
    let path: Option<PathBuf> = args.plugin.clone().or_else(locate::cpu_plugin_path);
    // Named as `inspect` names it (the host's in-process origin).
    let linked = Plugin::in_process_origin(locate::CPU_PLUGIN_LABEL);
    let shown = path.clone().unwrap_or_else(|| PathBuf::from(&linked));
    let widths = Widths::new();
    // With --mechanism, the table is held back until the kit has read the
    // plugin's mechanisms (the first result of a mechanism, or the end): a
    // name the plugin does not publish is a usage error, and a usage error
    // prints nothing on stdout.
    let mut held = if args.json { None } else { Some(render_start(&shown, &opts, &widths)) };
    let hold = opts.mechanism.is_some();
    let json = args.json;
    let mut on_result = |c: &CheckResult| {
        if json {
            return;
        }
        let line = render_line(c, &widths);
        match &mut held {
            Some(h) if hold && c.mechanism.is_none() => h.push_str(&line),
            _ => {
                if let Some(h) = held.take() {
                    out.write(&h);
                }
                out.write(&line);
            }
        }
    };
    let result = match &path {
        Some(p) => memplug_conformance::run_streaming(p, &opts, &mut on_result),
        // SAFETY: the reference plugin's entry, built from this workspace
        // against the same ABI.
        None => unsafe {
            memplug_conformance::run_linked_streaming(
                memplug_plugin_cpu::cpu_plugin_entry,
                Path::new(&linked),
                &opts,
                &mut on_result,
            )
        },
    };
    let report = match result {
        Ok(r) => r,
        Err(e @ memplug_conformance::Error::NoSuchMechanism { .. }) => {
            complain(&e.to_string());
            return USAGE;
        }
        Err(e) => Report::could_not_run(&shown, &opts, e.to_string()),
    };
    if let Some(h) = held.take() {
        out.write(&h);
    }
    finish(&report, &args, junit, &mut out)
}

/// Prints the rest of the report, writes the JUnit file, says what failed,
/// and gives the exit status.
fn finish(report: &Report, args: &Args, junit: Option<(PathBuf, File)>, out: &mut Stdout) -> u8 {
    if args.json {
        match schema::to_json(report) {
            Ok(s) => out.write(&s),
            Err(e) => complain(&format!("cannot write the JSON report: {e}")),
        }
    } else {
        out.write(&render_end(report));
    }
    if let Some((p, mut f)) = junit {
        if let Err(e) = f.write_all(junit_xml(report).as_bytes()).and_then(|()| f.flush()) {
            complain(&format!("cannot write the JUnit report {}: {e}", p.display()));
        }
    }
    let failed: Vec<&str> = report.failures().map(|c| c.name).collect();
    if !failed.is_empty() {
        let mut names = failed.clone();
        names.dedup();
        complain(&format!("{} conformance check(s) failed: {}", failed.len(), names.join(", ")));
    }
    if let Some(why) = &report.could_not_run {
        complain(&format!("the conformance kit could not run on {}: {why}", report.plugin_path.display()));
        // A run that stopped at a check it names is that check failing
        // (exit 1); 3 is kept for a kit that could not name one.
        if failed.is_empty() {
            return COULD_NOT_RUN;
        }
        return out.status(FAILED);
    }
    out.status(if report.ok { OK } else { FAILED })
}

// ---------------------------------------------------------------------------
// Text
// ---------------------------------------------------------------------------

/// Column widths of the table, fixed before the first line is known.
struct Widths {
    name: usize,
    mechanism: usize,
}

impl Widths {
    fn new() -> Self {
        Widths { name: CHECKS.iter().map(|c| c.name.len()).max().unwrap_or(5).max(5), mechanism: 10 }
    }
}

fn render_start(path: &Path, opts: &Options, w: &Widths) -> String {
    let mut s = format!("memplug conformance kit {}\n", env!("CARGO_PKG_VERSION"));
    s += &format!("library   {}\n", printable(&path.display().to_string()));
    s += &format!(
        "isolation each check in its own process, killed after {} s without a sign of life\n\n",
        opts.timeout.as_secs_f64()
    );
    s += &format!(
        "{:<nw$}  {:<mw$}  {:<7}  {:>7}  DETAIL\n",
        "CHECK",
        "MECHANISM",
        "RESULT",
        "TIME",
        nw = w.name,
        mw = w.mechanism
    );
    s
}

fn duration(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        "<1 ms".into()
    } else if d < Duration::from_secs(10) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

fn render_line(c: &CheckResult, w: &Widths) -> String {
    let result = match c.outcome {
        Outcome::Pass => "pass",
        Outcome::Fail => "FAIL",
        Outcome::Skip => "skip",
        Outcome::Crash => "CRASH",
        Outcome::Timeout => "TIMEOUT",
    };
    let detail = printable_text(&c.detail);
    let mut lines = detail.lines();
    let mut s = format!(
        "{:<nw$}  {:<mw$}  {result:<7}  {:>7}  {}\n",
        c.name,
        printable(c.mechanism.as_deref().unwrap_or("-")),
        duration(c.duration),
        lines.next().unwrap_or(""),
        nw = w.name,
        mw = w.mechanism
    );
    for l in lines {
        s += &format!("{:indent$}| {l}\n", "", indent = w.name + 2);
    }
    s
}

fn render_end(r: &Report) -> String {
    let mut s = String::from("\n");
    let name = match (&r.plugin_name, &r.plugin_version) {
        (Some(n), Some(v)) => format!("{} {}", printable(n), printable(v)),
        _ => "(plugin not identified)".into(),
    };
    s += &format!("memplug conformance: {name}\n");
    s += &format!("library   {}\n", printable(&r.plugin_path.display().to_string()));
    if let Some(abi) = &r.abi {
        s += &format!("abi       {abi} (plugin speaks {})\n", r.plugin_abi_range.as_deref().unwrap_or("?"));
    }
    for m in &r.mechanisms {
        s += &format!(
            "mechanism {} (id {}, {}): {}\n",
            printable(&m.name),
            m.id,
            printable(&m.device),
            m.capabilities.join(", ")
        );
    }
    if let Some(why) = &r.could_not_run {
        s += &format!("could not run: {}\n", printable(why));
    }
    s += "\n";
    let tally = |c: &Counts| {
        format!(
            "{} passed, {} failed, {} skipped, {} crashed, {} timed out",
            c.pass, c.fail, c.skip, c.crash, c.timeout
        )
    };
    // Per mechanism only when there is one to tell apart from the total.
    if r.counts_by_mechanism.iter().any(|m| m.mechanism.is_some()) {
        for m in &r.counts_by_mechanism {
            let who = m
                .mechanism
                .as_deref()
                .map_or("plugin-wide".into(), |n| format!("mechanism {}", printable(n)));
            s += &format!("{who}: {}\n", tally(&m.counts));
        }
    }
    s += &format!("{} ({} checks)\n", tally(&r.counts), r.counts.total);
    s
}

// ---------------------------------------------------------------------------
// JUnit XML
// ---------------------------------------------------------------------------

/// `s` as XML character data (`attr`: as an attribute value). Control
/// characters XML cannot carry are written as visible escapes.
fn xml(s: &str, attr: bool) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            '\n' if attr => o.push_str("&#10;"),
            '\t' if attr => o.push_str("&#9;"),
            '\n' | '\t' => o.push(ch),
            '\u{fffe}' | '\u{ffff}' => o.push_str(&format!("\\u{{{:x}}}", ch as u32)),
            c if c.is_control() => o.push_str(&printable(&c.to_string())),
            c => o.push(c),
        }
    }
    o
}

fn secs(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64())
}

/// The report as JUnit XML: one testsuite, one testcase per check (named
/// `check [mechanism]`, class `memplug.conformance.<group>`), a `failure`
/// for a failed check, an `error` for a crash or timeout, `skipped` for a
/// skip; when the kit could not run, one more testcase `could_not_run`
/// with an `error` saying why.
pub fn junit_xml(r: &Report) -> String {
    let c = &r.counts;
    let extra = usize::from(r.could_not_run.is_some());
    let tests = r.checks.len() + extra;
    let (failures, errors, skipped) = (c.fail, c.crash + c.timeout + extra, c.skip);
    let time: Duration = r.checks.iter().map(|c| c.duration).sum();
    let suite = match (&r.plugin_name, &r.plugin_version) {
        (Some(n), Some(v)) => format!("memplug conformance: {n} {v}"),
        _ => format!("memplug conformance: {}", r.plugin_path.display()),
    };
    let counts = format!(
        "tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\" time=\"{}\"",
        secs(time)
    );
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    s += &format!("<testsuites name=\"memplug conformance\" {counts}>\n");
    s += &format!("  <testsuite name=\"{}\" {counts}>\n", xml(&suite, true));
    s += "    <properties>\n";
    let mut props = vec![
        ("schema_version", schema::CONFORMANCE.to_string()),
        ("kit_version", r.kit_version.to_string()),
        ("plugin_path", r.plugin_path.display().to_string()),
        ("timeout_s", r.timeout.as_secs_f64().to_string()),
    ];
    for (k, v) in
        [("abi", &r.abi), ("plugin_abi_range", &r.plugin_abi_range), ("could_not_run", &r.could_not_run)]
    {
        if let Some(v) = v {
            props.push((k, v.clone()));
        }
    }
    for (k, v) in props {
        s += &format!("      <property name=\"{k}\" value=\"{}\"/>\n", xml(&v, true));
    }
    s += "    </properties>\n";
    for check in &r.checks {
        let name = match &check.mechanism {
            Some(m) => format!("{} [{m}]", check.name),
            None => check.name.to_string(),
        };
        let group = check.name.split('.').next().unwrap_or("kit");
        s += &format!(
            "    <testcase name=\"{}\" classname=\"memplug.conformance.{}\" time=\"{}\"",
            xml(&name, true),
            xml(group, true),
            secs(check.duration)
        );
        let first = check.detail.lines().next().unwrap_or("");
        let (tag, kind) = match check.outcome {
            Outcome::Pass => {
                s += "/>\n";
                continue;
            }
            Outcome::Skip => {
                s += &format!(">\n      <skipped message=\"{}\"/>\n    </testcase>\n", xml(first, true));
                continue;
            }
            Outcome::Fail => ("failure", "fail"),
            Outcome::Crash => ("error", "crash"),
            Outcome::Timeout => ("error", "timeout"),
        };
        s += &format!(
            ">\n      <{tag} message=\"{}\" type=\"{kind}\">{}</{tag}>\n    </testcase>\n",
            xml(first, true),
            xml(&check.detail, false)
        );
    }
    if let Some(why) = &r.could_not_run {
        s += &format!(
            "    <testcase name=\"could_not_run\" classname=\"memplug.conformance.kit\" time=\"0.000\">\n      \
             <error message=\"{}\" type=\"could_not_run\">{}</error>\n    </testcase>\n",
            xml(why, true),
            xml(why, false)
        );
    }
    s += "  </testsuite>\n</testsuites>\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escapes_markup_and_controls() {
        assert_eq!(xml("a<b>&\"c'", true), "a&lt;b&gt;&amp;&quot;c&apos;");
        assert_eq!(xml("x\ny\x1b[0m", true), "x&#10;y\\x1b[0m");
        assert_eq!(xml("x\ny\u{7}", false), "x\ny\\x07");
    }

    #[test]
    fn timeouts_parse() {
        assert_eq!(parse_timeout("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_timeout("1.5").unwrap(), Duration::from_millis(1500));
        for bad in ["0", "-1", "abc", "", "nan", "inf", "1e9"] {
            assert!(parse_timeout(bad).is_err(), "{bad}");
        }
    }
}
