//! `memplug` for Python: the memplug host as a Python module (PyO3), with
//! DLPack export so NumPy, PyTorch and JAX see memplug memory without a
//! copy.
//!
//! * `manager.rs` — `Manager`, `Context`, `Pool`, `Holder` (Python
//!   pressure callbacks);
//! * `memory.rs` — `Binding`, `CachingBinding`, `Allocation`,
//!   `CachedAllocation`, `SharedPrefix`;
//! * `node.rs` — `NodeLink` (a pool joined to a node authority) and
//!   `NodeAuthority` (one embedded);
//! * `region.rs` — `Region` (grow with a Python update callback, rolled
//!   back if it raises);
//! * `streams.rs` — `Stream` (Python host functions), `Fence` (recorded,
//!   or a runtime's own query);
//! * `ucx.rs` — `Ucx`, `UcxRegistration`, `UcxPeer`, `UcxRemoteRange`,
//!   `UcxTransfer`: memory on the wire between processes (UCX);
//! * `tensor.rs` — dtypes, `Tensor` views, `__dlpack__` (versioned and
//!   legacy capsules, stream synchronisation);
//! * `interp.rs` — calling Python from host threads, safely up to exit;
//! * `errors.rs` — the exception hierarchy.

mod errors;
mod interp;
mod manager;
mod memory;
mod node;
mod region;
mod streams;
mod tensor;
mod ucx;

use pyo3::prelude::*;

#[pymodule]
fn memplug(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<manager::Manager>()?;
    m.add_class::<manager::Context>()?;
    m.add_class::<manager::Pool>()?;
    m.add_class::<manager::Holder>()?;
    m.add_class::<node::NodeLink>()?;
    m.add_class::<node::NodeAuthority>()?;
    m.add_class::<memory::Binding>()?;
    m.add_class::<memory::CachingBinding>()?;
    m.add_class::<memory::Allocation>()?;
    m.add_class::<memory::CachedAllocation>()?;
    m.add_class::<memory::SharedPrefix>()?;
    m.add_class::<region::Region>()?;
    m.add_class::<tensor::Tensor>()?;
    m.add_class::<streams::Stream>()?;
    m.add_class::<streams::Fence>()?;
    m.add_class::<ucx::Ucx>()?;
    m.add_class::<ucx::UcxRegistration>()?;
    m.add_class::<ucx::UcxPeer>()?;
    m.add_class::<ucx::UcxRemoteRange>()?;
    m.add_class::<ucx::UcxTransfer>()?;
    errors::register(m)?;
    interp::register(m)?;
    m.add(
        "DLPACK_VERSION",
        (memplug_host::dlpack::DLPACK_MAJOR_VERSION, memplug_host::dlpack::DLPACK_MINOR_VERSION),
    )?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
