//! What a vendor writing a plugin in Rust implements: safe traits, one per
//! capability. The export layer ([`crate::export`]) turns them into vtables; no
//! vendor code is `unsafe extern "C"`.

mod allocator;
mod arguments;
mod error;
mod peer_access;
mod shared_mapping;
mod stream_sync;
mod virtual_backing;

pub use allocator::*;
pub use arguments::*;
pub use error::*;
pub use peer_access::*;
pub use shared_mapping::*;
pub use stream_sync::*;
pub use virtual_backing::*;
