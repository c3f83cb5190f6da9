//! Durations and sizes as people write them on the command line and in
//! config files (`300ms`, `7d`, `64KiB`): the gateway's readers, shared by
//! every command.

pub use idem_http::gateway::{parse_duration, parse_size};
