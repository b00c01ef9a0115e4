//! `fs/read_text_file` and `fs/write_text_file` answered in the sandbox
//! (research/contract.md, "Files and terminals of the agent, served in the
//! sandbox"): the file API's own open and atomic write, through a [`Scope`]
//! that excludes the runtime's data.

use super::reply::{empty, fs_error};
use crate::error::Error;
use crate::fs::{Scope, transfer};
use crate::protocol::{RpcError, code};
use agent_client_protocol::v1::schema::{
    ReadTextFileRequest, ReadTextFileResponse, WriteTextFileRequest,
};
use bytes::Bytes;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};

/// Most bytes of content one `fs/read_text_file` answer carries: 16 MiB,
/// the default `--max-body-bytes`, the most a remote client could have sent
/// back. A larger selection is an error that says to use `line`/`limit`.
pub(crate) const MAX_READ_BYTES: usize = 16 << 20;

/// `fs/read_text_file`: the file at `request.path` (relative to the
/// session's `cwd` when not absolute), from 1-based line `line` (default 1)
/// for at most `limit` lines (default all), each with its `\n`. Bytes that
/// are not UTF-8 become U+FFFD.
///
/// # Errors
/// The file API's errors (see [`super::fs_error`]); `-32602` when the
/// selection is over [`MAX_READ_BYTES`].
pub(super) async fn read_text_file(
    scope: Scope,
    request: ReadTextFileRequest,
) -> Result<Value, RpcError> {
    let path = request.path.to_string_lossy().into_owned();
    let (line, limit) = (request.line, request.limit);
    let content = tokio::task::spawn_blocking(move || {
        let file = transfer::open(&scope, &path).map_err(|error| fs_error(&error))?;
        select_lines(BufReader::new(file.file), line, limit, MAX_READ_BYTES).map_err(|error| {
            match error {
                Selection::TooLarge => RpcError::new(
                    code::INVALID_PARAMS,
                    format!(
                        "{path}: the text asked for is over {MAX_READ_BYTES} bytes; read it in parts with line and limit"
                    ),
                ),
                Selection::Io(error) => fs_error(&Error::from_io(&error, path.as_ref())),
            }
        })
    })
    .await
    .map_err(|error| RpcError::new(code::INTERNAL_ERROR, error.to_string()))??;
    let response = ReadTextFileResponse::new(String::from_utf8_lossy(&content).into_owned());
    serde_json::to_value(response)
        .map_err(|error| RpcError::new(code::INTERNAL_ERROR, error.to_string()))
}

/// Why [`select_lines`] gave nothing.
#[derive(Debug)]
enum Selection {
    /// The selected text is over the bound.
    TooLarge,
    /// Reading failed.
    Io(std::io::Error),
}

/// Lines `line..line + limit` (1-based; `0` counts as 1) of `reader`, each
/// with its line feed, at most `max` bytes. Skipped lines are not kept, so
/// reading far into a large file costs no memory.
fn select_lines(
    mut reader: impl BufRead,
    line: Option<u32>,
    limit: Option<u32>,
    max: usize,
) -> Result<Vec<u8>, Selection> {
    for _ in 1..line.unwrap_or(1) {
        if reader.skip_until(b'\n').map_err(Selection::Io)? == 0 {
            return Ok(Vec::new());
        }
    }
    let mut selected = Vec::new();
    let mut bounded = reader.take(max as u64 + 1);
    match limit {
        None => {
            bounded.read_to_end(&mut selected).map_err(Selection::Io)?;
        }
        Some(limit) => {
            for _ in 0..limit {
                if bounded
                    .read_until(b'\n', &mut selected)
                    .map_err(Selection::Io)?
                    == 0
                {
                    break;
                }
            }
        }
    }
    if selected.len() > max {
        return Err(Selection::TooLarge);
    }
    Ok(selected)
}

/// `fs/write_text_file`: `request.content` replaces the file at
/// `request.path` as the file API's `PUT` does (a temp file beside it,
/// fsync, rename; parents made), answered `{}`.
///
/// # Errors
/// The file API's errors (see [`super::fs_error`]); `-32602` for content
/// over `limit` bytes.
pub(super) async fn write_text_file(
    scope: Scope,
    request: WriteTextFileRequest,
    limit: u64,
) -> Result<Value, RpcError> {
    let path = request.path.to_string_lossy().into_owned();
    let mut body = futures::stream::iter([Ok::<_, Error>(Bytes::from(request.content))]);
    transfer::write(scope, path, &mut body, limit)
        .await
        .map_err(|error| fs_error(&error))?;
    Ok(empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn select(text: &str, line: Option<u32>, limit: Option<u32>, max: usize) -> Option<String> {
        select_lines(text.as_bytes(), line, limit, max)
            .ok()
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
    }

    #[test]
    fn line_and_limit_select_whole_lines() {
        let text = "one\ntwo\nthree\nfour";
        assert_eq!(select(text, None, None, 100).as_deref(), Some(text));
        assert_eq!(
            select(text, Some(2), Some(2), 100).as_deref(),
            Some("two\nthree\n")
        );
        assert_eq!(
            select(text, Some(0), Some(1), 100).as_deref(),
            Some("one\n")
        );
        assert_eq!(select(text, Some(4), None, 100).as_deref(), Some("four"));
        assert_eq!(select(text, Some(9), None, 100).as_deref(), Some(""));
        assert_eq!(select(text, Some(3), Some(0), 100).as_deref(), Some(""));
    }

    #[test]
    fn the_selection_is_bounded_not_the_file() {
        let text = format!("{}\nshort\n", "x".repeat(1000));
        assert!(select(&text, None, None, 100).is_none());
        assert_eq!(
            select(&text, Some(2), None, 100).as_deref(),
            Some("short\n")
        );
        assert_eq!(select("12345", None, None, 5).as_deref(), Some("12345"));
        assert!(select("123456", None, None, 5).is_none());
    }
}
