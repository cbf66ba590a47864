//! Helpers shared by the ABI tests.
