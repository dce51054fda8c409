//! What no role gains through loom: privileges, a hostile database owner, a
//! hostile client.

mod hostile_client;
mod hostile_owner;
mod security;
