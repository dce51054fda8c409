//! Checks of the crates themselves, run by `make lint`: the minimum Rust
//! version, and the public API.

mod msrv;
mod public_api;
