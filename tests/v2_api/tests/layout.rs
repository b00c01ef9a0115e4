//! The code's layout, checked: no import cycle between the files of a
//! crate's `src/`, and none between the runtime's top-level modules
//! (`scripts/module-cycles.py`; research/decisions.md, "One room per
//! concern"). The cycles that remain are listed in [`KNOWN`]: a new one
//! fails, and so does a listed one that is gone (take it off the list).

use std::process::Command;
use v2_api_tests::server::workspace_root;

/// (crate `src/` folder, `--folders` or not, the cycles the script prints
/// today, each as its comma-separated members).
const KNOWN: &[(&str, bool, &[&str])] = &[
    ("acp-runtime/src", false, &[]),
    ("acp-runtime/src", true, &[]),
    ("ext-methods/src", false, &[]),
    ("acp-http-client/src", false, &[]),
    ("sandbox-agent-sdk/src", false, &[]),
    ("sandbox-agent/src", false, &[]),
];

/// The cycles `scripts/module-cycles.py` finds in `src` (the members of
/// each, as it prints them).
fn cycles(src: &str, folders: bool) -> Vec<String> {
    let root = workspace_root();
    let mut command = Command::new("python3");
    command
        .arg(root.join("scripts/module-cycles.py"))
        .arg(root.join(src));
    if folders {
        command.arg("--folders");
    }
    let output = command
        .output()
        .expect("python3 runs scripts/module-cycles.py");
    assert!(
        output.status.success(),
        "module-cycles.py {src}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("UTF-8")
        .lines()
        .filter_map(|line| line.strip_prefix("- "))
        .map(|line| {
            line.split_once(": ")
                .map_or(line, |(_, members)| members)
                .to_owned()
        })
        .collect()
}

#[test]
fn no_import_cycle_beyond_the_known_ones() {
    let mut wrong = Vec::new();
    for &(src, folders, known) in KNOWN {
        let mut found = cycles(src, folders);
        found.sort();
        let mut expected: Vec<String> = known.iter().map(|cycle| (*cycle).to_owned()).collect();
        expected.sort();
        if found != expected {
            wrong.push(format!(
                "{src}{}: found {found:#?}, listed {expected:#?}",
                if folders { " (folders)" } else { "" }
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "import cycles differ from tests/v2_api/tests/layout.rs's KNOWN list (a new cycle: \
         break it; a listed one gone: take it off the list):\n{}",
        wrong.join("\n")
    );
}
