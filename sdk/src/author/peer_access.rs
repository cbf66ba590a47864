//! Optional capability (ABI 1.2): whether and how a device reaches another
//! device's memory (`PeerAccess`, `Access`).

use super::*;
use crate::abi::{self, MemplugDevice};

/// Optional capability (ABI 1.2, `MEMPLUG_CAP_PEER_ACCESS`): giving other
/// devices access to this mechanism's memory. The SDK checks the
/// reservation reference and the range as for `commit`, and the access
/// bits (`INVALID_ARGUMENT` for unknown bits); the peer device is yours to
/// judge.
pub trait PeerAccess: Send + Sync + 'static {
    /// `MEMPLUG_ACCESS_*` bits `peer` can be given (zero: none).
    fn can_access_peer(&self, peer: MemplugDevice) -> PluginResult<u32>;
    /// Sets what `peer` may do with the range (`access` zero revokes).
    fn set_peer_access(
        &self,
        reservation: &ObjectRef,
        offset: u64,
        len: u64,
        peer: MemplugDevice,
        access: u32,
    ) -> PluginResult<()>;
}

/// Access of a shared mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `MEMPLUG_ACCESS_READ`: writes through the mapping fault.
    ReadOnly,
    /// `MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE`.
    ReadWrite,
}

impl Access {
    /// Decodes `MEMPLUG_ACCESS_*` bits; anything but read or read|write is
    /// refused rather than guessed at.
    pub fn from_bits(bits: u32) -> Option<Access> {
        match bits {
            abi::MEMPLUG_ACCESS_READ => Some(Access::ReadOnly),
            b if b == abi::MEMPLUG_ACCESS_READ | abi::MEMPLUG_ACCESS_WRITE => Some(Access::ReadWrite),
            _ => None,
        }
    }
    /// The `MEMPLUG_ACCESS_*` bits.
    pub fn bits(self) -> u32 {
        match self {
            Access::ReadOnly => abi::MEMPLUG_ACCESS_READ,
            Access::ReadWrite => abi::MEMPLUG_ACCESS_READ | abi::MEMPLUG_ACCESS_WRITE,
        }
    }
}
