//! One error type for every call of the crate; each says what to do next.

use memplug_host::binding::BindingError;
use std::time::Duration;

/// What went wrong moving memory through UCX.
#[derive(Debug, thiserror::Error)]
pub enum UcxError {
    /// `libucp.so.0` could not be loaded or is too old (the message says
    /// how to install it).
    #[error("{0}")]
    Unavailable(String),
    /// A UCP call refused: the call, UCX's status and its text.
    #[error("{op} failed: {message} (UCX status {status})")]
    Ucx {
        /// The UCP function.
        op: &'static str,
        /// `ucs_status_t`.
        status: i8,
        /// `ucs_status_string`.
        message: String,
    },
    /// A wait reached its deadline; what was waited for is in `what`.
    #[error("{what}: not done within {after:?}")]
    Timeout {
        /// The operation.
        what: String,
        /// The time allowed.
        after: Duration,
    },
    /// The peer process or its endpoint is gone (closed control socket,
    /// endpoint error); transfers in flight were cancelled.
    #[error("peer lost: {0}")]
    PeerLost(String),
    /// A remote range that was released by this side or revoked by its
    /// owner (deregistered): its remote key is no longer usable.
    #[error("remote range {id} is no longer registered: {why}")]
    Revoked {
        /// The range's id on the wire.
        id: u64,
        /// Released here, or revoked by the owner.
        why: &'static str,
    },
    /// The range is still in use (held by a peer, or a transfer in flight):
    /// retry after it is released or revoked.
    #[error("busy: {0}")]
    Busy(String),
    /// The host refused (the budget: [`UcxError::is_out_of_budget`]; a
    /// region's state).
    #[error(transparent)]
    Binding(#[from] BindingError),
    /// Bad input: out of range, a read-only range written, a zero length.
    #[error("{0}")]
    Invalid(String),
    /// The control socket failed.
    #[error("control socket: {0}")]
    Io(#[from] std::io::Error),
    /// The peer sent something this side does not understand.
    #[error("protocol: {0}")]
    Protocol(String),
}

impl UcxError {
    /// Whether the host's governor refused the charge (`OutOfBudget`).
    pub fn is_out_of_budget(&self) -> bool {
        matches!(self, UcxError::Binding(BindingError::Budget(_)))
    }
}

/// `Ok` for `UCS_OK`, otherwise the error of `op`.
pub(crate) fn check(op: &'static str, status: i8) -> Result<(), UcxError> {
    if status == crate::sys::UCS_OK {
        return Ok(());
    }
    Err(ucx_error(op, status))
}

pub(crate) fn ucx_error(op: &'static str, status: i8) -> UcxError {
    let message = crate::sys::Ucp::get().map(|u| u.describe(status)).unwrap_or_default();
    UcxError::Ucx { op, status, message }
}
