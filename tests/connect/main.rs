//! What users put in front of loom: PgBouncer in transaction mode, and TLS.

mod pooler;
mod tls;
