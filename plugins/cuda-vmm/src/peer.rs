//! Peer access (ABI 1.2): opening a range of this device's memory to
//! another CUDA device, as tensor parallelism needs. `can_access_peer` is
//! `cuDeviceCanAccessPeer`; `set_peer_access` is `cuMemSetAccess` with the
//! peer's location over a range whose every granule is committed or mapped
//! (the driver sets access only on mapped memory). Published only with VMM
//! and more than one device.
//!
//! Write access is refused over shared mappings: a physical object mapped
//! read-only into several regions (a shared prompt prefix) would become
//! writable by the peer through any one of them. Revoking (`access` zero)
//! is `CU_MEM_ACCESS_FLAGS_PROT_NONE` for the peer; the owner's access is
//! never touched. As for a decommit, the caller orders the change after the
//! peer's work that still uses the range.

use crate::driver::{CUdevice, CUmemAccessDesc, CUDA_ERROR_NOT_SUPPORTED};
use crate::mechanism::{wrong_state, CudaMechanism};
use cudarc::driver::sys as cu;
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_ACCESS_READ, MEMPLUG_ACCESS_WRITE, MEMPLUG_DEVICE_CUDA};
use memplug_sdk::{ObjectRef, PeerAccess, PluginError, PluginResult, Status};

const RW: u32 = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;

impl CudaMechanism {
    /// The driver's handle of `peer`, a CUDA device other than this one.
    fn peer_device(&self, peer: MemplugDevice, call: &str) -> PluginResult<CUdevice> {
        if peer.kind != MEMPLUG_DEVICE_CUDA {
            return Err(PluginError::unsupported(format!(
                "{call}: device kind {} is not a CUDA device; CUDA VMM memory opens only to CUDA peers",
                peer.kind
            )));
        }
        if peer.ordinal == self.device.ordinal {
            return Err(PluginError::invalid_argument(format!(
                "{call}: cuda:{} is this mechanism's own device, not a peer (its access is set by commit and map)",
                peer.ordinal
            )));
        }
        let info = self.driver.devices.get(peer.ordinal as usize).ok_or_else(|| {
            PluginError::new(
                Status::WrongDevice,
                format!(
                    "{call}: there is no CUDA device {} ({} found)",
                    peer.ordinal,
                    self.driver.devices.len()
                ),
            )
        })?;
        Ok(info.device)
    }

    /// `cuDeviceCanAccessPeer(own, peer)`.
    fn peer_capable(&self, peer: CUdevice) -> PluginResult<bool> {
        let d = self.driver;
        let own = d.devices[self.device.ordinal as usize].device;
        let mut can = 0;
        // SAFETY: resolved entry point, out-pointer to a local.
        d.check(unsafe { (d.api.device_can_access_peer)(&mut can, own, peer) }, "cuDeviceCanAccessPeer")?;
        Ok(can != 0)
    }
}

impl PeerAccess for CudaMechanism {
    fn can_access_peer(&self, peer: MemplugDevice) -> PluginResult<u32> {
        let _slot = self.slot("can_access_peer")?;
        if peer.kind != MEMPLUG_DEVICE_CUDA {
            // An answer, not an error: no access for a non-CUDA device.
            return Ok(0);
        }
        if peer.ordinal == self.device.ordinal {
            // The device itself: its memory is its own.
            return Ok(RW);
        }
        let dev = self.peer_device(peer, "can_access_peer")?;
        Ok(if self.peer_capable(dev)? { RW } else { 0 })
    }

    fn set_peer_access(
        &self,
        reservation: &ObjectRef,
        offset: u64,
        len: u64,
        peer: MemplugDevice,
        access: u32,
    ) -> PluginResult<()> {
        let _slot = self.slot("set_peer_access")?;
        let vmm = self.vmm("set_peer_access")?;
        let flags = match access {
            0 => cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE,
            MEMPLUG_ACCESS_READ => cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ,
            RW => cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            other => {
                return Err(PluginError::invalid_argument(format!(
                    "set_peer_access: access {other:#x} is not 0, READ or READ|WRITE"
                )))
            }
        };
        let res = self.find_reservation(reservation)?;
        // The range is judged before the peer, so a bad range is
        // OUT_OF_RANGE whoever it is for; the peer's capability is the
        // driver's answer, asked with no lock held.
        let end = self.check_range(offset, len, res.size, "set_peer_access")?;
        let dev = self.peer_device(peer, "set_peer_access")?;
        if !self.peer_capable(dev)? {
            return Err(PluginError::unsupported(format!(
                "set_peer_access: cuDeviceCanAccessPeer says cuda:{} cannot access cuda:{}",
                peer.ordinal, self.device.ordinal
            )));
        }
        {
            let mut st = res.lock(self, reservation)?;
            st.check_not_busy("set_peer_access", offset, end)?;
            let g = self.granularity;
            let mut at = offset;
            while at < end {
                if st.committed.contains_key(&at) {
                    at += g;
                } else if let Some((&start, m)) =
                    st.mappings.range(..=at).next_back().filter(|(&s, m)| s + m.len > at)
                {
                    if access & MEMPLUG_ACCESS_WRITE != 0 {
                        return Err(PluginError::invalid_argument(format!(
                            "set_peer_access: [{offset:#x}, {end:#x}) includes the shared mapping at {start:#x}: \
                             write access for a peer is not given over shared memory (read access is)"
                        )));
                    }
                    at = start + m.len;
                } else {
                    return Err(wrong_state(format!(
                        "set_peer_access: granule {at:#x} of [{offset:#x}, {end:#x}) is neither committed nor mapped"
                    )));
                }
            }
            // Checked before the driver is asked, so a refusal changes
            // nothing; the range is busy while the lock is let go.
            st.busy.insert(offset, len);
        }
        let desc = CUmemAccessDesc {
            location: cu::CUmemLocation {
                type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: dev,
            },
            flags,
        };
        let d = self.driver;
        let set = res.pin.enter().and_then(|_e| {
            // SAFETY: the range is mapped (checked above) in a reservation
            // of this mechanism, marked busy; `desc` lives for the call.
            let r = unsafe { (vmm.set_access)(res.addr + offset, len as usize, &desc, 1) };
            if r == CUDA_ERROR_NOT_SUPPORTED {
                return Err(PluginError::unsupported(format!(
                    "set_peer_access: the driver refuses this access for cuda:{} (cuMemSetAccess: {})",
                    peer.ordinal,
                    d.error_name(r)
                )));
            }
            d.check(r, "cuMemSetAccess")
        });
        res.state().busy.remove(&offset);
        set
    }
}
