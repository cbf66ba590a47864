//! The hand-written declarations of `src/sys.rs` against the system's UCX
//! headers: a C program compiled with `<ucp/api/ucp.h>` prints every size,
//! offset and constant the crate relies on, and each must equal Rust's.
//! Skips (with a message) when the headers are absent.

use memplug_ucx::sys::*;
use std::mem::{offset_of, size_of};

/// `(name, Rust value, C expression)`.
fn facts() -> Vec<(&'static str, u64, &'static str)> {
    macro_rules! size {
        ($t:ident) => {
            (stringify!($t), size_of::<$t>() as u64, concat!("sizeof(", stringify!($t), ")"))
        };
    }
    macro_rules! off {
        ($t:ident, $f:ident) => {
            (
                concat!(stringify!($t), ".", stringify!($f)),
                offset_of!($t, $f) as u64,
                concat!("offsetof(", stringify!($t), ", ", stringify!($f), ")"),
            )
        };
    }
    macro_rules! cst {
        ($c:ident) => {
            (stringify!($c), $c as i64 as u64, concat!("(uint64_t)(int64_t)", stringify!($c)))
        };
    }
    vec![
        ("ucs_status_t", size_of::<ucs_status_t>() as u64, "sizeof(ucs_status_t)"),
        size!(ucp_params_t),
        off!(ucp_params_t, features),
        off!(ucp_params_t, mt_workers_shared),
        off!(ucp_params_t, name),
        size!(ucp_worker_params_t),
        off!(ucp_worker_params_t, thread_mode),
        off!(ucp_worker_params_t, cpu_mask),
        off!(ucp_worker_params_t, events),
        off!(ucp_worker_params_t, flags),
        off!(ucp_worker_params_t, client_id),
        size!(ucp_err_handler_t),
        size!(ucp_ep_params_t),
        off!(ucp_ep_params_t, address),
        off!(ucp_ep_params_t, err_mode),
        off!(ucp_ep_params_t, err_handler),
        off!(ucp_ep_params_t, user_data),
        off!(ucp_ep_params_t, sockaddr),
        off!(ucp_ep_params_t, name),
        off!(ucp_ep_params_t, local_sockaddr),
        size!(ucp_mem_map_params_t),
        off!(ucp_mem_map_params_t, address),
        off!(ucp_mem_map_params_t, length),
        off!(ucp_mem_map_params_t, prot),
        off!(ucp_mem_map_params_t, memory_type),
        size!(ucp_request_param_t),
        off!(ucp_request_param_t, flags),
        off!(ucp_request_param_t, request),
        off!(ucp_request_param_t, cb),
        off!(ucp_request_param_t, datatype),
        off!(ucp_request_param_t, memory_type),
        off!(ucp_request_param_t, recv_info),
        off!(ucp_request_param_t, memh),
        cst!(UCS_OK),
        cst!(UCS_INPROGRESS),
        cst!(UCS_ERR_UNREACHABLE),
        cst!(UCS_ERR_CANCELED),
        cst!(UCS_ERR_TIMED_OUT),
        cst!(UCS_ERR_LAST),
        cst!(UCP_PARAM_FIELD_FEATURES),
        cst!(UCP_PARAM_FIELD_MT_WORKERS_SHARED),
        cst!(UCP_FEATURE_RMA),
        cst!(UCP_WORKER_PARAM_FIELD_THREAD_MODE),
        cst!(UCS_THREAD_MODE_SERIALIZED),
        cst!(UCP_EP_PARAM_FIELD_REMOTE_ADDRESS),
        cst!(UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE),
        cst!(UCP_EP_PARAM_FIELD_ERR_HANDLER),
        cst!(UCP_ERR_HANDLING_MODE_NONE),
        cst!(UCP_ERR_HANDLING_MODE_PEER),
        cst!(UCP_EP_CLOSE_FLAG_FORCE),
        cst!(UCP_MEM_MAP_PARAM_FIELD_ADDRESS),
        cst!(UCP_MEM_MAP_PARAM_FIELD_LENGTH),
        cst!(UCP_MEM_MAP_PARAM_FIELD_PROT),
        cst!(UCP_MEM_MAP_PROT_LOCAL_READ),
        cst!(UCP_MEM_MAP_PROT_LOCAL_WRITE),
        cst!(UCP_MEM_MAP_PROT_REMOTE_READ),
        cst!(UCP_MEM_MAP_PROT_REMOTE_WRITE),
        cst!(UCP_OP_ATTR_FIELD_FLAGS),
    ]
}

#[test]
fn declarations_match_the_system_ucx_headers() {
    let dir = memplug_test_support::test_tmp_dir("ucx-layout");
    let probe = dir.join("probe.c");
    std::fs::write(&probe, "#include <ucp/api/ucp.h>\nint main(void) { return 0; }\n").unwrap();
    let mut cc = memplug_test_support::c_compiler(None);
    let out = cc.arg(&probe).arg("-o").arg(dir.join("probe")).output().expect("run the C compiler");
    if !out.status.success() {
        eprintln!(
            "SKIP declarations_match_the_system_ucx_headers: <ucp/api/ucp.h> does not compile here (install \
             libucx-dev: scripts/setup.sh test): {}",
            String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or("")
        );
        return;
    }
    let facts = facts();
    let mut src = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <stdint.h>\n#include <ucp/api/ucp.h>\nint main(void) {\n",
    );
    for (_, _, expr) in &facts {
        src.push_str(&format!("    printf(\"%llu\\n\", (unsigned long long)({expr}));\n"));
    }
    src.push_str("    return 0;\n}\n");
    let c = dir.join("layout.c");
    std::fs::write(&c, src).unwrap();
    let exe = dir.join("layout");
    let mut cc = memplug_test_support::c_compiler(None);
    cc.arg(&c).arg("-o").arg(&exe);
    memplug_test_support::run_tool(cc);
    let out = std::process::Command::new(&exe).output().expect("run the layout probe");
    assert!(out.status.success());
    let values: Vec<u64> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    let wrong: Vec<String> = facts
        .iter()
        .zip(&values)
        .filter(|((_, rust, _), c)| rust != *c)
        .map(|((name, rust, _), c)| format!("{name}: Rust {rust}, C {c}"))
        .collect();
    assert!(wrong.is_empty(), "src/sys.rs disagrees with the system UCX headers:\n{}", wrong.join("\n"));
}
