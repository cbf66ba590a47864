//! What the CLI's test files share. Each file compiles its own copy and
//! uses only part of it.
#![allow(dead_code)]

pub mod pipes;
pub mod xml;
