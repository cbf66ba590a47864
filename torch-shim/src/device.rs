//! One CUDA device as the shim serves it: the mechanism's context, the
//! device's pool (its budget), the binding torch's memory comes from, and
//! torch's streams adopted on that mechanism (for the fences frees wait
//! behind).

use crate::config::{Config, Reuse};
use memplug_host::governor::AllocationClass;
use memplug_host::governor::Pool;
use memplug_host::{
    BindingError, BindingSpec, CacheConfig, CachedAllocation, CachingBinding, Context, IdlePolicy,
    MemoryBinding, OwnedAllocation, PluginFence, ProcessMemoryManager, Requirements, SharedFence, Status,
    Stream, StreamKey,
};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CUDA};
use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

/// Blocks torch gets are aligned to this: what `cudaMalloc` guarantees,
/// which torch's kernels assume (and what the CUDA plugin's `cuMemAlloc`
/// gives without over-allocating).
pub(crate) const ALIGNMENT: u64 = 256;

/// Where a device's memory comes from.
enum Backend {
    Plain(MemoryBinding),
    Cached(CachingBinding),
}

/// A block handed to torch.
pub(crate) enum Held {
    Plain(OwnedAllocation),
    Cached(CachedAllocation),
}

impl Held {
    pub(crate) fn addr(&self) -> u64 {
        match self {
            Held::Plain(a) => a.addr(),
            Held::Cached(a) => a.addr(),
        }
    }
    pub(crate) fn size(&self) -> u64 {
        match self {
            Held::Plain(a) => a.size(),
            Held::Cached(a) => a.size(),
        }
    }
}

pub(crate) struct DeviceState {
    ordinal: i32,
    context: Arc<Context>,
    pool: Arc<Pool>,
    backend: Backend,
    /// torch's `cudaStream_t` → the mechanism's adoption of it. Kept for
    /// the life of the process: torch's streams are long-lived (its pool
    /// of streams is never destroyed), and giving one back would
    /// synchronise it.
    streams: RwLock<HashMap<usize, Stream>>,
    /// The pool's link to a node authority (`MEMPLUG_NODE_SOCKET`).
    _node: Option<memplug_node::NodeLink>,
}

impl DeviceState {
    /// Selects the CUDA mechanism of `ordinal` (with streams and fences),
    /// creates its pool and binds it.
    pub(crate) fn open(mgr: &ProcessMemoryManager, config: &Config, ordinal: i32) -> Result<Self, String> {
        let device = MemplugDevice { kind: MEMPLUG_DEVICE_CUDA, ordinal: ordinal as u32 };
        let req = Requirements { sync: true, ..Requirements::ALLOCATOR_ONLY };
        let context = mgr.select(device, req).map_err(|e| format!("cuda:{ordinal}: {e}"))?;
        let capacity = match config.pool_bytes {
            // Joined to a node: the pool holds what the authority leases.
            _ if config.node_socket.is_some() => 0,
            Some(b) => b,
            None => match context.mechanism().memory_info() {
                Some(Ok(info)) => info.total_bytes,
                Some(Err(e)) => {
                    return Err(format!(
                        "cuda:{ordinal}: memory_info failed ({e}); set MEMPLUG_TORCH_POOL_BYTES"
                    ))
                }
                None => {
                    return Err(format!(
                        "cuda:{ordinal}: the mechanism reports no memory figure; set MEMPLUG_TORCH_POOL_BYTES"
                    ))
                }
            },
        };
        let pool = mgr.create_pool(&format!("torch-cuda{ordinal}"), capacity).map_err(|e| e.to_string())?;
        let node = match &config.node_socket {
            None => None,
            Some(socket) => {
                let spec = memplug_node::LinkDevice {
                    device: format!("cuda{ordinal}"),
                    pool: pool.clone(),
                    priority: 0,
                    // Whatever PyTorch caches: pressed for any class.
                    classes: 0,
                };
                let link =
                    memplug_node::NodeLink::join(socket, vec![spec], memplug_node::LinkOptions::default())
                        .map_err(|e| {
                            format!("cuda:{ordinal}: joining the node at {}: {e}", socket.display())
                        })?;
                Some(link)
            }
        };
        // torch writes what it allocates before reading it.
        // No governor wait: the shim waits only for frees it knows are
        // queued (`Shim::await_pending_frees`), never when nothing is.
        let spec = BindingSpec::new(AllocationClass::Activations).uninitialized_ok();
        let backend = if config.cache {
            let cfg = CacheConfig {
                holder_name: format!("torch-cache-cuda{ordinal}"),
                max_block: config.cache_max_block,
                min_alignment: ALIGNMENT,
                idle: IdlePolicy {
                    max_idle_bytes: config.cache_max_idle,
                    gc_threshold: config.gc_threshold,
                    ..IdlePolicy::default()
                },
                ..CacheConfig::default()
            };
            Backend::Cached(mgr.bind_caching(&context, &pool, spec, cfg).map_err(|e| e.to_string())?)
        } else {
            Backend::Plain(mgr.bind(&context, &pool, spec).map_err(|e| e.to_string())?)
        };
        Ok(DeviceState { ordinal, context, pool, backend, streams: RwLock::default(), _node: node })
    }

    pub(crate) fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// `size` bytes for work on `stream`.
    pub(crate) fn allocate(&self, size: u64, stream: usize) -> Result<Held, BindingError> {
        match &self.backend {
            Backend::Plain(b) => b.allocate(size, ALIGNMENT).map(Held::Plain),
            Backend::Cached(c) => {
                c.allocate_on(size, ALIGNMENT, StreamKey::runtime(stream as u64)).map(Held::Cached)
            }
        }
    }

    /// Gives every idle cached block back to the mechanism (behind its
    /// fences, through the deferred-free queue); the bytes given back. 0
    /// without a cache.
    pub(crate) fn trim(&self) -> u64 {
        match &self.backend {
            Backend::Plain(_) => 0,
            Backend::Cached(c) => c.trim(u64::MAX),
        }
    }

    /// Frees `held` behind the work torch queued on `stream` so far: a
    /// fence recorded there now, and the free (or the cache's reuse by
    /// other streams) waits for it; under [`Reuse::AllStreams`] also
    /// behind a fence recorded now on every other stream seen on this
    /// device, and then, when there is any, not reused at once even on
    /// `stream`. On an error `held` comes back untouched: the caller keeps
    /// it rather than free on a guess.
    // The error hands the block back: boxing it would allocate on a path
    // that must not fail.
    #[allow(clippy::result_large_err)]
    pub(crate) fn free_on(&self, held: Held, stream: usize, reuse: Reuse) -> Result<(), (Held, String)> {
        let fence = match self.fence_on(stream) {
            Ok(f) => f,
            Err(e) => return Err((held, e)),
        };
        let others = match reuse {
            Reuse::FreeStream => Vec::new(),
            Reuse::AllStreams => match self.fences_on_others(stream) {
                Ok(f) => f,
                Err(e) => return Err((held, e)),
            },
        };
        match held {
            Held::Plain(mut a) => {
                a.used_by(fence);
                others.into_iter().for_each(|f| a.used_by(f));
                drop(a); // into the deferred-free queue, behind the fences
            }
            Held::Cached(a) if others.is_empty() => a.free_on(StreamKey::runtime(stream as u64), fence),
            Held::Cached(mut a) => {
                a.used_by(fence);
                others.into_iter().for_each(|f| a.used_by(f));
                drop(a); // back to the cache, for anyone once every fence completed
            }
        }
        Ok(())
    }

    /// Makes `stream` one of the streams seen on this device (adopted once),
    /// so that frees under [`Reuse::AllStreams`] wait for it too.
    pub(crate) fn note_stream(&self, stream: usize) -> Result<(), String> {
        let mut streams = self.streams.write().unwrap_or_else(PoisonError::into_inner);
        if let std::collections::hash_map::Entry::Vacant(v) = streams.entry(stream) {
            v.insert(self.adopt(stream)?);
        }
        Ok(())
    }

    /// A fence now on every stream seen on this device but `stream`.
    fn fences_on_others(&self, stream: usize) -> Result<Vec<SharedFence>, String> {
        let m = self.context.mechanism();
        let streams = self.streams.read().unwrap_or_else(PoisonError::into_inner);
        streams
            .iter()
            .filter(|(&k, _)| k != stream)
            .map(|(_, s)| PluginFence::record(m, s).map_err(|e| e.to_string()))
            .collect()
    }

    /// A fence after the work queued on torch's `stream` so far.
    fn fence_on(&self, stream: usize) -> Result<SharedFence, String> {
        let m = self.context.mechanism();
        {
            let streams = self.streams.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(s) = streams.get(&stream) {
                return PluginFence::record(m, s).map_err(|e| e.to_string());
            }
        }
        let mut streams = self.streams.write().unwrap_or_else(PoisonError::into_inner);
        let s = match streams.entry(stream) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(self.adopt(stream)?),
        };
        PluginFence::record(m, s).map_err(|e| e.to_string())
    }

    fn adopt(&self, stream: usize) -> Result<Stream, String> {
        let m = self.context.mechanism();
        let sync = m.sync().ok_or_else(|| format!("cuda:{}: the mechanism has no streams", self.ordinal))?;
        let native = stream as *mut std::ffi::c_void;
        // SAFETY: torch hands its own live `cudaStream_t` (a `CUstream`) of
        // this device, or NULL for the legacy default stream; its streams
        // outlive the adoption (see `streams`).
        let typed = unsafe { sync.stream_adopt_typed(MEMPLUG_DEVICE_CUDA, native) };
        let adopted = match typed {
            // A plugin of ABI 1.1 has only the untyped adoption.
            Err(e) if e.status == Status::Unsupported && sync.can_adopt() => {
                // SAFETY: as above.
                unsafe { sync.stream_adopt(native) }
            }
            r => r,
        };
        adopted.map_err(|e| format!("cuda:{}: adopting stream {stream:#x}: {e}", self.ordinal))
    }

    /// Figures of this device for the statistics.
    pub(crate) fn stats_json(&self) -> serde_json::Value {
        let (used, capacity) = self.pool.used_and_capacity();
        let cache = match &self.backend {
            Backend::Plain(_) => serde_json::Value::Null,
            Backend::Cached(c) => {
                let s = c.stats();
                serde_json::json!({
                    "hits": s.hits, "misses": s.misses, "bypasses": s.bypasses,
                    "idle_bytes": s.idle_bytes, "idle_blocks": s.idle_blocks,
                    "pending_blocks": s.pending_blocks, "in_use_bytes": s.in_use_bytes,
                    "in_use_blocks": s.in_use_blocks, "trimmed_bytes": s.trimmed_bytes,
                    "pressure_bytes": s.pressure_bytes,
                })
            }
        };
        serde_json::json!({
            "device": self.ordinal,
            "context": self.context.label(),
            "pool": self.pool.name(),
            "capacity": capacity,
            "used": used,
            "streams": self.streams.read().unwrap_or_else(PoisonError::into_inner).len(),
            "cache": cache,
        })
    }
}
