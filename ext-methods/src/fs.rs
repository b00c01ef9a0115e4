//! Params and results of the host file system operations
//! (research/contract.md, "Host file system"): the `_sandboxagent/fs/*`
//! methods and the JSON bodies of the `/v2/fs/*` routes, which are the same
//! shapes. Fields listed twice (`entry_type` / `entryType`,
//! `bytes_written` / `bytesWritten`) are written in both spellings because
//! clients written to seed 001 read the snake_case ones; both are read.

use serde::{Deserialize, Serialize};

/// What an entry is. A symlink is reported as what it points to; a link
/// whose target is missing or outside `--fs-root` is [`FsEntryType::Symlink`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum FsEntryType {
    /// A regular file (or anything that is not a directory: a FIFO, a socket, a device).
    #[default]
    File,
    /// A directory.
    Directory,
    /// A symlink that cannot be followed (dangling, or out of reach).
    Symlink,
}

/// One file system entry: the element of `list_entries` and the result of
/// `stat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FsEntry {
    /// The entry's file name (the last path component). A name that is not
    /// UTF-8 is shown with U+FFFD in place of the bad bytes; [`Self::raw_name`]
    /// then has the exact bytes.
    pub name: String,
    /// Absolute path of the entry (same lossy rule as `name`).
    pub path: String,
    /// Size in bytes (of the target, for a symlink); 0 for a directory.
    pub size: u64,
    /// `"file"`, `"directory"` or `"symlink"`.
    pub entry_type: FsEntryType,
    /// The same as `entry_type` (camelCase spelling).
    #[serde(rename = "entryType", default)]
    pub entry_type_camel: FsEntryType,
    /// Last modification, RFC 3339 (UTC); `null` when the file system has none.
    pub modified: Option<String>,
    /// For a symlink: what it points to, as stored in the link.
    #[serde(
        rename = "symlinkTarget",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub symlink_target: Option<String>,
    /// For a name that is not UTF-8: its bytes, percent-encoded (RFC 3986
    /// section 2.1; every byte outside unreserved ASCII as `%XX`).
    #[serde(rename = "rawName", default, skip_serializing_if = "Option::is_none")]
    pub raw_name: Option<String>,
}

/// `{path?, sessionId?}`: params of `list_entries`, `stat` and `mkdir`, and
/// the query of the `/v2/fs/*` routes. `session_id` is accepted as well.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsPathParams {
    /// The path: absolute, or relative to the session's `cwd` (else the
    /// server's working directory). `list_entries` defaults to `.`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The session whose `cwd` relative paths start from.
    #[serde(
        rename = "sessionId",
        alias = "session_id",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub session_id: Option<String>,
}

/// Params of `_sandboxagent/fs/move` and the body of `POST /v2/fs/move`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FsMoveParams {
    /// What to move.
    pub from: String,
    /// Where to.
    pub to: String,
    /// Replace an existing `to` (default `false`: 409 `already-exists`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overwrite: bool,
    /// As in [`FsPathParams`].
    #[serde(
        rename = "sessionId",
        alias = "session_id",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub session_id: Option<String>,
}

/// Params of `_sandboxagent/fs/delete_entry` (the query of `DELETE /v2/fs/entry`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsDeleteParams {
    /// What to delete (a symlink itself, never its target).
    pub path: String,
    /// Delete a non-empty directory with everything in it (default `false`:
    /// 409 `directory-not-empty`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recursive: bool,
    /// As in [`FsPathParams`].
    #[serde(
        rename = "sessionId",
        alias = "session_id",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub session_id: Option<String>,
}

/// Result of `list_entries`: the directory's entries, sorted by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FsEntries {
    /// The entries (not `.` and `..`), sorted by name: the first
    /// [`MAX_LIST_ENTRIES`] of a larger directory.
    pub entries: Vec<FsEntry>,
    /// Set when the directory has more than [`MAX_LIST_ENTRIES`] entries and
    /// only the first ones by name are listed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// Most entries one listing answers with (research/contract.md, "Host file
/// system"): a listing is held whole in memory until the client has read
/// it, so a directory of any size must not make one unbounded.
pub const MAX_LIST_ENTRIES: usize = 10_000;

/// Result of `mkdir` and `delete_entry`: the absolute path acted on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FsPathResult {
    /// Absolute path.
    pub path: String,
}

/// Result of `move`: both absolute paths.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FsMoveResult {
    /// Where the entry was.
    pub from: String,
    /// Where it is now.
    pub to: String,
}

/// Answer of `PUT /v2/fs/file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FsWriteResult {
    /// Absolute path written.
    pub path: String,
    /// Bytes in the file now.
    pub bytes_written: u64,
    /// The same as `bytes_written` (camelCase spelling).
    #[serde(rename = "bytesWritten", default)]
    pub bytes_written_camel: u64,
}

impl FsWriteResult {
    /// The answer for `bytes` written to `path`, both spellings filled.
    pub fn new(path: String, bytes: u64) -> Self {
        Self {
            path,
            bytes_written: bytes,
            bytes_written_camel: bytes,
        }
    }
}

/// Answer of `POST /v2/fs/upload-batch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FsUploadBatchResult {
    /// Absolute paths of the entries unpacked, in archive order, at most
    /// the server's cap (1000).
    pub paths: Vec<String>,
    /// More entries were unpacked than `paths` lists.
    pub truncated: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn both_spellings_are_written_and_session_id_reads_both_ways() {
        let entry = FsEntry {
            name: "a".into(),
            path: "/a".into(),
            size: 1,
            entry_type: FsEntryType::Directory,
            entry_type_camel: FsEntryType::Directory,
            modified: None,
            symlink_target: None,
            raw_name: None,
        };
        let wire = serde_json::to_value(&entry).expect("entry");
        assert_eq!(wire["entry_type"], "directory");
        assert_eq!(wire["entryType"], "directory");
        let written = serde_json::to_value(FsWriteResult::new("/a".into(), 3)).expect("write");
        assert_eq!(
            written,
            json!({"path": "/a", "bytes_written": 3, "bytesWritten": 3})
        );
        for key in ["sessionId", "session_id"] {
            let params: FsPathParams =
                serde_json::from_value(json!({"path": "x", key: "s"})).expect("params");
            assert_eq!(params.session_id.as_deref(), Some("s"));
        }
    }
}
