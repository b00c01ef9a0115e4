//! Where the browser tests find their browser: Debian's Chromium and
//! puppeteer-core from `tests/npm` (both installed by `scripts/test`).

use crate::server::workspace_root;
use std::path::PathBuf;

/// The Chromium binary: `$CHROMIUM`, else Debian's.
///
/// # Panics
/// When it is not there, naming the install step.
pub fn chromium() -> PathBuf {
    let path = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    assert!(
        path.is_file(),
        "Chromium not found at {}: install it with `apt-get install chromium` (scripts/test does), or set CHROMIUM",
        path.display()
    );
    path
}

/// `tests/npm/node_modules/puppeteer-core`, checked to be there.
///
/// # Panics
/// When it is not there, naming the install step.
pub fn puppeteer() -> PathBuf {
    let path = workspace_root().join("tests/npm/node_modules/puppeteer-core");
    assert!(
        path.is_dir(),
        "puppeteer-core not found at {}: install it with `npm install --prefix tests/npm` (scripts/test does)",
        path.display()
    );
    path
}
