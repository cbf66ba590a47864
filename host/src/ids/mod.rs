//! The keys every charge and every event carries: which pool, which
//! holder, what priority, what class of memory.
//!
//! The governor's vocabulary, kept below the governor and below the event
//! hub (`crate::events`) so that both can speak it without importing each
//! other. Users name these through `memplug_host::governor`.

mod class;
mod pool_holder;

pub use class::AllocationClass;
pub(crate) use pool_holder::next_uid;
pub use pool_holder::{HolderId, PoolId, Priority};
