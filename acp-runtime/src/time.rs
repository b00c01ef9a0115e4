//! Time as the runtime writes it on the wire and on disk.

/// RFC 3339 with milliseconds, UTC: the wire's one formatter, from
/// `ext-methods`.
pub use ext_methods::meta::format_time as rfc3339;
