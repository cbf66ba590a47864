//! The device check, rehearsed without a GPU and without a release build:
//! `pack-device-check.sh` packs the debug binaries cargo just built (from
//! artifact messages written the way cargo writes them), stripped, and
//! `device-check.sh --fake` runs the packed folder against the fake driver
//! with `DEVICE_CHECK_QUICK=1` (a few tests of each step, a few seconds).
//! Checked: the folder's contents and size, the screen (one line per step,
//! the summary last and short, the libcuda path and cuDriverGetVersion in
//! it, everything labelled FAKE), the full log, and the figures file (valid
//! JSON, every figure labelled FAKE, the shared-prefix figure right).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The newest test binary `name-<16 hex>` beside this one.
fn sibling(name: &str) -> Option<PathBuf> {
    let dir = std::env::current_exe().ok()?.parent()?.to_path_buf();
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for e in std::fs::read_dir(dir).ok()? {
        let e = e.ok()?;
        let file = e.file_name().to_string_lossy().into_owned();
        let Some(hash) = file.strip_prefix(&format!("{name}-")) else { continue };
        if hash.len() != 16 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let t = e.metadata().ok()?.modified().ok()?;
        if best.as_ref().is_none_or(|(bt, _)| t > *bt) {
            best = Some((t, e.path()));
        }
    }
    best.map(|(_, p)| p)
}

/// An artifact message as cargo prints it (the fields the pack script
/// reads, in cargo's order, among others it ignores).
fn artifact(name: &str, kinds: &[&str], files: &[&Path], exe: Option<&Path>) -> String {
    let kinds = kinds.iter().map(|k| format!("\"{k}\"")).collect::<Vec<_>>().join(",");
    let files = files.iter().map(|f| format!("\"{}\"", f.display())).collect::<Vec<_>>().join(",");
    let exe = exe.map_or("null".into(), |e| format!("\"{}\"", e.display()));
    format!(
        "{{\"reason\":\"compiler-artifact\",\"package_id\":\"path+file:///memplug/plugins/cuda-vmm#memplug-plugin-cuda-vmm@0.1.0\",\
         \"manifest_path\":\"/memplug/plugins/cuda-vmm/Cargo.toml\",\"target\":{{\"kind\":[{kinds}],\"crate_types\":[{kinds}],\
         \"name\":\"{name}\",\"src_path\":\"/memplug/plugins/cuda-vmm/tests/{name}.rs\",\"edition\":\"2021\",\"doctest\":false,\
         \"test\":true}},\"profile\":{{\"opt_level\":\"3\",\"debuginfo\":1,\"test\":true}},\"features\":[],\
         \"filenames\":[{files}],\"executable\":{exe},\"fresh\":true}}"
    )
}

#[test]
fn the_device_check_packs_small_and_runs_dry_on_the_fake_driver() {
    if real() || is_child() {
        return;
    }
    let bins: Vec<(&str, PathBuf)> =
        ["vmm", "bench", "driver_loading", "sharing", "abi_1_2", "pinned", "copy", "frees", "capture", "kit"]
            .into_iter()
            .filter_map(|n| sibling(n).map(|p| (n, p)))
            .collect();
    if bins.len() < 10 {
        eprintln!(
            "skipped: the other test binaries of this crate are not built (run the crate's whole suite)"
        );
        return;
    }
    let so = plugin_path();
    let dir = memplug_test_support::test_tmp_dir("device-check");
    let mut messages: Vec<String> =
        bins.iter().map(|(n, p)| artifact(n, &["test"], &[p.as_path()], Some(p.as_path()))).collect();
    let rlib = so.with_extension("rlib");
    messages.push(artifact("memplug_plugin_cuda_vmm", &["cdylib", "rlib"], &[so.as_path(), &rlib], None));
    messages.push("{\"reason\":\"build-finished\",\"success\":true}".into());
    let json = dir.join("cargo.json");
    std::fs::write(&json, messages.join("\n") + "\n").unwrap();

    // Pack.
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let pack = dir.join("pack");
    let out = Command::new(here.join("pack-device-check.sh"))
        .arg(&pack)
        .env("PACK_CARGO_JSON", &json)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "pack-device-check.sh failed:\n{text}");
    assert!(text.contains("packed: "), "{text}");
    for (name, original) in
        bins.iter().map(|(n, p)| (*n, p.clone())).chain([("libmemplug_plugin_cuda_vmm.so", so.clone())])
    {
        let packed = std::fs::metadata(pack.join(format!("{name}.gz"))).unwrap().len();
        let before = std::fs::metadata(&original).unwrap().len();
        assert!(packed < before / 2, "{name}: {packed} bytes packed from {before}: debug info not stripped");
    }
    let fake_parts = std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("fake-driver"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("fake_cuda"));
    for f in fake_parts.chain(["device-check.sh".to_string()]) {
        assert!(pack.join(&f).is_file(), "{f} not packed");
    }
    let size: u64 = std::fs::read_to_string(pack.join("PACKED_SIZE")).unwrap().trim().parse().unwrap();
    assert!(size > 0 && size < 64 << 20, "packed {size} bytes: over what one device call carries");

    // Run it dry.
    let results = dir.join("out");
    let run = Command::new(pack.join("device-check.sh"))
        .args(["--fake", "--out"])
        .arg(&results)
        .current_dir(&dir)
        .env("DEVICE_CHECK_QUICK", "1")
        .env_remove("MEMPLUG_CUDA_DRIVER")
        .env_remove("MEMPLUG_CUDA_PLUGIN")
        .env_remove("MEMPLUG_CUDA_TEST_REAL")
        .env_remove("MEMPLUG_CUDA_BENCH_SCALE")
        .env_remove("MEMPLUG_FAKE_CUDA_DEVICES")
        .env_remove(FAIL_CREATE_ENV)
        .env_remove("OUT")
        .output()
        .unwrap();
    let screen = String::from_utf8_lossy(&run.stdout).into_owned();
    let errors = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "device-check.sh --fake failed:\n{screen}\n{errors}");
    for step in [
        "== driver",
        "== functional tests",
        "== driver discovery",
        "== abi 1.2",
        "== sharing",
        "== pinned host memory",
        "== copies",
        "== frees",
        "== graph capture",
        "== benchmarks",
        "== conformance kit",
    ] {
        assert!(screen.contains(step), "no {step:?} on the screen:\n{screen}");
    }
    assert!(
        !screen.contains("test result:"),
        "the tests' output belongs in the log, not on the screen:\n{screen}"
    );
    // The summary comes last and fits on a screen.
    let at = screen.rfind("== summary").unwrap_or_else(|| panic!("no summary:\n{screen}"));
    let summary = &screen[at..];
    assert!(summary.trim_end().ends_with("result: ALL STEPS PASSED"), "{summary}");
    assert!(summary.lines().count() <= 30, "the summary is longer than a screen:\n{summary}");
    assert!(summary.contains("FAKE") && summary.contains("figures [FAKE]"), "{summary}");
    assert!(summary.contains("cuDriverGetVersion: 12080"), "{summary}");
    assert!(
        summary.contains("\n  device 0: memplug FAKE CUDA device 0 | VMM granularity 2 MiB"),
        "{summary}"
    );
    let libcuda =
        summary.lines().find_map(|l| l.strip_prefix("libcuda: ")).unwrap_or_else(|| panic!("{summary}"));
    assert!(libcuda.ends_with("/libcuda.so.1") && Path::new(libcuda).is_absolute(), "{libcuda}");
    assert!(summary.contains("shared prefix: 32 regions x 0.008 GiB prefix: 0.008 GiB used"), "{summary}");

    // The full log.
    let log = std::fs::read_to_string(results.join("device-check.log")).unwrap();
    assert!(log.matches("test result: ok.").count() >= 6, "{log}");
    assert!(log.contains("== summary"), "the log ends with the summary too");
    assert_eq!(std::fs::read_to_string(results.join("summary.txt")).unwrap().trim(), summary.trim());

    // The figures file.
    let text = std::fs::read_to_string(results.join("figures.json")).unwrap();
    let v = json::parse(&text).unwrap_or_else(|e| panic!("figures.json is not JSON ({e}):\n{text}"));
    assert_eq!(v.get("mode").and_then(json::J::str), Some("FAKE"));
    assert_eq!(v.get("passed"), Some(&json::J::Bool(true)));
    assert_eq!(v.get("packed_bytes").and_then(json::J::num), Some(size as f64));
    let driver = v.get("driver").unwrap();
    assert_eq!(driver.get("driver_version").and_then(json::J::num), Some(12080.0));
    assert_eq!(driver.get("fake"), Some(&json::J::Bool(true)));
    assert_eq!(driver.get("libcuda").and_then(json::J::str), Some(libcuda));
    let steps = v.get("steps").and_then(json::J::arr).unwrap();
    assert_eq!(
        steps.len(),
        11,
        "driver, functional, discovery, abi 1.2, sharing, pinned, copies, frees, capture, benchmarks, kit"
    );
    assert!(steps.iter().all(|s| s.get("exit").and_then(json::J::num) == Some(0.0)), "{text}");
    let figures = v.get("figures").and_then(json::J::arr).unwrap();
    assert!(figures.iter().all(|f| f.get("driver").and_then(json::J::str) == Some("FAKE")), "{text}");
    let value = |name: &str| {
        figures
            .iter()
            .find(|f| f.get("name").and_then(json::J::str) == Some(name))
            .and_then(|f| f.get("value"))
            .and_then(json::J::num)
            .unwrap_or_else(|| panic!("no figure {name}:\n{text}"))
    };
    assert_eq!(
        value("shared_prefix_used_gib"),
        value("shared_prefix_gib"),
        "one prefix's memory for 32 regions"
    );
    assert_eq!(value("shared_prefix_regions"), 32.0);
    let export = figures
        .iter()
        .find(|f| f.get("name").and_then(json::J::str) == Some("export_import_two_processes"))
        .and_then(|f| f.get("note"))
        .and_then(json::J::str)
        .unwrap_or_else(|| panic!("no export/import figure:\n{text}"));
    assert!(export.starts_with("passed: ") && export.contains("two_processes"), "{export}");
    assert!(summary.contains("export/import across two processes: passed"), "{summary}");
}

/// Just enough JSON to check the figures file.
mod json {
    #[derive(Debug, PartialEq)]
    pub enum J {
        Null,
        Bool(bool),
        Num(f64),
        Str(String),
        Arr(Vec<J>),
        Obj(Vec<(String, J)>),
    }

    impl J {
        pub fn get(&self, key: &str) -> Option<&J> {
            match self {
                J::Obj(v) => v.iter().find(|(k, _)| k == key).map(|(_, v)| v),
                _ => None,
            }
        }
        pub fn str(&self) -> Option<&str> {
            if let J::Str(s) = self {
                Some(s)
            } else {
                None
            }
        }
        pub fn num(&self) -> Option<f64> {
            if let J::Num(n) = self {
                Some(*n)
            } else {
                None
            }
        }
        pub fn arr(&self) -> Option<&[J]> {
            if let J::Arr(a) = self {
                Some(a)
            } else {
                None
            }
        }
    }

    pub fn parse(s: &str) -> Result<J, String> {
        let mut p = P { b: s.as_bytes(), i: 0 };
        let v = p.value()?;
        p.ws();
        if p.i != p.b.len() {
            return Err(format!("trailing text at byte {}", p.i));
        }
        Ok(v)
    }

    struct P<'a> {
        b: &'a [u8],
        i: usize,
    }

    impl P<'_> {
        fn ws(&mut self) {
            while self.i < self.b.len() && self.b[self.i].is_ascii_whitespace() {
                self.i += 1;
            }
        }
        fn eat(&mut self, c: u8) -> Result<(), String> {
            self.ws();
            if self.b.get(self.i) == Some(&c) {
                self.i += 1;
                Ok(())
            } else {
                Err(format!("expected {:?} at byte {}", c as char, self.i))
            }
        }
        fn lit(&mut self, word: &str, v: J) -> Result<J, String> {
            if self.b[self.i..].starts_with(word.as_bytes()) {
                self.i += word.len();
                Ok(v)
            } else {
                Err(format!("bad literal at byte {}", self.i))
            }
        }
        fn value(&mut self) -> Result<J, String> {
            self.ws();
            match self.b.get(self.i) {
                Some(b'{') => {
                    self.i += 1;
                    let mut v = Vec::new();
                    self.ws();
                    if self.b.get(self.i) == Some(&b'}') {
                        self.i += 1;
                        return Ok(J::Obj(v));
                    }
                    loop {
                        self.ws();
                        let k = self.string()?;
                        self.eat(b':')?;
                        v.push((k, self.value()?));
                        self.ws();
                        match self.b.get(self.i) {
                            Some(b',') => self.i += 1,
                            Some(b'}') => {
                                self.i += 1;
                                return Ok(J::Obj(v));
                            }
                            _ => return Err(format!("expected , or }} at byte {}", self.i)),
                        }
                    }
                }
                Some(b'[') => {
                    self.i += 1;
                    let mut v = Vec::new();
                    self.ws();
                    if self.b.get(self.i) == Some(&b']') {
                        self.i += 1;
                        return Ok(J::Arr(v));
                    }
                    loop {
                        v.push(self.value()?);
                        self.ws();
                        match self.b.get(self.i) {
                            Some(b',') => self.i += 1,
                            Some(b']') => {
                                self.i += 1;
                                return Ok(J::Arr(v));
                            }
                            _ => return Err(format!("expected , or ] at byte {}", self.i)),
                        }
                    }
                }
                Some(b'"') => self.string().map(J::Str),
                Some(b't') => self.lit("true", J::Bool(true)),
                Some(b'f') => self.lit("false", J::Bool(false)),
                Some(b'n') => self.lit("null", J::Null),
                Some(_) => {
                    let start = self.i;
                    while self.i < self.b.len() && b"+-.eE0123456789".contains(&self.b[self.i]) {
                        self.i += 1;
                    }
                    let t = std::str::from_utf8(&self.b[start..self.i]).unwrap();
                    t.parse().map(J::Num).map_err(|_| format!("bad number {t:?} at byte {start}"))
                }
                None => Err("unexpected end".into()),
            }
        }
        fn string(&mut self) -> Result<String, String> {
            self.eat(b'"')?;
            let mut out = String::new();
            loop {
                let c = *self.b.get(self.i).ok_or("unterminated string")?;
                self.i += 1;
                match c {
                    b'"' => return Ok(out),
                    b'\\' => {
                        let e = *self.b.get(self.i).ok_or("unterminated escape")?;
                        self.i += 1;
                        match e {
                            b'"' | b'\\' | b'/' => out.push(e as char),
                            b'n' => out.push('\n'),
                            b't' => out.push('\t'),
                            b'r' => out.push('\r'),
                            b'b' => out.push('\u{8}'),
                            b'f' => out.push('\u{c}'),
                            b'u' => {
                                let h =
                                    std::str::from_utf8(self.b.get(self.i..self.i + 4).ok_or("short \\u")?)
                                        .map_err(|e| e.to_string())?;
                                let n = u32::from_str_radix(h, 16).map_err(|e| e.to_string())?;
                                out.push(char::from_u32(n).unwrap_or('\u{fffd}'));
                                self.i += 4;
                            }
                            _ => return Err(format!("bad escape at byte {}", self.i)),
                        }
                    }
                    c if c < 0x20 => return Err(format!("control character in a string at byte {}", self.i)),
                    _ => {
                        // Multi-byte UTF-8: copy the whole sequence.
                        let start = self.i - 1;
                        let len = match c {
                            0xc0..=0xdf => 2,
                            0xe0..=0xef => 3,
                            0xf0..=0xf7 => 4,
                            _ => 1,
                        };
                        self.i = start + len;
                        out.push_str(std::str::from_utf8(&self.b[start..self.i]).map_err(|e| e.to_string())?);
                    }
                }
            }
        }
    }

    #[test]
    fn the_parser_takes_json_and_refuses_the_rest() {
        let v = parse(r#"{"a": [1, -2.5e1, true, null, "x\"\u0041é"], "b": {}}"#).unwrap();
        assert_eq!(
            v.get("a").and_then(J::arr).unwrap(),
            &[J::Num(1.0), J::Num(-25.0), J::Bool(true), J::Null, J::Str("x\"Aé".into())]
        );
        for bad in ["{", "[1,]", "{\"a\" 1}", "\"\n\"", "[1] x", "{\"a\":1,}"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
