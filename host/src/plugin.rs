//! Loading a plugin: open the library (or take an in-process entry), run
//! two-sided negotiation, read every struct as an untrusted prefix, and
//! refuse — with a message naming the problem — anything malformed.

use crate::error::{LoadError, ObjectKind};
use crate::mechanism::{Capabilities, Mechanism, MechanismInner, Properties};
use crate::reentry::InPluginCall;
use crate::services::{ServiceStats, ServicesInbox};
use crate::sink::Capture;
use memplug_sdk::abi::*;
use memplug_sdk::facts::{self, Need, Vtable};
use memplug_sdk::prefix::{self, PrefixError, Prefixed, StringError, MAX_NAME};
use memplug_sdk::Status;
use std::collections::HashSet;
use std::ffi::c_char;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// Entry symbols this host knows, newest major first.
pub const ENTRY_SYMBOLS: &[&str] = &[MEMPLUG_ENTRY_SYMBOL_V1];

pub use crate::load_options::{LoadOptions, HOST_MAX_MINOR, HOST_MIN_MINOR};

mod v1_2;
mod v1_3;

use crate::library::LoadedLibrary as PluginShared;

/// A loaded, validated plugin. Its mechanisms are cheap handles that keep
/// the library loaded. Thread-safe.
pub struct Plugin {
    shared: Arc<PluginShared>,
    agreed_minor: u32,
    plugin_minors: (u32, u32),
    mechanisms: Vec<Mechanism>,
}

impl Plugin {
    /// Sends this plugin's messages to `hub` (the registry that took it).
    pub(crate) fn attach_hub(&self, hub: &Arc<crate::events::Hub>) {
        self.shared.hub.attach(hub);
    }
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.shared.name)
            .field("version", &self.shared.version)
            .field("abi", &format_args!("1.{}", self.agreed_minor))
            .field("mechanisms", &self.mechanisms)
            .finish()
    }
}

/// What keeps a plugin from unloading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveReport {
    /// `(mechanism, kind, count)` for every non-zero host-side count.
    pub objects: Vec<(String, ObjectKind, u64)>,
    /// Mechanism handles held outside the plugin, per mechanism.
    pub handles: Vec<(String, usize)>,
    /// What the plugin itself reports.
    pub plugin_reported: u64,
}

impl LiveReport {
    /// Whether nothing holds the plugin: no object counted by the host, no
    /// mechanism handle outside it, and the plugin reports none of its own.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty() && self.handles.is_empty() && self.plugin_reported == 0
    }
}

impl fmt::Display for LiveReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> =
            self.objects.iter().map(|(m, k, n)| format!("{n} {} of mechanism '{m}'", k.name())).collect();
        parts.extend(self.handles.iter().map(|(m, n)| format!("{n} handle(s) to mechanism '{m}'")));
        if self.plugin_reported != 0 {
            parts.push(format!("the plugin reports {} live object(s)", self.plugin_reported));
        }
        f.write_str(&parts.join(", "))
    }
}

/// `Plugin::unload` refused: the plugin comes back, still loaded.
#[derive(thiserror::Error)]
#[error("plugin {} cannot unload: still live: {report}", plugin.shared.name)]
pub struct UnloadRefused {
    /// The plugin, loaded and usable as before.
    pub plugin: Plugin,
    /// What was live when the unload was refused.
    pub report: LiveReport,
}

impl fmt::Debug for UnloadRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl Plugin {
    /// Loads a plugin library by path with the default options.
    pub fn load(path: impl AsRef<Path>) -> Result<Plugin, LoadError> {
        Self::load_with(path, &LoadOptions::default())
    }

    /// Loads a plugin library by path: absolute, or relative with a `/`
    /// (`./libx.so`); a bare file name is refused, never searched for. The
    /// file is opened once, the loading policy runs on that descriptor,
    /// and that descriptor is what gets loaded ([`crate::policy`]).
    ///
    /// ```
    /// use memplug_host::{LoadError, LoadOptions, Plugin};
    ///
    /// // A bare name would be looked up in LD_LIBRARY_PATH and the loader's
    /// // cache: refused before anything is opened.
    /// let bare = Plugin::load_with("libmemplug_plugin_cpu.so", &LoadOptions::default());
    /// assert!(matches!(bare, Err(LoadError::Policy { .. })));
    ///
    /// let missing = Plugin::load_with("./no-such-plugin.so", &LoadOptions::default());
    /// assert!(matches!(missing, Err(LoadError::NotFound(_))));
    /// ```
    pub fn load_with(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<Plugin, LoadError> {
        let path = path.as_ref();
        let checked = crate::policy::open_checked(path, opts)?;
        let lib = open_library(&checked)?;
        drop(checked);
        let mut found = None;
        for sym in ENTRY_SYMBOLS {
            // SAFETY: the symbol's type is fixed by the ABI for this name.
            if let Ok(f) = unsafe { lib.library().get::<MemplugEntryV1>(sym.as_bytes()) } {
                found = Some(*f);
                break;
            }
        }
        let Some(entry) = found else {
            return Err(LoadError::MissingEntrySymbol {
                path: path.to_path_buf(),
                symbols: ENTRY_SYMBOLS.to_vec(),
            });
        };
        // SAFETY: `entry` comes from `lib`, which moves into the plugin.
        unsafe { Self::negotiate(entry, path.display().to_string(), Some(lib), opts) }
    }

    /// Takes a plugin linked into this process, through the same checks as
    /// a library.
    ///
    /// ```
    /// use memplug_host::{LoadOptions, Plugin};
    ///
    /// // SAFETY: the reference CPU plugin's entry, built against this ABI.
    /// let cpu = unsafe {
    ///     Plugin::from_entry(memplug_plugin_cpu::cpu_plugin_entry, "cpu", &LoadOptions::default())
    /// }?;
    /// assert_eq!(cpu.abi_version(), (1, memplug_host::HOST_MAX_MINOR));
    /// assert!(cpu.origin().ends_with("(in-process)"));
    /// let m = cpu.mechanism("cpu").expect("the CPU plugin's first mechanism");
    /// assert!(m.capabilities().virtual_backing());
    /// cpu.unload().expect("nothing of it is alive");
    /// # Ok::<(), memplug_host::LoadError>(())
    /// ```
    ///
    /// # Safety
    /// `entry` must follow the `memplug_plugin_v1` contract as far as memory
    /// safety goes (the host validates everything it can check).
    pub unsafe fn from_entry(
        entry: MemplugEntryV1,
        label: &str,
        opts: &LoadOptions,
    ) -> Result<Plugin, LoadError> {
        Self::negotiate(entry, Self::in_process_origin(label), None, opts)
    }

    /// The [`origin`](Self::origin) of an in-process entry of `label`: how
    /// reports name a plugin that has no library file.
    pub fn in_process_origin(label: &str) -> String {
        format!("{label} (in-process)")
    }

    unsafe fn negotiate(
        entry: MemplugEntryV1,
        origin: String,
        library: Option<crate::policy::OpenLibrary>,
        opts: &LoadOptions,
    ) -> Result<Plugin, LoadError> {
        // A refused load drops (closes) its services: the table stays valid
        // and refuses every report.
        let services = ServicesInbox::open();
        let loaded = Self::negotiate_with(entry, origin, library, opts, services)?;
        let routes = loaded
            .mechanisms
            .iter()
            .map(|m| {
                let w: std::sync::Weak<dyn crate::lifecycle::LossReceiver> = Arc::downgrade(&m.inner) as _;
                (m.id(), w)
            })
            .collect();
        loaded.shared.services.publish(loaded.agreed_minor, routes);
        Ok(loaded)
    }

    unsafe fn negotiate_with(
        entry: MemplugEntryV1,
        origin: String,
        library: Option<crate::policy::OpenLibrary>,
        opts: &LoadOptions,
        services: ServicesInbox,
    ) -> Result<Plugin, LoadError> {
        let host = MemplugHostInfo {
            struct_size: core::mem::size_of::<MemplugHostInfo>() as u32,
            abi_major: MEMPLUG_ABI_MAJOR,
            min_minor: opts.min_minor,
            max_minor: opts.max_minor.min(HOST_MAX_MINOR),
            host_name: c"memplug-host".as_ptr(),
            services: services.table(),
        };
        let mut out = MemplugNegotiation {
            struct_size: core::mem::size_of::<MemplugNegotiation>() as u32,
            agreed_minor: u32::MAX,
            plugin: core::ptr::null(),
        };
        let mut cap = Capture::default();
        let raw = {
            // A sink for this call only (crate::sink).
            let (_inside, _, sink) = InPluginCall::enter_call();
            let call = sink.begin();
            let raw = entry(&host, &mut out, call.abi());
            call.finish(&mut cap);
            raw
        };
        if raw != MEMPLUG_STATUS_OK {
            let message = cap.take().unwrap_or_else(|| "the plugin gave no message".into());
            if raw == MEMPLUG_STATUS_VERSION_MISMATCH {
                return Err(LoadError::VersionMismatch { origin, message });
            }
            let status = Status::from_raw_conservative(raw);
            return Err(LoadError::EntryFailed { origin, status, raw, message });
        }
        let r = Reader { origin: &origin, minor: u32::MAX, check_overlaps: opts.check_overlaps };
        let desc: MemplugPlugin = r.prefix(out.plugin, MEMPLUG_PLUGIN_SIZE_1_0, "plugin descriptor")?;
        if desc.abi_major != MEMPLUG_ABI_MAJOR {
            return Err(r.malformed(format!(
                "plugin descriptor says ABI major {}, but it was found through the major-1 entry",
                desc.abi_major
            )));
        }
        if desc.min_minor > desc.max_minor {
            return Err(r.malformed(format!(
                "plugin minor range 1.{}..=1.{} is empty",
                desc.min_minor, desc.max_minor
            )));
        }
        let lo = opts.min_minor.max(desc.min_minor);
        let hi = opts.max_minor.min(HOST_MAX_MINOR).min(desc.max_minor);
        if lo > hi {
            return Err(LoadError::VersionMismatch {
                origin,
                message: format!(
                    "host speaks 1.{}..=1.{}, plugin speaks 1.{}..=1.{}",
                    opts.min_minor, opts.max_minor, desc.min_minor, desc.max_minor
                ),
            });
        }
        if out.agreed_minor < lo || out.agreed_minor > hi {
            return Err(r.malformed(format!(
                "plugin agreed on minor {} outside the common range 1.{lo}..=1.{hi}",
                out.agreed_minor
            )));
        }
        // From here on the agreed minor is known and within both ranges.
        let r = Reader { origin: &origin, minor: out.agreed_minor, check_overlaps: opts.check_overlaps };
        let name = r.string(desc.name, "plugin name")?;
        let version = r.string(desc.version, "plugin version")?;
        let Some(live_objects) = desc.live_objects else {
            return Err(LoadError::NullRequired { origin, what: "plugin.live_objects".into() });
        };
        if desc.mechanism_count == 0 {
            return Err(r.malformed("plugin publishes no mechanism".into()));
        }
        if desc.mechanisms.is_null() {
            return Err(LoadError::NullRequired { origin, what: "plugin.mechanisms".into() });
        }
        // SAFETY: both slots come from the descriptor whose `ctx` this is,
        // and `library` (if any) is where their code lives.
        let shared = Arc::new(PluginShared::new(
            name.clone(),
            version,
            origin.clone(),
            desc.ctx,
            live_objects,
            desc.unload,
            library,
            services,
        ));
        let mut ids = HashSet::new();
        let mut names = HashSet::new();
        // Grown as entries validate: the count is the plugin's claim, and a
        // huge one must be refused at the first bad entry, not allocated.
        let mut mechanisms = Vec::new();
        for i in 0..desc.mechanism_count as usize {
            let p = *desc.mechanisms.add(i);
            let m = r.mechanism(i, p, &shared)?;
            if !ids.insert(m.id()) {
                return Err(r.malformed(format!("two mechanisms share id {}", m.id())));
            }
            if !names.insert(m.name().to_string()) {
                return Err(r.malformed(format!("two mechanisms share the name '{}'", m.name())));
            }
            mechanisms.push(m);
        }
        Ok(Plugin {
            shared,
            agreed_minor: out.agreed_minor,
            plugin_minors: (desc.min_minor, desc.max_minor),
            mechanisms,
        })
    }

    /// The plugin's name as it published it (escaped: safe to print); a
    /// [`Registry`](crate::Registry) holds one plugin per name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }
    /// The plugin's version string, as it published it (escaped). Free
    /// text: the host compares nothing by it.
    pub fn version(&self) -> &str {
        &self.shared.version
    }
    /// Where it came from: a path, or a label for in-process entries.
    pub fn origin(&self) -> &str {
        &self.shared.origin
    }
    /// The agreed ABI version `(major, minor)`.
    pub fn abi_version(&self) -> (u32, u32) {
        (MEMPLUG_ABI_MAJOR, self.agreed_minor)
    }
    /// The minor range the plugin declared.
    pub fn plugin_minor_range(&self) -> (u32, u32) {
        self.plugin_minors
    }
    /// Its mechanisms, in the order the plugin published them.
    pub fn mechanisms(&self) -> &[Mechanism] {
        &self.mechanisms
    }
    /// The mechanism of this name, if the plugin published one.
    pub fn mechanism(&self, name: &str) -> Option<&Mechanism> {
        self.mechanisms.iter().find(|m| m.name() == name)
    }
    /// What the plugin's loss reports (ABI 1.2 services) came to.
    pub fn service_stats(&self) -> ServiceStats {
        self.shared.services.stats()
    }

    /// What the plugin reports holding alive.
    pub fn plugin_live_objects(&self) -> u64 {
        self.shared.plugin_live_objects()
    }

    /// Everything that keeps the plugin loaded now.
    pub fn live_report(&self) -> LiveReport {
        let mut objects = Vec::new();
        let mut handles = Vec::new();
        for m in &self.mechanisms {
            for k in ObjectKind::ALL {
                let n = m.live(k);
                if n != 0 {
                    objects.push((m.name().to_string(), k, n));
                }
            }
            let extra = m.handles_elsewhere();
            if extra != 0 {
                handles.push((m.name().to_string(), extra));
            }
        }
        LiveReport { objects, handles, plugin_reported: self.plugin_live_objects() }
    }

    /// Unloads the plugin, or refuses and says what is still live: objects
    /// the host gave out and has not seen released, mechanism handles held
    /// elsewhere, or objects the plugin itself reports.
    pub fn unload(self) -> Result<(), Box<UnloadRefused>> {
        let report = self.live_report();
        if !report.is_empty() {
            return Err(Box::new(UnloadRefused { plugin: self, report }));
        }
        // Dropping the last mechanism handle and the plugin drops the shared
        // part, which calls `unload` and closes the library.
        drop(self);
        Ok(())
    }
}

fn open_library(checked: &crate::policy::CheckedFile) -> Result<crate::policy::OpenLibrary, LoadError> {
    // SAFETY: loading runs the library's initialisers; that is what loading
    // a plugin means, and the path was chosen by the embedder.
    unsafe { checked.dlopen() }
}

/// Reads untrusted plugin structs.
struct Reader<'a> {
    origin: &'a str,
    /// The agreed minor (checked against both ranges before any mechanism
    /// is read).
    minor: u32,
    /// `LoadOptions::check_overlaps`, for each mechanism.
    check_overlaps: crate::load_options::OverlapCheck,
}

impl Reader<'_> {
    fn malformed(&self, detail: String) -> LoadError {
        LoadError::Malformed { origin: self.origin.to_string(), detail }
    }

    /// Reads a plugin struct through the SDK's prefix reader
    /// ([`prefix::read`]): `min(struct_size, sizeof T)` bytes into a zeroed
    /// `T`; refuses NULL and a struct shorter than its 1.0 size. `min` is
    /// that size as the caller names it (`T::SIZE_1_0`).
    unsafe fn prefix<T: Prefixed>(&self, p: *const T, min: u32, what: &str) -> Result<T, LoadError> {
        debug_assert_eq!(min, T::SIZE_1_0, "{what}: the 1.0 size of the struct");
        prefix::read(p).map_err(|e| match e {
            PrefixError::Null => LoadError::NullRequired { origin: self.origin.into(), what: what.into() },
            PrefixError::Short { declared, min } => LoadError::ShortStruct {
                origin: self.origin.into(),
                what: what.into(),
                declared,
                required: min,
            },
        })
    }

    /// Reads a plugin string through the SDK's bounded reader
    /// ([`prefix::read_bounded_str`]: never past its terminator, at most
    /// [`MAX_NAME`] bytes), in its [`escape_untrusted`] form: names and
    /// versions go to terminals, logs and C strings, so a control
    /// character never leaves the loader raw.
    unsafe fn string(&self, p: *const c_char, what: &str) -> Result<String, LoadError> {
        prefix::read_bounded_str(p).map(|s| escape_untrusted(&s)).map_err(|e| match e {
            StringError::Null => LoadError::NullRequired { origin: self.origin.into(), what: what.into() },
            StringError::Unterminated => {
                self.malformed(format!("{what} has no NUL terminator within {MAX_NAME} bytes"))
            }
            StringError::Empty => self.malformed(format!("{what} is empty")),
            StringError::NotUtf8 => self.malformed(format!("{what} is not UTF-8")),
        })
    }

    unsafe fn mechanism(
        &self,
        index: usize,
        p: *const MemplugMechanism,
        shared: &Arc<PluginShared>,
    ) -> Result<Mechanism, LoadError> {
        let d: MemplugMechanism =
            self.prefix(p, MEMPLUG_MECHANISM_SIZE_1_0, &format!("mechanism #{index}"))?;
        let name = self.string(d.name, &format!("mechanism #{index} name"))?;
        if d.mechanism_id == 0 {
            return Err(self.malformed(format!("mechanism '{name}' has id 0 (ids must be non-zero)")));
        }
        let caps = Capabilities(d.capabilities);
        let mismatch = |detail: String| LoadError::CapabilityMismatch {
            origin: self.origin.into(),
            mechanism: name.clone(),
            detail,
        };
        if !caps.allocator() {
            return Err(mismatch(
                "MEMPLUG_CAP_ALLOCATOR is not set; every mechanism needs an allocator".into(),
            ));
        }
        if d.allocator.is_null() {
            return Err(mismatch("MEMPLUG_CAP_ALLOCATOR is set but the allocator pointer is NULL".into()));
        }
        for (flag, pointer, flag_name, field) in [
            (
                caps.virtual_backing(),
                !d.virtual_backing.is_null(),
                "MEMPLUG_CAP_VIRTUAL_BACKING",
                "virtual_backing",
            ),
            (
                caps.shared_mapping(),
                !d.shared_mapping.is_null(),
                "MEMPLUG_CAP_SHARED_MAPPING",
                "shared_mapping",
            ),
            (caps.sync(), !d.sync.is_null(), "MEMPLUG_CAP_SYNC", "sync"),
        ] {
            agree(flag, pointer, flag_name, field).map_err(&mismatch)?;
        }
        if caps.typed_export() && !caps.shared_mapping() {
            return Err(mismatch(
                "MEMPLUG_CAP_TYPED_EXPORT is set without MEMPLUG_CAP_SHARED_MAPPING (its slots live in the \
                 shared_mapping table)"
                    .into(),
            ));
        }
        // Bits of 1.1: a claim above the agreed minor is a contradiction,
        // not an unknown bit (this host knows what the bit means).
        if caps.shared_export() {
            if self.minor < 1 {
                return Err(mismatch(format!(
                    "MEMPLUG_CAP_SHARED_EXPORT is a capability above the agreed minor: it is defined by \
                     ABI 1.1 and the plugin agreed on 1.{}",
                    self.minor
                )));
            }
            if !caps.shared_mapping() {
                return Err(mismatch(
                    "MEMPLUG_CAP_SHARED_EXPORT is set without MEMPLUG_CAP_SHARED_MAPPING (its slots live in \
                     the shared_mapping table)"
                        .into(),
                ));
            }
        }

        let what = |s: &str| format!("mechanism '{name}' {s}");
        let allocator: MemplugAllocator =
            self.prefix(d.allocator, MEMPLUG_ALLOCATOR_SIZE_1_0, &what("allocator"))?;
        self.required(&allocator, Need::Required, &name)?;
        let virtual_backing = if caps.virtual_backing() {
            let v: MemplugVirtualBacking =
                self.prefix(d.virtual_backing, MEMPLUG_VIRTUAL_BACKING_SIZE_1_0, &what("virtual_backing"))?;
            self.required(&v, Need::Required, &name)?;
            Some(v)
        } else {
            None
        };
        let shared_mapping = if caps.shared_mapping() {
            let mut v: MemplugSharedMapping =
                self.prefix(d.shared_mapping, MEMPLUG_SHARED_MAPPING_SIZE_1_0, &what("shared_mapping"))?;
            self.required(&v, Need::Required, &name)?;
            self.shared_export(&mut v, caps, &name)?;
            self.typed_export(&mut v, caps, &name)?;
            Some(v)
        } else {
            None
        };
        let sync = if caps.sync() {
            let mut v: MemplugSync = self.prefix(d.sync, MEMPLUG_SYNC_SIZE_1_0, &what("sync"))?;
            self.required(&v, Need::Required, &name)?;
            self.sync_tail(&mut v);
            Some(v)
        } else {
            None
        };
        let (mut virtual_backing, mut shared_mapping) = (virtual_backing, shared_mapping);
        self.queued_binding(&mut virtual_backing, &mut shared_mapping, caps, &name)?;
        let peer_access = self.peer_access(&d, caps, &name)?;

        let identity = self.identity(&d, &name)?;
        // SAFETY: the tables were read from this descriptor and their
        // required slots checked above; 1.1 slots survive only at minor >= 1
        // with the capability claimed (`shared_export`).
        let inner = MechanismInner::new(
            d.mechanism_id,
            name,
            d.device,
            caps,
            self.minor,
            d.ctx,
            allocator,
            virtual_backing,
            shared_mapping,
            sync,
            peer_access,
            self.check_overlaps,
            shared.clone(),
        );
        let props = self.properties(&inner)?;
        Ok(Mechanism::new(inner, props, identity))
    }

    /// The 1.1 tail of a shared mapping table (`export_fd`, `import_fd`):
    /// kept only when the agreed minor is at least 1 and the capability is
    /// claimed, in which case the table must be long enough to hold both
    /// slots and publish them. Otherwise the slots are cleared, so a plugin
    /// that publishes them but agreed on 1.0 is used as 1.0.
    unsafe fn shared_export(
        &self,
        v: &mut MemplugSharedMapping,
        caps: Capabilities,
        name: &str,
    ) -> Result<(), LoadError> {
        if self.minor < 1 {
            v.export_fd = None;
            v.import_fd = None;
            return Ok(());
        }
        let mismatch = |detail: String| LoadError::CapabilityMismatch {
            origin: self.origin.into(),
            mechanism: name.to_string(),
            detail,
        };
        let published = v.export_fd.is_some() || v.import_fd.is_some();
        if !caps.shared_export() {
            if published && v.struct_size >= MEMPLUG_SHARED_MAPPING_SIZE_1_1 {
                return Err(mismatch(
                    "the shared_mapping export_fd/import_fd slots are set but MEMPLUG_CAP_SHARED_EXPORT is not"
                        .into(),
                ));
            }
            v.export_fd = None;
            v.import_fd = None;
            return Ok(());
        }
        if v.struct_size < MEMPLUG_SHARED_MAPPING_SIZE_1_1 {
            return Err(mismatch(format!(
                "MEMPLUG_CAP_SHARED_EXPORT is set but the shared_mapping table is {} bytes, too short for the \
                 1.1 export_fd/import_fd slots ({} bytes)",
                v.struct_size, MEMPLUG_SHARED_MAPPING_SIZE_1_1
            )));
        }
        self.required(v, Need::WithCapability(MEMPLUG_CAP_SHARED_EXPORT), name)
    }

    /// Refuses `table` of mechanism `mechanism` when a slot the ABI says it
    /// must publish (`need`) is NULL, naming the first such slot.
    fn required<T: Vtable>(&self, table: &T, need: Need, mechanism: &str) -> Result<(), LoadError> {
        match facts::unpublished(table, need).next() {
            None => Ok(()),
            Some(slot) => Err(LoadError::NullRequired {
                origin: self.origin.into(),
                what: format!("mechanism '{mechanism}' {}.{slot}", T::NAME),
            }),
        }
    }

    fn properties(&self, m: &MechanismInner) -> Result<Properties, LoadError> {
        let out = m.read_properties().map_err(|source| LoadError::Properties {
            origin: self.origin.into(),
            mechanism: m.name.clone(),
            source,
        })?;
        let bad = |detail: String| LoadError::Malformed {
            origin: self.origin.into(),
            detail: format!("mechanism '{}' properties: {detail}", m.name),
        };
        if !out.min_alignment.is_power_of_two() || !out.max_alignment.is_power_of_two() {
            return Err(bad(format!(
                "alignments must be powers of two (min {}, max {})",
                out.min_alignment, out.max_alignment
            )));
        }
        if out.max_alignment < out.min_alignment {
            return Err(bad(format!(
                "max_alignment {} < min_alignment {}",
                out.max_alignment, out.min_alignment
            )));
        }
        let needs_granularity = m.caps.virtual_backing() || m.caps.shared_mapping();
        if needs_granularity && !out.granularity.is_power_of_two() {
            return Err(bad(format!("granularity {} is not a power of two", out.granularity)));
        }
        let descriptor = self.descriptor(&out, m.minor).map_err(bad)?;
        let copy_kinds = self.copy_kinds(&out, m).map_err(bad)?;
        Ok(Properties {
            min_alignment: out.min_alignment,
            max_alignment: out.max_alignment,
            granularity: out.granularity,
            descriptor,
            copy_kinds,
        })
    }
}

/// A plugin's text (its name, version, a mechanism's name) in a form safe
/// to print and to pass as a C string, faithful and reversible:
///
/// * a backslash becomes `\\`;
/// * tab, line feed and carriage return become `\t`, `\n`, `\r`;
/// * every other control character (C0, DEL, C1: terminal escapes such as
///   `ESC [2J`, BEL) becomes `\xNN` below U+0080 and `\u{NN}` above;
/// * characters that reorder or hide text (the bidirectional embeddings,
///   overrides, isolates and marks, zero-width characters, the byte order
///   mark, the line and paragraph separators) become `\u{NNNN}`.
///
/// Everything else, including any other non-ASCII text, is kept as it is.
/// The loader stores names in this form, so `Plugin::name`, error messages,
/// `memplug inspect` and the C API all show the same escaped text.
pub fn escape_untrusted(s: &str) -> String {
    use std::fmt::Write;
    if !s.chars().any(needs_escape) {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if needs_escape(c) && (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

fn needs_escape(c: char) -> bool {
    c == '\\'
        || c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}'
                | '\u{feff}'
        )
}

fn agree(flag: bool, pointer: bool, flag_name: &str, field: &str) -> Result<(), String> {
    match (flag, pointer) {
        (true, false) => Err(format!("{flag_name} is set but the {field} pointer is NULL")),
        (false, true) => Err(format!("the {field} pointer is set but {flag_name} is not")),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::escape_untrusted;

    #[test]
    fn plain_names_are_kept() {
        for s in ["memplug-cpu", "cuda-vmm 1.2.3", "mémoire-設備", "a/b:c"] {
            assert_eq!(escape_untrusted(s), s);
        }
    }

    #[test]
    fn control_and_reordering_characters_are_escaped_visibly() {
        assert_eq!(escape_untrusted("a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(escape_untrusted("bell\x07\r\n\t"), "bell\\x07\\r\\n\\t");
        assert_eq!(escape_untrusted("del\x7f c1\u{9b}"), "del\\x7f c1\\u{9b}");
        assert_eq!(escape_untrusted("evil\u{202e}txt.so"), "evil\\u{202e}txt.so");
        assert_eq!(escape_untrusted("zw\u{200b}j\u{feff}"), "zw\\u{200b}j\\u{feff}");
        assert_eq!(escape_untrusted("back\\slash"), "back\\\\slash");
    }

    #[test]
    fn the_escaped_form_is_printable_and_distinct_for_distinct_inputs() {
        let inputs = ["a\x1bb", "a\\x1bb", "a\\\x1bb", "a\nb", "a\\nb"];
        let out: Vec<String> = inputs.iter().map(|s| escape_untrusted(s)).collect();
        for (i, o) in out.iter().enumerate() {
            assert!(!o.chars().any(|c| c.is_control()), "{o:?}");
            for p in &out[i + 1..] {
                assert_ne!(o, p);
            }
        }
    }
}
