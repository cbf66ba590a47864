//! memplug host.
