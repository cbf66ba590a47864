//! The shim loaded with dlopen and called as torch calls it, on the fake
//! CUDA driver. Each `#[test]` runs one `#[ignore]`d scenario in a child
//! process (see `common`): the scenario's variables, a fresh shim.

mod common;

use common::{eventually, run_scenario, warm_up_plain, Fake, Gate, Shim, LEGACY};
use memplug_test_support::{cxx_compiler, exported_symbols, run_tool, test_tmp_dir};

const MIB: usize = 1 << 20;

#[test]
fn exports_only_its_six_functions() {
    let got = exported_symbols(&common::shim_path());
    let want = [
        "memplug_torch_alloc",
        "memplug_torch_empty_cache",
        "memplug_torch_free",
        "memplug_torch_note_stream",
        "memplug_torch_stats_json",
        "memplug_torch_try_alloc",
    ];
    assert_eq!(got, want.iter().map(|s| s.to_string()).collect());
}

#[test]
fn round_trip() {
    // No MEMPLUG_TORCH_PLUGIN: the CUDA plugin beside the shim is found.
    run_scenario("scenario_round_trip", &[]);
}

#[ignore = "a scenario: run by round_trip in a child process"]
#[test]
fn scenario_round_trip() {
    let shim = Shim::open();
    let fake = Fake::open();
    assert_eq!(shim.stats()["shim"]["started"], false, "statistics do not start the shim");
    let p = shim.alloc(MIB as isize, 0, LEGACY);
    assert_ne!(p, 0, "alloc failed");
    assert_eq!(p % 256, 0, "aligned as cudaMalloc aligns");
    // The fake's device memory is host memory: write it as a kernel would,
    // read it back through the driver.
    // SAFETY: `p` is MIB bytes the shim just handed out.
    unsafe { std::ptr::write_bytes(p as *mut u8, 0x5a, MIB) };
    assert!(fake.read(p, MIB).iter().all(|&b| b == 0x5a), "the bytes written are the device's");
    let s = shim.stats();
    assert_eq!((s["shim"]["live"].as_u64(), s["shim"]["live_bytes"].as_u64()), (Some(1), Some(MIB as u64)));
    assert!(s["shim"]["plugin"].as_str().unwrap().ends_with("libmemplug_plugin_cuda_vmm.so"));
    assert!(s["host"]["pools"][0]["used"].as_u64().unwrap() >= MIB as u64, "charged to the pool: {s}");
    shim.free(p, MIB, 0, LEGACY);
    let s = shim.stats();
    assert_eq!((s["shim"]["live"].as_u64(), s["shim"]["frees"].as_u64()), (Some(0), Some(1)));
    assert_eq!(s["shim"]["devices"][0]["streams"], 1, "the legacy stream adopted once");
    // The cache (on by default) serves the same size on the same stream
    // with the block just freed.
    let q = shim.alloc(MIB as isize, 0, LEGACY);
    assert_eq!(q, p);
    shim.free(q, MIB, 0, LEGACY);

    // Refusals are NULL, counted, and harm nothing.
    for (size, device) in [(0, 0), (-1, 0), (64, -1), (64, 64), (64, 2)] {
        assert_eq!(shim.alloc(size, device, LEGACY), 0, "alloc({size}, device {device})");
    }
    assert_eq!(shim.figure("failed_allocs"), 5);
    // Device 1 is served by a context, a pool and a binding of its own.
    let d1 = shim.alloc(4096, 1, LEGACY);
    assert_ne!(d1, 0);
    shim.free(d1, 4096, 1, LEGACY);
    assert_eq!(shim.stats()["shim"]["devices"].as_array().unwrap().len(), 2);

    // The buffer protocol: too small gets nothing and the size needed.
    let (st, need) = shim.stats_raw(&mut []);
    assert_eq!(st, 268);
    let mut small = vec![0xffu8; need - 1];
    assert_eq!(shim.stats_raw(&mut small), (268, need));
    assert!(small.iter().all(|&b| b == 0xff), "nothing written to a small buffer");
}

#[test]
fn frees_wait_for_the_stream_cached() {
    // torch's own policy: at once on the freeing stream.
    run_scenario(
        "scenario_stream_order_cached",
        &[("MEMPLUG_TORCH_CACHE", "1"), ("MEMPLUG_TORCH_REUSE", "free-stream")],
    );
}

/// `MEMPLUG_TORCH_REUSE=all-streams` (the default), the safe way where
/// torch's `record_stream` cannot reach the shim: a block freed on A is not
/// reused, not even on A, while another stream the shim has seen (here C,
/// given by `memplug_torch_note_stream`, never allocating) has not passed
/// the free; once it has, it is.
#[test]
fn a_freed_block_waits_for_every_stream_seen() {
    run_scenario("scenario_all_streams", &[("MEMPLUG_TORCH_CACHE", "1")]);
    run_scenario("scenario_all_streams", &[("MEMPLUG_TORCH_CACHE", "0")]);
}

static GATE_ALL: Gate = Gate::new();

#[ignore = "a scenario: run by a_freed_block_waits_for_every_stream_seen in a child process"]
#[test]
fn scenario_all_streams() {
    let shim = Shim::open();
    let fake = Fake::open();
    let (a, c) = (fake.stream(), fake.stream());
    assert_eq!(shim.note_stream(0, c), 0);
    // C may still read what A frees: held until the gate opens.
    fake.block(c, &GATE_ALL);
    let cached = std::env::var("MEMPLUG_TORCH_CACHE").as_deref() == Ok("1");
    let p = shim.alloc(MIB as isize, 0, a);
    let charge = shim.pool_used();
    shim.free(p, MIB, 0, a);
    let r = shim.alloc(MIB as isize, 0, a);
    assert_ne!(r, 0);
    assert_ne!(r, p, "reused on A while stream C had not passed the free");
    std::thread::sleep(std::time::Duration::from_millis(20));
    let s = shim.alloc(MIB as isize, 0, a);
    assert_ne!(s, p, "reused on A 20 ms later, C still held");
    if !cached {
        assert_eq!(shim.pool_used(), 3 * charge, "p given back before C passed the free");
    }
    GATE_ALL.open();
    fake.synchronize(c);
    fake.synchronize(a);
    if cached {
        // Now anyone's.
        eventually("p reusable once C passed the free", || {
            let t = shim.alloc(MIB as isize, 0, a);
            let hit = t == p;
            shim.free(t, MIB, 0, a);
            hit
        });
    } else {
        eventually("p given back once C passed the free", || shim.pool_used() == 2 * charge);
    }
    for x in [r, s] {
        shim.free(x, MIB, 0, a);
    }
    assert_eq!(shim.figure("orphaned"), 0);
}

static GATE_CACHED: Gate = Gate::new();

#[ignore = "a scenario: run by frees_wait_for_the_stream_cached in a child process"]
#[test]
fn scenario_stream_order_cached() {
    let shim = Shim::open();
    let fake = Fake::open();
    let (a, b) = (fake.stream(), fake.stream());
    // Work on A that has not run: the fence a free records after it stays
    // pending until the gate opens.
    fake.block(a, &GATE_CACHED);
    let p = shim.alloc(MIB as isize, 0, a);
    shim.free(p, MIB, 0, a);
    // Another stream may not have it: A's kernels may still use it.
    let q = shim.alloc(MIB as isize, 0, b);
    assert_ne!(q, 0);
    assert_ne!(q, p, "reused by stream B before A's fence completed");
    // A itself may: its new work runs after the old.
    let r = shim.alloc(MIB as isize, 0, a);
    assert_eq!(r, p, "not reused at once on the stream it was freed on");
    shim.free(r, MIB, 0, a);
    shim.free(q, MIB, 0, b);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let s = shim.alloc(MIB as isize, 0, b);
    assert_ne!(s, p, "still pending on A after 20 ms: not B's");
    GATE_CACHED.open();
    fake.synchronize(a);
    // Once A's fence completed, B gets the block (B's own block s is
    // held, q is B's too: p is the one only a completed fence releases).
    let t = shim.alloc(MIB as isize, 0, b);
    assert_eq!(t, p, "A's block not reusable by B after its fence completed");
    for (x, st) in [(s, b), (t, b)] {
        shim.free(x, MIB, 0, st);
    }
    assert_eq!(shim.figure("live"), 0);
    assert_eq!(shim.figure("orphaned"), 0);
}

#[test]
fn frees_wait_for_the_stream_plain() {
    // The freeing stream's fence alone (all-streams would also wait for A).
    run_scenario(
        "scenario_stream_order_plain",
        &[("MEMPLUG_TORCH_CACHE", "0"), ("MEMPLUG_TORCH_REUSE", "free-stream")],
    );
}

static GATE_PLAIN: Gate = Gate::new();

#[ignore = "a scenario: run by frees_wait_for_the_stream_plain in a child process"]
#[test]
fn scenario_stream_order_plain() {
    let shim = Shim::open();
    let fake = Fake::open();
    let (a, b) = (fake.stream(), fake.stream());
    let before = warm_up_plain(&shim, &fake, a); // the device opened, the stream adopted
    fake.block(a, &GATE_PLAIN);
    let p = shim.alloc(MIB as isize, 0, a);
    let held = fake.used_bytes(0) - before;
    assert!(held >= MIB as u64);
    let charged = shim.pool_used();
    shim.free(p, MIB, 0, a);
    let q = shim.alloc(MIB as isize, 0, b);
    assert_ne!(q, p, "p went back to the driver before A's fence");
    shim.free(q, MIB, 0, b);
    // B's fence completes (its stream is idle), so its charge goes back;
    // the driver's own free of it synchronises the device (CUDA's "API
    // synchronization behavior", which the fake follows), so B's memory
    // too reaches the driver only once A moves.
    eventually("B's charge refunded (its stream is idle)", || shim.pool_used() == charged);
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(fake.used_bytes(0) >= before + held, "p freed before A's fence completed");
    assert_eq!(shim.pool_used(), charged, "p's charge refunded before its free");
    GATE_PLAIN.open();
    eventually("p freed after A's fence", || fake.used_bytes(0) == before);
    eventually("p's charge refunded", || shim.pool_used() == 0);
}

#[test]
fn over_budget_is_null_and_leaks_nothing() {
    run_scenario("scenario_over_budget", &[("MEMPLUG_TORCH_CACHE", "0"), ("MEMPLUG_TORCH_POOL_BYTES", "8M")]);
}

#[ignore = "a scenario: run by over_budget_is_null_and_leaks_nothing in a child process"]
#[test]
fn scenario_over_budget() {
    let shim = Shim::open();
    let fake = Fake::open();
    let base = warm_up_plain(&shim, &fake, LEGACY); // the device opened
    let a = shim.alloc(6 * MIB as isize, 0, LEGACY);
    assert_ne!(a, 0);
    let (used, driver) = (shim.pool_used(), fake.used_bytes(0));
    assert_eq!(shim.alloc(4 * MIB as isize, 0, LEGACY), 0, "over the 8 MiB budget");
    assert_eq!(shim.alloc(isize::MAX, 0, LEGACY), 0);
    assert_eq!((shim.pool_used(), fake.used_bytes(0)), (used, driver), "a refusal left something");
    let s = shim.stats();
    assert_eq!((s["shim"]["failed_allocs"].as_u64(), s["shim"]["live"].as_u64()), (Some(2), Some(1)));
    let failures = s["host"]["pools"][0]["classes"]["activations"]["failures"].as_u64();
    assert_eq!(failures, Some(2), "the governor refused them: {s}");
    shim.free(a, 6 * MIB, 0, LEGACY);
    // The freed charge comes back (the shim polls the queue before it
    // gives up), so the next request fits.
    let b = shim.alloc(7 * MIB as isize, 0, LEGACY);
    assert_ne!(b, 0, "the budget did not come back after the free");
    shim.free(b, 7 * MIB, 0, LEGACY);
    eventually("everything refunded", || shim.pool_used() == 0);
    eventually("everything back to the driver", || fake.used_bytes(0) == base);
    assert!(driver > base);
}

#[test]
fn cached_blocks_give_way_under_pressure() {
    // No idle cap (a quarter of the pool by default): the block must stay
    // idle for pressure to take it.
    run_scenario(
        "scenario_cache_pressure",
        &[("MEMPLUG_TORCH_POOL_BYTES", "8M"), ("MEMPLUG_TORCH_CACHE_MAX_IDLE", "none")],
    );
}

#[test]
fn a_device_pool_leases_its_budget_from_a_node_authority() {
    // A short path: a socket's path must fit in 108 bytes.
    let dir = std::env::temp_dir().join(format!("memplug-shim-node-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("node.sock");
    let mut c = memplug_node::AuthorityConfig::new(&socket, vec![("cuda0".into(), 64 << 20)]);
    c.chunk = 1 << 20;
    let a = memplug_node::Authority::start(c).unwrap();
    run_scenario("scenario_node", &[("MEMPLUG_NODE_SOCKET", socket.to_str().unwrap())]);
    // The child exited: its leases came back.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while a.books().devices["cuda0"].leased != 0 {
        assert!(std::time::Instant::now() < end, "{:?}", a.books());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[ignore = "a scenario: run by a_device_pool_leases_its_budget_from_a_node_authority in a child process"]
#[test]
fn scenario_node() {
    use memplug_node::wire::{self, Frame, Msg};
    let shim = Shim::open();
    let p = shim.alloc(3 * MIB as isize, 0, LEGACY);
    assert_ne!(p, 0);
    let mut s =
        std::os::unix::net::UnixStream::connect(std::env::var("MEMPLUG_NODE_SOCKET").unwrap()).unwrap();
    wire::write_msg(&mut s, &Msg::Status { prometheus: false }).unwrap();
    let Frame::Msg(Msg::StatusReply { text }) = wire::read_frame(&mut s).unwrap() else {
        panic!("no status")
    };
    let books: serde_json::Value = serde_json::from_str(&text).unwrap();
    let me =
        books["members"].as_array().unwrap().iter().find(|m| m["pid"] == std::process::id()).unwrap().clone();
    assert!(me["leased"]["cuda0"].as_u64().unwrap() >= 3 * MIB as u64, "{books}");
    assert!(shim.stats()["shim"]["devices"][0]["capacity"].as_u64().unwrap_or(u64::MAX) <= 64 << 20);
    shim.free(p, 3 * MIB, 0, LEGACY);
}

#[test]
fn the_idle_cap_gives_blocks_back_at_the_free() {
    run_scenario(
        "scenario_idle_cap",
        &[("MEMPLUG_TORCH_POOL_BYTES", "64M"), ("MEMPLUG_TORCH_CACHE_MAX_IDLE", "4M")],
    );
}

#[ignore = "a scenario: run by the_idle_cap_gives_blocks_back_at_the_free in a child process"]
#[test]
fn scenario_idle_cap() {
    let shim = Shim::open();
    let blocks: Vec<_> = (0..4).map(|_| shim.alloc(3 * MIB as isize, 0, LEGACY)).collect();
    for b in blocks {
        shim.free(b, 3 * MIB, 0, LEGACY);
    }
    let cache = &shim.stats()["shim"]["devices"][0]["cache"];
    assert!(cache["idle_bytes"].as_u64().unwrap() <= 4 * MIB as u64, "{cache}");
    // Blocks given back behind torch's stream free through the deferred
    // queue: the reaper refunds them once their fences completed.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while shim.pool_used() > 4 * MIB as u64 {
        assert!(std::time::Instant::now() < end, "used {}", shim.pool_used());
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[ignore = "a scenario: run by cached_blocks_give_way_under_pressure in a child process"]
#[test]
fn scenario_cache_pressure() {
    let shim = Shim::open();
    let a = shim.alloc(6 * MIB as isize, 0, LEGACY);
    shim.free(a, 6 * MIB, 0, LEGACY);
    assert!(shim.pool_used() >= 6 * MIB as u64, "the idle block stays charged");
    // Another size class: only room if the cache gives its idle block back.
    let b = shim.alloc(3 * MIB as isize, 0, LEGACY);
    assert_ne!(b, 0, "the idle cached block did not give way");
    let cache = &shim.stats()["shim"]["devices"][0]["cache"];
    assert!(cache["pressure_bytes"].as_u64().unwrap() >= 6 * MIB as u64, "{cache}");
    shim.free(b, 3 * MIB, 0, LEGACY);
}

#[test]
fn unknown_and_double_frees_are_ignored() {
    let stderr = run_scenario("scenario_unknown_free", &[]);
    assert!(stderr.contains("not allocated here (ignored)"), "logged: {stderr}");
}

#[ignore = "a scenario: run by unknown_and_double_frees_are_ignored in a child process"]
#[test]
fn scenario_unknown_free() {
    let shim = Shim::open();
    shim.free(0x7f00_dead_b000, 4096, 0, LEGACY);
    let p = shim.alloc(4096, 0, LEGACY);
    shim.free(p, 4096, 0, LEGACY);
    shim.free(p, 4096, 0, LEGACY); // twice
    shim.free(0, 0, 0, LEGACY); // NULL: nothing at all
    assert_eq!(shim.figure("unknown_frees"), 2);
    assert_eq!((shim.figure("frees"), shim.figure("live")), (1, 0));
    // Still serving.
    let q = shim.alloc(4096, 0, LEGACY);
    assert_ne!(q, 0);
    shim.free(q, 4096, 0, LEGACY);
}

#[test]
fn two_threads() {
    run_scenario("scenario_two_threads", &[]);
}

#[ignore = "a scenario: run by two_threads in a child process"]
#[test]
fn scenario_two_threads() {
    let shim = Shim::open();
    let fake = Fake::open();
    let streams = [fake.stream(), fake.stream()];
    const ROUNDS: usize = 300;
    std::thread::scope(|sc| {
        for (t, &stream) in streams.iter().enumerate() {
            let shim = &shim;
            sc.spawn(move || {
                let mut held: Vec<(u64, usize, u8)> = Vec::new();
                for i in 0..ROUNDS {
                    let size = 4096 << (i % 6);
                    let p = shim.alloc(size as isize, 0, stream);
                    assert_ne!(p, 0, "thread {t} round {i}");
                    let tag = (t * 100 + i % 100) as u8;
                    // SAFETY: `size` bytes just handed out to this thread.
                    unsafe { std::ptr::write_bytes(p as *mut u8, tag, size) };
                    held.push((p, size, tag));
                    if held.len() > 4 {
                        let (p, size, tag) = held.remove(i % 4);
                        // SAFETY: still this thread's block.
                        let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, size) };
                        assert!(bytes.iter().all(|&b| b == tag), "thread {t}: a block was shared");
                        shim.free(p, size, 0, stream);
                    }
                }
                for (p, size, _) in held {
                    shim.free(p, size, 0, stream);
                }
            });
        }
    });
    let s = &shim.stats()["shim"];
    assert_eq!(s["allocs"].as_u64(), Some(2 * ROUNDS as u64));
    assert_eq!((s["frees"].as_u64(), s["live"].as_u64()), (Some(2 * ROUNDS as u64), Some(0)));
    assert_eq!((s["failed_allocs"].as_u64(), s["orphaned"].as_u64()), (Some(0), Some(0)));
    assert_eq!(s["devices"][0]["streams"], 2);
}

#[test]
fn a_bad_configuration_refuses_and_says_why() {
    let stderr = run_scenario("scenario_bad_config", &[("MEMPLUG_TORCH_CACHE", "maybe")]);
    assert!(stderr.contains("MEMPLUG_TORCH_CACHE=\"maybe\""), "said why: {stderr}");
}

#[ignore = "a scenario: run by a_bad_configuration_refuses_and_says_why in a child process"]
#[test]
fn scenario_bad_config() {
    let shim = Shim::open();
    assert_eq!(shim.alloc(4096, 0, LEGACY), 0);
    shim.free(0x1000, 4096, 0, LEGACY); // ignored, no crash
    let s = shim.stats();
    assert_eq!(s["shim"]["started"], false);
    assert!(!s["shim"]["error"].as_str().unwrap().is_empty(), "{s}");
    assert!(s["host"].is_null());
}

#[test]
fn a_missing_plugin_refuses_and_says_why() {
    let stderr = run_scenario("scenario_bad_config", &[("MEMPLUG_TORCH_PLUGIN", "./no-such-plugin.so")]);
    assert!(stderr.contains("no-such-plugin.so"), "said why: {stderr}");
}

#[test]
fn the_readme_lists_every_variable() {
    let readme =
        std::fs::read_to_string(memplug_test_support::repo_root().join("README.md")).expect("README");
    let start = readme.find("### PyTorch").expect("a PyTorch section");
    let section = &readme[start..readme[start..].find("\n## ").map_or(readme.len(), |e| start + e)];
    for (name, _) in memplug_torch::config::VARIABLES {
        assert!(section.contains(&format!("| `{name}` |")), "README's PyTorch table lacks {name}");
    }
    let listed = section.matches("| `MEMPLUG_TORCH_").count() + section.matches("| `MEMPLUG_NODE_").count();
    assert_eq!(
        listed,
        memplug_torch::config::VARIABLES.len(),
        "README lists a variable the shim does not read"
    );
}

/// What torch does with a refusal: its allocator is a `std::function`
/// over `memplug_torch_alloc`, and the pointer is used unchecked, so a
/// refusal must be a C++ exception (never NULL for a size above zero).
#[test]
fn a_refusal_reaches_torchs_cpp_as_an_exception() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/torch_calls.cpp");
    let exe = test_tmp_dir("torch-calls").join("torch_calls");
    let mut cc = cxx_compiler(None);
    cc.args(["-std=c++17", "-O1", "-Wall", "-Wextra", "-Wpedantic", "-Werror"])
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg("-ldl");
    run_tool(cc);
    let out = std::process::Command::new(&exe)
        .arg(common::shim_path())
        .env("MEMPLUG_CUDA_DRIVER", common::fake_driver())
        .env("MEMPLUG_FAKE_CUDA_DEVICES", "1")
        .env("MEMPLUG_FAKE_CUDA_MEM_MIB", "1024")
        .env("MEMPLUG_TORCH_POOL_BYTES", (64 * MIB).to_string())
        .env_remove("MEMPLUG_TORCH_PLUGIN")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.ends_with("ok\n"), "{}:\n{stdout}\n{stderr}", out.status);
    assert!(
        stdout.contains("refused: memplug: CUDA allocation of 1099511627776 bytes on cuda:0 refused: "),
        "{stdout}"
    );
    assert!(stdout.contains("on cuda:7 refused: "), "{stdout}");
}

/// The driver out of memory while the budget has room: idle cached blocks
/// hold device memory, so the shim gives them back and retries once
/// before refusing; `memplug_torch_empty_cache` gives back the rest.
#[test]
fn a_driver_out_of_memory_trims_the_cache_and_retries() {
    run_scenario(
        "scenario_driver_oom",
        &[
            ("MEMPLUG_FAKE_CUDA_MEM_MIB", "64"),
            ("MEMPLUG_TORCH_POOL_BYTES", "1G"),
            ("MEMPLUG_TORCH_CACHE", "1"),
        ],
    );
}

#[ignore = "a scenario: run by a_driver_out_of_memory_trims_the_cache_and_retries in a child process"]
#[test]
fn scenario_driver_oom() {
    let shim = Shim::open();
    let fake = Fake::open();
    assert_eq!(shim.empty_cache(), 0, "nothing to give back before the first allocation");
    let warm = shim.alloc(4096, 0, LEGACY);
    shim.free(warm, 4096, 0, LEGACY);
    let base = fake.used_bytes(0);
    let a = shim.alloc(40 * MIB as isize, 0, LEGACY);
    assert_ne!(a, 0);
    shim.free(a, 40 * MIB, 0, LEGACY);
    assert!(fake.used_bytes(0) >= base + 40 * MIB as u64, "kept by the cache, still the driver's");
    // 48 MiB: no cached block serves it, and the 64 MiB device has 24 left.
    let b = shim.alloc(48 * MIB as isize, 0, LEGACY);
    assert_ne!(b, 0, "the cached 40 MiB were not given back for the retry");
    assert!(shim.figure("trimmed_bytes") >= 40 * MIB as u64, "{}", shim.stats());
    assert_eq!(shim.figure("failed_allocs"), 0);
    shim.free(b, 48 * MIB, 0, LEGACY);
    assert!(shim.empty_cache() >= 48 * MIB as u64, "the freed block was cached, and given back");
    eventually("the driver's memory back", || fake.used_bytes(0) <= base);
}
