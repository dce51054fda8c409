//! The client's stores against the Makefile's clusters: event and snapshot
//! stores, events' metadata, exact payloads, the caller's transaction, delta
//! snapshots saved under concurrency and written by the client, watching for
//! events.

mod caller_transaction;
mod client_deltas;
mod deltas;
mod event_metadata;
mod event_stores;
mod payloads;
mod snapshot_stores;
mod watch;
