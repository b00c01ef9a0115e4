//! Time as the runtime writes it on the wire and on disk.

use std::time::SystemTime;

/// RFC 3339 with milliseconds, UTC.
pub fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}
