//! GPU benchmarks of the CUDA VMM plugin, as tests.
//!
//! * `gpu_bench_*` (ignored): the real figures, on a GPU, run by
//!   `device-check.sh` with `MEMPLUG_CUDA_TEST_REAL=1 … --ignored
//!   --nocapture`. Without a GPU they run the tiny configuration on the
//!   fake driver.
//! * `benches_run_in_a_tiny_configuration`: every bench on the fake driver
//!   with sizes in MiB, so CI proves the code runs and the accounting
//!   figures come out as designed (timings on the fake mean nothing).
//!
//! * `gpu_driver_info` (ignored): prints the `libcuda` loaded and
//!   `cuDriverGetVersion` (device-check.sh's first step).
//!
//! Every figure is printed (`--nocapture` to see them): a human `BENCH`
//! line, and one `FIGURE {json}` line per number, which device-check.sh
//! gathers into its figures file. On the fake driver every figure is
//! labelled `"driver": "FAKE"` (its timings are of host memory and mean
//! nothing for a GPU).

mod common;

use common::*;
use memplug_host::{Access, Mechanism, Plugin};
use memplug_plugin_cuda_vmm::driver::{access_desc, allocation_prop, CUstream, CUDA_SUCCESS};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

struct Config {
    name: &'static str,
    /// Commit+decommit pairs per round, and rounds.
    granule_iters: usize,
    granule_rounds: usize,
    /// KV growth: reservation size and the size grown to.
    kv_reserve: u64,
    kv_target: u64,
    /// Shared prefix: its size and how many regions map it.
    prefix: u64,
    regions: usize,
    /// Commit latency: samples per case, and the buffer a busy stream
    /// fills over and over meanwhile.
    latency_samples: usize,
    busy_buffer: u64,
    /// `tiny` or `full`, for the figures file.
    scale: &'static str,
}

const TINY: Config = Config {
    name: "tiny (fake driver)",
    granule_iters: 20,
    granule_rounds: 3,
    kv_reserve: 256 * MIB,
    kv_target: 64 * MIB,
    prefix: 8 * MIB,
    regions: 32,
    latency_samples: 50,
    busy_buffer: 4 * MIB,
    scale: "tiny",
};

const FULL: Config = Config {
    name: "full (GPU)",
    granule_iters: 500,
    granule_rounds: 7,
    kv_reserve: 64 * GIB,
    kv_target: 16 * GIB,
    prefix: GIB,
    regions: 32,
    latency_samples: 2000,
    busy_buffer: 256 * MIB,
    scale: "full",
};

/// Full size on a GPU, tiny on the fake; `MEMPLUG_CUDA_BENCH_SCALE=tiny`
/// or `full` overrides (tiny lets device-check.sh be rehearsed on the fake).
fn config() -> &'static Config {
    match std::env::var("MEMPLUG_CUDA_BENCH_SCALE").as_deref() {
        Ok("tiny") => &TINY,
        Ok("full") => &FULL,
        _ if real() => &FULL,
        _ => &TINY,
    }
}

fn gib(b: u64) -> f64 {
    b as f64 / GIB as f64
}

fn used_bytes(m: &Mechanism) -> u64 {
    let i = m.memory_info().unwrap().unwrap();
    i.total_bytes - i.free_bytes
}

/// Whether the driver in use is the fake (its introspection symbols, or
/// its device names, give it away).
fn on_fake() -> bool {
    let d = drv();
    d.symbol("fake_cuda_calls").is_some() || d.devices.iter().any(|x| x.name.contains("FAKE"))
}

/// `FAKE` or `GPU`: the label of every figure.
fn label() -> &'static str {
    if on_fake() {
        "FAKE"
    } else {
        "GPU"
    }
}

/// A JSON string literal of `s`.
fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Prints one machine-readable figure (device-check.sh collects them).
fn figure(cfg: &Config, name: &str, value: f64, unit: &str) {
    let value = if value.is_finite() { format!("{value:.6}") } else { "null".into() };
    println!(
        "FIGURE {{\"name\":{},\"value\":{value},\"unit\":{},\"driver\":{},\"scale\":{}}}",
        json_str(name),
        json_str(unit),
        json_str(label()),
        json_str(cfg.scale)
    );
}

fn percentile(sorted: &[f64], p: usize) -> f64 {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Commit+decommit of one granule through the host, against the same
/// driver calls made directly (with and without the zero-fill the ABI
/// promises and the plugin does). The context is current on the calling
/// thread in every variant, as on a CUDA runtime's thread. Returns the
/// ratio host / raw-with-zero-fill.
fn bench_granule(p: &Plugin, cfg: &Config) -> f64 {
    let m = cuda0(p);
    let g = m.properties().granularity;
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let r = vb.reserve(g).unwrap();
    let d = drv();
    let vmm = d.vmm.expect("VMM entry points");
    let dev = d.devices[0].device;
    let (host, raw, raw_zero) = in_context(0, |d| {
        let prop = allocation_prop(dev);
        let desc = access_desc(dev, true);
        let mut va = 0;
        let mut stream: CUstream = std::ptr::null_mut();
        unsafe {
            assert_eq!((vmm.address_reserve)(&mut va, g as usize, g as usize, 0, 0), CUDA_SUCCESS);
            assert_eq!((d.api.stream_create)(&mut stream, 1), CUDA_SUCCESS);
        }
        let raw_pair = |zero: bool| unsafe {
            let mut h = 0;
            assert_eq!((vmm.create)(&mut h, g as usize, &prop, 0), CUDA_SUCCESS);
            assert_eq!((vmm.map)(va, g as usize, 0, h, 0), CUDA_SUCCESS);
            assert_eq!((vmm.set_access)(va, g as usize, &desc, 1), CUDA_SUCCESS);
            if zero {
                assert_eq!((d.api.memset_d8_async)(va, 0, g as usize, stream), CUDA_SUCCESS);
                assert_eq!((d.api.stream_synchronize)(stream), CUDA_SUCCESS);
            }
            assert_eq!((vmm.unmap)(va, g as usize), CUDA_SUCCESS);
            assert_eq!((vmm.release)(h), CUDA_SUCCESS);
        };
        let host_pair = || {
            vb.commit(&r, 0, g).unwrap();
            vb.decommit(&r, 0, g).unwrap();
        };
        let time = |f: &dyn Fn()| {
            let t = Instant::now();
            for _ in 0..cfg.granule_iters {
                f();
            }
            t.elapsed().as_secs_f64() * 1e6 / cfg.granule_iters as f64
        };
        // Warm up every path, then interleave rounds so drift hits all.
        for _ in 0..10 {
            host_pair();
            raw_pair(false);
            raw_pair(true);
        }
        let (mut host, mut raw, mut raw_zero) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..cfg.granule_rounds {
            host.push(time(&host_pair));
            raw.push(time(&|| raw_pair(false)));
            raw_zero.push(time(&|| raw_pair(true)));
        }
        unsafe {
            assert_eq!((d.api.stream_destroy)(stream), CUDA_SUCCESS);
            assert_eq!((vmm.address_free)(va, g as usize), CUDA_SUCCESS);
        }
        (median(host), median(raw), median(raw_zero))
    });
    vb.release(r).unwrap();
    let ratio = host / raw_zero;
    println!(
        "BENCH commit+decommit of one {} MiB granule [{}]: through the host {host:.2} us; raw driver calls \
         (cuMemCreate+cuMemMap+cuMemSetAccess+cuMemUnmap+cuMemRelease) {raw:.2} us (host/raw {:.3}x); raw \
         with the zero-fill the plugin does (cuMemsetD8Async+cuStreamSynchronize) {raw_zero:.2} us (host/raw \
         {ratio:.3}x; target <= 1.05x)",
        g / MIB,
        cfg.name,
        host / raw
    );
    figure(cfg, "granule_commit_decommit_host_us", host, "us");
    figure(cfg, "granule_commit_decommit_raw_us", raw, "us");
    figure(cfg, "granule_commit_decommit_raw_zero_fill_us", raw_zero, "us");
    figure(cfg, "granule_host_over_raw", host / raw, "x");
    figure(cfg, "granule_host_over_raw_zero_fill", ratio, "x");
    ratio
}

/// Latency of one granule's commit (zero-fill included) through the host:
/// p50 and p99 over many commits, on an idle device and with a second
/// stream kept busy meanwhile (memsets of a buffer queued on a
/// default-priority stream of the runtime, two ahead of every commit): the
/// plugin's zero-fill stream has the greatest priority, so its fill is
/// scheduled first. Returns (p50 idle, p99 idle, p50 busy, p99 busy) in µs.
fn bench_commit_latency(p: &Plugin, cfg: &Config) -> (f64, f64, f64, f64) {
    let m = cuda0(p);
    let g = m.properties().granularity;
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let r = vb.reserve(g).unwrap();
    let (idle, busy) = in_context(0, |d| {
        let sample = |busy: Option<(CUstream, u64)>| {
            let mut v = Vec::with_capacity(cfg.latency_samples);
            for i in 0..cfg.latency_samples + 10 {
                if let Some((stream, buf)) = busy {
                    for _ in 0..2 {
                        let r = unsafe {
                            (d.api.memset_d8_async)(buf, i as u8, cfg.busy_buffer as usize, stream)
                        };
                        assert_eq!(r, CUDA_SUCCESS);
                    }
                }
                let t = Instant::now();
                vb.commit(&r, 0, g).unwrap();
                let us = t.elapsed().as_secs_f64() * 1e6;
                vb.decommit(&r, 0, g).unwrap();
                // The first few warm the paths up.
                if i >= 10 {
                    v.push(us);
                }
            }
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v
        };
        let idle = sample(None);
        let mut stream: CUstream = std::ptr::null_mut();
        let mut buf = 0;
        unsafe {
            assert_eq!((d.api.stream_create)(&mut stream, 1), CUDA_SUCCESS);
            assert_eq!((d.api.mem_alloc)(&mut buf, cfg.busy_buffer as usize), CUDA_SUCCESS);
        }
        let busy = sample(Some((stream, buf)));
        unsafe {
            assert_eq!((d.api.stream_synchronize)(stream), CUDA_SUCCESS);
            assert_eq!((d.api.stream_destroy)(stream), CUDA_SUCCESS);
            assert_eq!((d.api.mem_free)(buf), CUDA_SUCCESS);
        }
        (idle, busy)
    });
    vb.release(r).unwrap();
    let f = (percentile(&idle, 50), percentile(&idle, 99), percentile(&busy, 50), percentile(&busy, 99));
    println!(
        "BENCH commit latency of one {} MiB granule (zero-fill included) [{}], {} commits each: idle p50 {:.1} \
         us, p99 {:.1} us | a second stream busy ({} MiB memsets queued on a default-priority stream): p50 \
         {:.1} us, p99 {:.1} us",
        g / MIB,
        cfg.name,
        cfg.latency_samples,
        f.0,
        f.1,
        cfg.busy_buffer / MIB,
        f.2,
        f.3
    );
    figure(cfg, "commit_latency_idle_p50_us", f.0, "us");
    figure(cfg, "commit_latency_idle_p99_us", f.1, "us");
    figure(cfg, "commit_latency_busy_p50_us", f.2, "us");
    figure(cfg, "commit_latency_busy_p99_us", f.3, "us");
    f
}

/// Growing a KV cache: a stable-pointer reservation committed 2 MiB at a
/// time, against allocate-bigger-and-copy (capacity doubling, the usual
/// vector growth; growing by copying at every 2 MiB step would copy
/// n²/2 granules). Returns (VMM peak, copy peak) in bytes.
fn bench_kv_growth(p: &Plugin, cfg: &Config) -> (u64, u64) {
    let m = cuda0(p);
    let g = m.properties().granularity;
    let steps = cfg.kv_target / g;
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let base = used_bytes(&m);

    let t = Instant::now();
    let r = vb.reserve(cfg.kv_reserve).unwrap();
    let addr = r.addr();
    vb.commit(&r, 0, g).unwrap();
    stamp(addr, 41);
    let t_first = t.elapsed();
    for i in 1..steps {
        vb.commit(&r, i * g, g).unwrap();
    }
    let vmm_time = t.elapsed();
    let vmm_peak = used_bytes(&m) - base;
    assert_eq!(r.addr(), addr);
    assert!(has_stamp(addr, 41), "data kept in place while growing");
    assert_eq!(vb.committed_bytes(&r).unwrap(), cfg.kv_target);
    vb.release(r).unwrap();

    let a = unsafe { m.ungoverned() }.allocator();
    let t = Instant::now();
    let mut cap = g;
    let mut cur = a.allocate(cap, 256).unwrap();
    stamp(cur.addr(), 42);
    let mut copy_peak = used_bytes(&m) - base;
    let mut copied = 0u64;
    let mut size = g;
    for _ in 1..steps {
        size += g;
        if size > cap {
            cap *= 2;
            let next = a.allocate(cap, 256).unwrap();
            let n = size - g;
            in_context(0, |d| unsafe {
                assert_eq!((d.api.memcpy_dtod)(next.addr(), cur.addr(), n as usize), CUDA_SUCCESS);
                assert_eq!((d.api.ctx_synchronize)(), CUDA_SUCCESS);
            });
            copied += n;
            copy_peak = copy_peak.max(used_bytes(&m) - base);
            a.deallocate(std::mem::replace(&mut cur, next)).unwrap();
        }
    }
    let copy_time = t.elapsed();
    assert!(has_stamp(cur.addr(), 42), "data moved with every copy");
    a.deallocate(cur).unwrap();
    println!(
        "BENCH KV growth [{}]: reserve {:.2} GiB, grow to {:.2} GiB in {} MiB steps ({steps} commits): \
         stable pointer, {:.1} ms (first step {:.3} ms), peak device memory {:.3} GiB | \
         allocate-bigger-and-copy with doubling: {:.1} ms, peak device memory {:.3} GiB, {:.2} GiB copied \
         (copying at every step would copy {:.1} GiB)",
        cfg.name,
        gib(cfg.kv_reserve),
        gib(cfg.kv_target),
        g / MIB,
        ms(vmm_time),
        ms(t_first),
        gib(vmm_peak),
        ms(copy_time),
        gib(copy_peak),
        gib(copied),
        gib(g) * (steps * (steps - 1) / 2) as f64,
    );
    figure(cfg, "kv_growth_target_gib", gib(cfg.kv_target), "GiB");
    figure(cfg, "kv_growth_vmm_ms", ms(vmm_time), "ms");
    figure(cfg, "kv_growth_vmm_peak_gib", gib(vmm_peak), "GiB");
    figure(cfg, "kv_growth_copy_ms", ms(copy_time), "ms");
    figure(cfg, "kv_growth_copy_peak_gib", gib(copy_peak), "GiB");
    (vmm_peak, copy_peak)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One prefix, created once, mapped read-only into many regions: the
/// driver's free-memory figure drops by one prefix, not one per region.
/// Returns the bytes used.
fn bench_shared_prefix(p: &Plugin, cfg: &Config) -> u64 {
    let m = cuda0(p);
    let g = m.properties().granularity;
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    if let Some(overhead) = (!real()).then(fake_ctx_overhead) {
        // The plugin frees on its freer thread: the earlier benches' frees
        // reach the driver a moment later.
        eventually("the earlier frees reached the driver", || {
            used_bytes(&m) == fake_used(0).unwrap() + overhead
        });
    }
    let base = used_bytes(&m);
    let t = Instant::now();
    let prefix = sm.create(cfg.prefix).unwrap();
    let t_create = t.elapsed();
    let writer = vb.reserve(cfg.prefix).unwrap();
    sm.map(&prefix, 0, &writer, 0, cfg.prefix, Access::ReadWrite).unwrap();
    stamp(writer.addr(), 51);
    stamp(writer.addr() + cfg.prefix - 64, 52);
    let t = Instant::now();
    let mut regions = Vec::new();
    for _ in 0..cfg.regions {
        // Each region: the shared prefix, then room of its own.
        let r = vb.reserve(cfg.prefix + 4 * g).unwrap();
        // Read-write, with a note, where the driver refuses read-only (the
        // memory figure is the same).
        map_read_only_or_fallback(&sm, &prefix, 0, &r, 0, cfg.prefix);
        regions.push(r);
    }
    let t_map = t.elapsed();
    let used = used_bytes(&m) - base;
    for r in &regions {
        assert!(has_stamp(r.addr(), 51) && has_stamp(r.addr() + cfg.prefix - 64, 52));
    }
    println!(
        "BENCH shared prefix [{}]: {} regions map one {:.3} GiB prefix read-only: device memory used {:.3} GiB \
         by the driver's free-memory figure (one prefix, not {:.1} GiB); create+zero {:.1} ms, mapping all \
         regions {:.1} ms",
        cfg.name,
        cfg.regions,
        gib(cfg.prefix),
        gib(used),
        gib(cfg.prefix) * cfg.regions as f64,
        ms(t_create),
        ms(t_map),
    );
    figure(cfg, "shared_prefix_gib", gib(cfg.prefix), "GiB");
    figure(cfg, "shared_prefix_regions", cfg.regions as f64, "regions");
    figure(cfg, "shared_prefix_used_gib", gib(used), "GiB");
    figure(cfg, "shared_prefix_map_all_ms", ms(t_map), "ms");
    for r in regions {
        vb.release(r).unwrap();
    }
    vb.release(writer).unwrap();
    sm.release(prefix).unwrap();
    used
}

fn finish(p: Plugin) {
    unload_released(p);
}

#[test]
fn benches_run_in_a_tiny_configuration() {
    if real() {
        return;
    }
    let _s = serial();
    let p = load();
    let ratio = bench_granule(&p, &TINY);
    assert!(ratio.is_finite() && ratio > 0.0);
    let (vmm_peak, copy_peak) = bench_kv_growth(&p, &TINY);
    assert_eq!(vmm_peak, TINY.kv_target, "VMM growth holds exactly what it committed");
    assert!(copy_peak >= TINY.kv_target * 3 / 2, "copying holds old and new: {copy_peak}");
    let used = bench_shared_prefix(&p, &TINY);
    assert_eq!(used, TINY.prefix, "32 views of one prefix cost one prefix");
    let (p50, p99, b50, b99) = bench_commit_latency(&p, &TINY);
    assert!(p50 > 0.0 && p50 <= p99 && b50 > 0.0 && b50 <= b99);
    finish(p);
}

/// What device-check.sh prints first: the driver file loaded, its
/// `cuDriverGetVersion`, the devices, and whether it is the fake; one
/// `INFO {json}` line for the figures file.
#[test]
#[ignore = "run by device-check.sh"]
fn gpu_driver_info() {
    let _s = serial();
    let d = drv();
    let p = load();
    let fake = on_fake();
    println!("libcuda: {}", d.loaded_path);
    println!("cuDriverGetVersion: {} (CUDA {}.{})", d.version, d.version / 1000, d.version % 1000 / 10);
    println!("plugin: {} {}", p.name(), p.version());
    let mut devices = Vec::new();
    for (i, info) in d.devices.iter().enumerate() {
        let m = p.mechanism(&memplug_plugin_cuda_vmm::mechanism_name(i as u32)).unwrap().clone();
        let mem = m.memory_info().unwrap().unwrap();
        println!(
            "device {i}: {} | VMM granularity {} | {:.1} GiB total, {:.1} GiB free",
            info.name,
            info.vmm_granularity.map_or("none (no VMM)".into(), |g| format!("{} MiB", g / MIB)),
            gib(mem.total_bytes),
            gib(mem.free_bytes)
        );
        devices.push(format!(
            "{{\"ordinal\":{i},\"name\":{},\"vmm_granularity\":{},\"total_bytes\":{},\"free_bytes\":{}}}",
            json_str(&info.name),
            info.vmm_granularity.map_or("null".into(), |g| g.to_string()),
            mem.total_bytes,
            mem.free_bytes
        ));
    }
    if fake {
        println!("driver: FAKE (fake-driver/fake_cuda.c): no figure below is a GPU figure");
    }
    println!(
        "INFO {{\"libcuda\":{},\"driver_version\":{},\"plugin_version\":{},\"fake\":{fake},\"devices\":[{}]}}",
        json_str(&d.loaded_path),
        d.version,
        json_str(p.version()),
        devices.join(",")
    );
    finish(p);
}

#[test]
#[ignore = "GPU benchmark: run by device-check.sh (tiny configuration without a GPU)"]
fn gpu_bench_commit_latency() {
    let _s = serial();
    let p = load();
    let (p50, p99, b50, b99) = bench_commit_latency(&p, config());
    assert!(p50 <= p99 && b50 <= b99);
    finish(p);
}

#[test]
#[ignore = "GPU benchmark: run by device-check.sh (tiny configuration without a GPU)"]
fn gpu_bench_commit_decommit_one_granule() {
    let _s = serial();
    let p = load();
    bench_granule(&p, config());
    finish(p);
}

#[test]
#[ignore = "GPU benchmark: run by device-check.sh (tiny configuration without a GPU)"]
fn gpu_bench_kv_growth() {
    let _s = serial();
    let p = load();
    let cfg = config();
    let (vmm_peak, copy_peak) = bench_kv_growth(&p, cfg);
    assert!(vmm_peak < copy_peak, "VMM growth should need less memory at its peak");
    finish(p);
}

#[test]
#[ignore = "GPU benchmark: run by device-check.sh (tiny configuration without a GPU)"]
fn gpu_bench_shared_prefix() {
    let _s = serial();
    let p = load();
    let cfg = config();
    let used = bench_shared_prefix(&p, cfg);
    assert!(used < cfg.prefix * 3 / 2, "{used} bytes used for one prefix of {}", cfg.prefix);
    finish(p);
}
