//! The loader's judgement of what ABI 1.2 adds to a plugin's tables: the
//! device identity, the memory descriptor, typed export, peer access,
//! queue-ordered binding and the 1.2 sync slots. Each is read only at an
//! agreed minor of at least 2, and a capability bit or slot of 1.2 claimed
//! below it is a contradiction the loader refuses (a reader of an older
//! minor would not know it, this one does).

use super::Reader;
use crate::error::LoadError;
use crate::mechanism::{Capabilities, Descriptor, DeviceIdentity, Location};
use memplug_sdk::abi::*;
use memplug_sdk::facts::Need;

impl Reader<'_> {
    /// The device identity a 1.2 mechanism may publish (read as a prefix;
    /// a plugin of an older minor has none, whatever it wrote there).
    pub(super) unsafe fn identity(
        &self,
        d: &MemplugMechanism,
        name: &str,
    ) -> Result<Option<DeviceIdentity>, LoadError> {
        if self.minor < 2 || d.identity.is_null() {
            return Ok(None);
        }
        let id: DeviceIdentity = self.prefix(
            d.identity,
            MEMPLUG_DEVICE_IDENTITY_SIZE_1_2,
            &format!("mechanism '{name}' identity"),
        )?;
        // Bits of a later minor are that minor's business: keep what is
        // known, drop the rest.
        Ok(Some(DeviceIdentity { valid: id.valid & memplug_sdk::descriptor::IDENTITY_BITS, ..id }))
    }

    /// The 1.2 tail of a shared mapping table (`export_handle`,
    /// `import_handle`), as [`shared_export`](Self::shared_export) does for
    /// 1.1's: kept only at an agreed minor of at least 2 with
    /// `MEMPLUG_CAP_TYPED_EXPORT` claimed and a table long enough, then
    /// required; cleared otherwise (a plugin that publishes them without
    /// the flag in a long table contradicts itself and is refused).
    pub(super) unsafe fn typed_export(
        &self,
        v: &mut MemplugSharedMapping,
        caps: Capabilities,
        name: &str,
    ) -> Result<(), LoadError> {
        let mismatch = |detail: String| self.contradiction(name, detail);
        if caps.typed_export() {
            if self.minor < 2 {
                return Err(self.above_minor(name, "MEMPLUG_CAP_TYPED_EXPORT"));
            }
            if v.struct_size < MEMPLUG_SHARED_MAPPING_SIZE_1_2 {
                return Err(mismatch(format!(
                    "MEMPLUG_CAP_TYPED_EXPORT is set but the shared_mapping table is {} bytes, too short for the \
                     1.2 export_handle/import_handle slots ({} bytes)",
                    v.struct_size, MEMPLUG_SHARED_MAPPING_SIZE_1_2
                )));
            }
            return self.required(v, Need::WithCapability(MEMPLUG_CAP_TYPED_EXPORT), name);
        }
        let published = v.export_handle.is_some() || v.import_handle.is_some();
        if self.minor >= 2 && published && v.struct_size >= MEMPLUG_SHARED_MAPPING_SIZE_1_2 {
            return Err(mismatch(
                "the shared_mapping export_handle/import_handle slots are set but MEMPLUG_CAP_TYPED_EXPORT is not"
                    .into(),
            ));
        }
        v.export_handle = None;
        v.import_handle = None;
        Ok(())
    }

    /// The 1.2 memory descriptor of the properties, judged: a recommended
    /// granularity is zero or a power-of-two multiple of the granularity;
    /// page sizes, attributes and export kinds of a later minor are kept
    /// as bits (a reader ignores what it does not know). Nothing below
    /// 1.2 (the host asked for the 1.0 prefix then).
    pub(super) fn descriptor(&self, out: &MemplugProperties, minor: u32) -> Result<Descriptor, String> {
        if minor < 2 {
            return Ok(Descriptor::default());
        }
        let r = out.recommended_granularity;
        let g = out.granularity.max(1);
        if r != 0 && (!r.is_power_of_two() || r % g != 0) {
            return Err(format!(
                "recommended_granularity {r:#x} is not a power-of-two multiple of the granularity {g:#x}"
            ));
        }
        Ok(Descriptor {
            recommended_granularity: r,
            page_sizes: out.page_sizes,
            attributes: out.attributes,
            export_types: out.export_types,
            location: Location { kind: out.location_kind, id: out.location_id },
            maps_at_offsets: out.flags & MEMPLUG_PROP_MAPS_AT_OFFSETS != 0,
        })
    }

    fn contradiction(&self, name: &str, detail: String) -> LoadError {
        LoadError::CapabilityMismatch { origin: self.origin.into(), mechanism: name.to_string(), detail }
    }

    /// A bit of 1.2 claimed at a lower agreed minor.
    fn above_minor(&self, name: &str, flag: &str) -> LoadError {
        self.contradiction(
            name,
            format!("{flag} is a capability above the agreed minor: it is defined by ABI 1.2 and the plugin agreed on 1.{}", self.minor),
        )
    }

    /// The peer access table (`MEMPLUG_CAP_PEER_ACCESS`): flag and pointer
    /// agree, the table is read as a prefix and its slots are required.
    /// Nothing below 1.2.
    pub(super) unsafe fn peer_access(
        &self,
        d: &MemplugMechanism,
        caps: Capabilities,
        name: &str,
    ) -> Result<Option<MemplugPeerAccess>, LoadError> {
        if self.minor < 2 {
            if caps.peer_access() {
                return Err(self.above_minor(name, "MEMPLUG_CAP_PEER_ACCESS"));
            }
            return Ok(None);
        }
        super::agree(caps.peer_access(), !d.peer_access.is_null(), "MEMPLUG_CAP_PEER_ACCESS", "peer_access")
            .map_err(|detail| self.contradiction(name, detail))?;
        if !caps.peer_access() {
            return Ok(None);
        }
        let t: MemplugPeerAccess = self.prefix(
            d.peer_access,
            MEMPLUG_PEER_ACCESS_SIZE_1_2,
            &format!("mechanism '{name}' peer_access"),
        )?;
        self.required(&t, Need::Required, name)?;
        Ok(Some(t))
    }

    /// Queue-ordered binding (`MEMPLUG_CAP_QUEUED_BINDING`): at 1.2, with
    /// virtual backing and sync, tables long enough, and the slots of every
    /// table present (the shared mapping's too, when it has one); cleared
    /// otherwise, and refused where the plugin contradicts itself.
    pub(super) fn queued_binding(
        &self,
        vb: &mut Option<MemplugVirtualBacking>,
        sm: &mut Option<MemplugSharedMapping>,
        caps: Capabilities,
        name: &str,
    ) -> Result<(), LoadError> {
        let flag = "MEMPLUG_CAP_QUEUED_BINDING";
        if !caps.queued_binding() || self.minor < 2 {
            if caps.queued_binding() {
                return Err(self.above_minor(name, flag));
            }
            if let Some(v) = vb {
                (v.commit_on, v.decommit_on) = (None, None);
            }
            if let Some(m) = sm {
                (m.map_on, m.unmap_on) = (None, None);
            }
            return Ok(());
        }
        if !caps.virtual_backing() || !caps.sync() {
            return Err(self.contradiction(
                name,
                format!("{flag} needs MEMPLUG_CAP_VIRTUAL_BACKING and MEMPLUG_CAP_SYNC"),
            ));
        }
        let v = vb.as_ref().expect("virtual backing checked above");
        if v.struct_size < MEMPLUG_VIRTUAL_BACKING_SIZE_1_2 {
            return Err(self.contradiction(
                name,
                format!("{flag} is set but the virtual_backing table is {} bytes, too short for commit_on/decommit_on ({MEMPLUG_VIRTUAL_BACKING_SIZE_1_2})", v.struct_size),
            ));
        }
        self.required(v, Need::WithCapability(MEMPLUG_CAP_QUEUED_BINDING), name)?;
        if let Some(m) = sm {
            if m.struct_size < MEMPLUG_SHARED_MAPPING_SIZE_1_2 {
                return Err(self.contradiction(
                    name,
                    format!("{flag} is set but the shared_mapping table is {} bytes, too short for map_on/unmap_on ({MEMPLUG_SHARED_MAPPING_SIZE_1_2})", m.struct_size),
                ));
            }
            self.required(m, Need::WithCapability(MEMPLUG_CAP_QUEUED_BINDING), name)?;
        }
        Ok(())
    }

    /// The 1.2 sync slots (`stream_wait_fence`, `stream_adopt_typed`),
    /// optional: kept at 1.2, cleared below (a plugin of 1.1 that fills
    /// them is used as 1.1); 1.3's `copy` likewise only at 1.3.
    pub(super) fn sync_tail(&self, y: &mut MemplugSync) {
        if self.minor < 2 {
            (y.stream_wait_fence, y.stream_adopt_typed) = (None, None);
        }
        if self.minor < 3 {
            y.copy = None;
        }
    }
}
