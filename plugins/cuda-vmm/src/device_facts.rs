//! What the driver says of a device beyond its name and granularity, read
//! once at load: its UUID, PCI address and nearest NUMA node (ABI 1.2's
//! device identity), the granularity it recommends, and which devices it
//! can open its memory to (peer access). Every query that fails leaves its
//! fact unknown rather than guessed: an identity field is published only
//! when the driver answered it.

use crate::driver::{CUdevice, Driver, CUDA_SUCCESS, GRANULARITY_RECOMMENDED};
use memplug_sdk::abi;
use memplug_sdk::DeviceIdentity;
use std::ffi::c_uint;

/// `CU_DEVICE_ATTRIBUTE_PCI_BUS_ID`.
const ATTR_PCI_BUS_ID: c_uint = 33;
/// `CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID`.
const ATTR_PCI_DEVICE_ID: c_uint = 34;
/// `CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID`.
const ATTR_PCI_DOMAIN_ID: c_uint = 50;
/// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`.
const ATTR_RDMA_WITH_VMM: c_uint = 110;
/// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED` (cuMemAlloc memory).
const ATTR_RDMA: c_uint = 116;

/// The facts of one device.
#[derive(Clone, Debug, Default)]
pub struct DeviceFacts {
    /// `cuDeviceGetUuid`.
    pub uuid: Option<[u8; 16]>,
    /// PCI domain, bus and device (the function of a GPU is 0).
    pub pci: Option<(u32, u32, u32)>,
    /// `numa_node` of the device in sysfs, when the kernel knows it.
    pub numa_node: Option<u32>,
    /// `CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`, when VMM is supported and
    /// the driver answers a power of two.
    pub recommended_granularity: Option<u64>,
    /// GPUDirect RDMA for every kind of memory the mechanism makes: plain
    /// allocations (`GPU_DIRECT_RDMA_SUPPORTED`) and VMM physical memory
    /// (`GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`), which is then made with
    /// `gpuDirectRDMACapable` so a NIC can register it.
    pub rdma_with_vmm: bool,
}

impl DeviceFacts {
    /// Asks the driver (and sysfs) about `device`.
    pub(crate) fn probe(d: &Driver, device: CUdevice, vmm: bool) -> DeviceFacts {
        let api = d.api;
        let mut uuid = [0u8; 16];
        // SAFETY: resolved entry point; the out-pointer is 16 bytes, the
        // size of CUuuid.
        let uuid = (unsafe { (api.device_get_uuid)(&mut uuid, device) } == CUDA_SUCCESS).then_some(uuid);
        let attr = |a: c_uint| {
            let mut v = 0;
            // SAFETY: resolved entry point, out-pointer to a local.
            let r = unsafe { (api.device_get_attribute)(&mut v, a, device) };
            (r == CUDA_SUCCESS).then(|| u32::try_from(v).ok()).flatten()
        };
        let pci = match (attr(ATTR_PCI_DOMAIN_ID), attr(ATTR_PCI_BUS_ID), attr(ATTR_PCI_DEVICE_ID)) {
            (Some(domain), Some(bus), Some(dev)) => Some((domain, bus, dev)),
            _ => None,
        };
        let numa_node = pci.and_then(|(domain, bus, dev)| {
            let path = format!("/sys/bus/pci/devices/{domain:04x}:{bus:02x}:{dev:02x}.0/numa_node");
            // -1: the kernel does not know.
            std::fs::read_to_string(path).ok()?.trim().parse::<i64>().ok().and_then(|n| u32::try_from(n).ok())
        });
        let rdma_with_vmm = vmm && attr(ATTR_RDMA_WITH_VMM) == Some(1) && attr(ATTR_RDMA) == Some(1);
        let recommended_granularity = d
            .vmm
            .filter(|_| vmm)
            .and_then(|v| d.granularity(v, device, GRANULARITY_RECOMMENDED, rdma_with_vmm));
        DeviceFacts { uuid, pci, numa_node, recommended_granularity, rdma_with_vmm }
    }

    /// The identity a mechanism publishes: only what the driver answered.
    pub fn identity(&self) -> DeviceIdentity {
        let mut id = DeviceIdentity::default();
        if let Some(uuid) = self.uuid {
            id.valid |= abi::MEMPLUG_IDENTITY_UUID;
            id.uuid = uuid;
        }
        if let Some((domain, bus, device)) = self.pci {
            id.valid |= abi::MEMPLUG_IDENTITY_PCI;
            (id.pci_domain, id.pci_bus, id.pci_device, id.pci_function) = (domain, bus, device, 0);
        }
        if let Some(node) = self.numa_node {
            id.valid |= abi::MEMPLUG_IDENTITY_NUMA_NODE;
            id.numa_node = node;
        }
        id
    }
}

impl crate::mechanism::CudaMechanism {
    /// The properties every `cuMemCreate` of this mechanism uses: pinned
    /// device memory, RDMA-capable where the device supports it.
    pub(crate) fn create_prop(&self) -> crate::driver::CUmemAllocationProp {
        let info = &self.driver.devices[self.device.ordinal as usize];
        let mut prop = crate::driver::allocation_prop(info.device);
        if info.facts.rdma_with_vmm {
            prop.allocFlags.gpuDirectRDMACapable = 1;
        }
        prop
    }
}
