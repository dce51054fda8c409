//! The extension's own functions in the server: frames and their hostile
//! inputs, retention, the executions index's repair, the workload's plans,
//! backtraces kept out of errors.

mod backtraces;
mod claims;
mod feed;
mod frames;
mod hostile_frames;
mod index_repair;
mod retention;
mod workload;
