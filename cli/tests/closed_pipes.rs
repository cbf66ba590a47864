//! Every `memplug` command with its reader gone or its descriptors closed:
//! no panic (exit 101), and the exit status it has with both open
//! (docs/cli.md: a closed pipe does not change it), on success and on the
//! error paths, where the message to stderr is what fails.

mod common;

use common::pipes::{both_gone, closed, head_c1, stderr_gone, stdout_gone};
use std::process::{Command, Stdio};

/// The exit code with stdout and stderr open.
fn status_open(args: &[&str]) -> Option<i32> {
    Command::new(env!("CARGO_BIN_EXE_memplug"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run memplug")
        .status
        .code()
}

/// `args` exits with `want` however its output goes away.
fn assert_unchanged(args: &[&str], want: i32) {
    assert_eq!(status_open(args), Some(want), "{args:?} with both streams open");
    let r = stdout_gone(args);
    assert_eq!(r.code, Some(want), "{args:?} with stdout's reader gone: {}", r.other);
    assert!(!r.other.contains("panicked"), "{args:?}: {}", r.other);
    assert!(!r.other.contains("Broken pipe"), "a gone reader is not an error to report: {}", r.other);
    let r = stderr_gone(args);
    assert_eq!(r.code, Some(want), "{args:?} with stderr's reader gone");
    assert_eq!(both_gone(args), Some(want), "{args:?} with both readers gone");
    for redirections in [">&-", "2>&-", ">&- 2>&-"] {
        assert_eq!(closed(args, redirections), Some(want), "{args:?} {redirections}");
    }
}

#[test]
fn inspect_with_its_reader_gone_exits_as_usual() {
    assert_unchanged(&["inspect"], 0);
    assert_unchanged(&["inspect", "--json"], 0);
    // What the issue saw panic: `memplug inspect --json | head -c1`.
    assert_eq!(head_c1(&["inspect", "--json"]), Some(0));
}

#[test]
fn errors_with_stderr_gone_do_not_panic() {
    // A plugin that cannot be loaded: the message goes to stderr.
    assert_unchanged(&["inspect", "/nonexistent/libx.so"], 3);
    assert_unchanged(&["inspect", "/nonexistent/libx.so", "--json"], 3);
    // clap's usage errors, and the demo's own (an output file that cannot
    // be created).
    assert_unchanged(&["bogus"], 2);
    assert_unchanged(&["demo", "--plot", "/nonexistent/dir/chart.svg"], 2);
    assert_unchanged(&["conformance", "--timeout", "0"], 2);
    // The kit cannot run on a missing file.
    assert_unchanged(&["conformance", "/nonexistent/libx.so", "--json"], 3);
    // Help goes to stdout.
    assert_unchanged(&["--help"], 0);
}

#[test]
fn the_demo_with_its_reader_gone_exits_as_usual() {
    assert_unchanged(&["demo"], 0);
    assert_unchanged(&["demo", "--json"], 0);
    assert_eq!(head_c1(&["demo", "--json"]), Some(0));
}

/// With stdout closed outright, a file the command opens must not take
/// descriptor 1 and receive the output: the chart holds only SVG. (Rust's
/// runtime reopens a closed 0, 1 or 2 on /dev/null before `main`; this
/// holds the CLI to that.)
#[test]
fn a_closed_stdout_does_not_send_the_output_into_the_chart() {
    let dir = memplug_test_support::test_tmp_dir("closed_stdout_chart");
    let svg = dir.join("demo.svg");
    let status = closed(&["demo", "--plot", svg.to_str().unwrap()], ">&-");
    assert_eq!(status, Some(0));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"), "{}", &text[..text.len().min(200)]);
    assert!(!text.contains("memplug demo: LLM serving"), "the text report landed in the chart");
}

/// Output lost for another reason than a reader that went away (a full
/// disk) is a failure: said on stderr, exit 1 where it would have been 0.
#[test]
fn a_full_disk_is_a_failure_said_on_stderr() {
    for (args, redirect, what) in [
        (&["inspect"][..], ">/dev/full", "to standard output"),
        (&["inspect", "--json"], ">/dev/full", "to standard output"),
        (&["demo", "--plot", "/dev/full"], ">/dev/null", "the chart /dev/full"),
        (&["demo", "--trace", "/dev/full"], ">/dev/null", "the trace /dev/full"),
    ] {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("exec \"$0\" \"$@\" {redirect}"))
            .arg(env!("CARGO_BIN_EXE_memplug"))
            .args(args)
            .output()
            .expect("run sh");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!("cannot write {what}")) && stderr.contains("No space left"),
            "{stderr}"
        );
    }
}
