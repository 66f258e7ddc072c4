//! The shardq web dashboard: one view over every shard of a configuration.
//!
//! Server-rendered HTML (axum, maud), no JavaScript: an overview per shard
//! and queue (counts by state, the oldest ready job's age, completions per
//! second as an inline SVG chart, live workers and their lock-miss rate,
//! which shards do not answer), lists of jobs by state (keyset-paged), one
//! job with its steps, and confirmed actions (retry, cancel). Every shard is
//! read under its own deadline, so one that hangs costs its own cells only.
//!
//! Security: [`bind`] refuses an address beyond loopback unless
//! authentication is configured ([`Auth`]); every action needs the
//! process's CSRF token in its form and in a `SameSite=Strict` cookie, and a
//! browser's `Origin` must be the dashboard's own; `read_only` removes the
//! actions and refuses their POSTs.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod auth;
mod chart;
mod claim_trends;
mod csrf;
mod cursor;
mod pages;
mod server;
mod state;
mod trends;
mod verdict;

pub use auth::{Auth, AuthError, BASIC_ENV, TOKEN_ENV};
pub use server::{bind, Bound, DashboardError};
pub use state::DashboardOptions;
