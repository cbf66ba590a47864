//! memplug CPU plugin.
