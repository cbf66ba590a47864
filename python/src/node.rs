//! `NodeLink`: a pool joined to a node authority (`memplug node serve`), so
//! its capacity is what this process leased for one device and pressure
//! crosses process boundaries (see the `memplug-node` crate).

use crate::errors;
use crate::manager::Pool;
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

/// A pool joined to a node authority. `close()` (or dropping it) gives idle
/// budget back and leaves; what the pool still holds stays counted by the
/// authority until this process exits.
#[pyclass(module = "memplug")]
pub struct NodeLink {
    inner: Mutex<Option<memplug_node::NodeLink>>,
}

impl NodeLink {
    fn with<R>(&self, f: impl FnOnce(&memplug_node::NodeLink) -> R) -> PyResult<R> {
        match self.inner.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(l) => Ok(f(l)),
            None => Err(errors::invalid("the node link was closed".into())),
        }
    }
}

/// Joins `pool` (a root pool, best created with capacity 0) to the
/// authority at `socket` as `device`; `priority`: lower gives way first to
/// other processes; `classes`: the mask of the classes it holds (0: any).
pub(crate) fn join(
    py: Python<'_>,
    socket: PathBuf,
    pool: &Pool,
    device: &str,
    priority: u32,
    classes: u8,
) -> PyResult<NodeLink> {
    let spec =
        memplug_node::LinkDevice { device: device.into(), pool: pool.inner.clone(), priority, classes };
    let link = py
        .allow_threads(move || {
            memplug_node::NodeLink::join(socket, vec![spec], memplug_node::LinkOptions::default())
        })
        .map_err(|e| errors::invalid(format!("could not join the node: {e}")))?;
    Ok(NodeLink { inner: Mutex::new(Some(link)) })
}

#[pymethods]
impl NodeLink {
    /// Whether an authority is connected now (the pool keeps what it holds
    /// while none is, and the link joins the next one).
    #[getter]
    fn connected(&self) -> PyResult<bool> {
        self.with(|l| l.connected())
    }
    /// The bytes budget moves in.
    #[getter]
    fn chunk(&self) -> PyResult<u64> {
        self.with(|l| l.chunk())
    }
    /// The authority's last refusal (who was asked and what they answered).
    #[getter]
    fn last_error(&self) -> PyResult<Option<String>> {
        self.with(|l| l.last_error())
    }
    /// This process's side of the books: a dict of `connected`, `chunk`,
    /// `held`, `used`, `leases_asked`, `leases_granted`, `leases_refused`,
    /// `bytes_leased`, `bytes_returned`, `tickets_answered`,
    /// `bytes_released`, `joins` (more than 1: an authority restarted and
    /// was rejoined).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let s = self.with(|l| l.stats())?;
        let d = pyo3::types::PyDict::new(py);
        d.set_item("connected", s.connected)?;
        for (k, v) in [
            ("chunk", s.chunk),
            ("held", s.held),
            ("used", s.used),
            ("leases_asked", s.leases_asked),
            ("leases_granted", s.leases_granted),
            ("leases_refused", s.leases_refused),
            ("bytes_leased", s.bytes_leased),
            ("bytes_returned", s.bytes_returned),
            ("tickets_answered", s.tickets_answered),
            ("bytes_released", s.bytes_released),
            ("joins", s.joins),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }
    /// The authority's books: JSON text (`prometheus=True`: Prometheus text).
    #[pyo3(signature = (prometheus=false))]
    fn status(&self, py: Python<'_>, prometheus: bool) -> PyResult<String> {
        let r = self.with(|l| py.allow_threads(|| l.status(prometheus, Duration::from_secs(5))))?;
        r.map_err(|e| errors::invalid(format!("no status from the node: {e}")))
    }
    /// Gives idle budget back and leaves.
    fn close(&self, py: Python<'_>) {
        let link = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
        py.allow_threads(move || drop(link));
    }
}

/// A node authority inside this process (as `memplug node serve`): leases
/// each device's capacity to the processes that join on `socket`.
#[pyclass(module = "memplug")]
pub struct NodeAuthority {
    inner: Mutex<Option<memplug_node::Authority>>,
}

#[pymethods]
impl NodeAuthority {
    /// `devices`: name → capacity in bytes; `chunk`: budget moves in
    /// multiples of it; `ticket_timeout`: seconds a member has to answer.
    #[new]
    #[pyo3(signature = (socket, devices, *, chunk=2 << 20, ticket_timeout=2.0, mode=0o600))]
    fn new(
        socket: PathBuf,
        devices: std::collections::BTreeMap<String, u64>,
        chunk: u64,
        ticket_timeout: f64,
        mode: u32,
    ) -> PyResult<Self> {
        let mut c = memplug_node::AuthorityConfig::new(socket, devices.into_iter().collect());
        c.chunk = chunk;
        c.mode = mode;
        c.ticket_timeout = Duration::try_from_secs_f64(ticket_timeout)
            .map_err(|e| errors::invalid(format!("ticket_timeout: {e}")))?;
        let a = memplug_node::Authority::start(c)
            .map_err(|e| errors::invalid(format!("could not serve: {e}")))?;
        Ok(NodeAuthority { inner: Mutex::new(Some(a)) })
    }
    /// The books as JSON text.
    fn status(&self) -> PyResult<String> {
        match self.inner.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(a) => Ok(a.status_json()),
            None => Err(errors::invalid("the authority was closed".into())),
        }
    }
    /// Stops serving (members keep what they hold and rejoin the next
    /// authority on the same socket).
    fn close(&self, py: Python<'_>) {
        let a = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
        py.allow_threads(move || drop(a));
    }
}
