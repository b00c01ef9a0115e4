//! Conditional reads of `GET /v2/fs/file` (research/contract.md, "Host file
//! system", reads): `If-Range` keeps a resumed download to one version of
//! the file, `If-Match` refuses a read of another version (412), and
//! `sandbox-agent fs get` resumes a broken download with `If-Range`.

use reqwest::Method;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use v2_api_tests::agents::TempDir;
use v2_api_tests::proxy::ResponseCut;
use v2_api_tests::{Api, REQUEST_TIMEOUT, Reply, TestServer, assert_problem};

use v2_api_tests::query_path as encode;

fn file_route(path: &Path) -> String {
    format!("/v2/fs/file?path={}", encode(&path.to_string_lossy()))
}

async fn get(api: &Api, path: &Path, headers: &[(&str, &str)]) -> Reply {
    let mut request = api.request(Method::GET, &file_route(path));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    Api::send(request).await
}

async fn put(api: &Api, path: &Path, body: Vec<u8>) {
    Api::send(api.request(Method::PUT, &file_route(path)).body(body))
        .await
        .assert_status(200);
}

/// Version `n` of the test file: every byte is `b'a' + n % 26`, and the
/// length is `len + n % 26`, so any mix of two versions is visible.
fn version(n: usize, len: usize) -> Vec<u8> {
    vec![b'a' + (n % 26) as u8; len + n % 26]
}

/// Whether `bytes` is one whole [`version`].
fn one_version(bytes: &[u8], len: usize) -> bool {
    let Some(&first) = bytes.first() else {
        return false;
    };
    bytes.iter().all(|&b| b == first) && bytes.len() == len + usize::from(first - b'a')
}

#[tokio::test]
async fn if_range_resumes_only_the_same_version() {
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("fs-if-range");
    let file = dir.write("data.bin", b"0123456789abcdefghij");

    let whole = get(&server, &file, &[]).await;
    whole.assert_status(200);
    let etag = whole.header("etag").expect("etag").to_owned();
    let modified = whole
        .header("last-modified")
        .expect("last-modified")
        .to_owned();

    // The same version: the rest of it, as without If-Range.
    let rest = get(
        &server,
        &file,
        &[("range", "bytes=12-"), ("if-range", &etag)],
    )
    .await;
    rest.assert_status(206);
    assert_eq!(rest.body.as_ref(), b"cdefghij");
    assert_eq!(rest.header("content-range"), Some("bytes 12-19/20"));
    assert_eq!(rest.header("etag"), Some(etag.as_str()));

    // A weak tag or a date never counts: the whole file, 200.
    let weak = format!("W/{etag}");
    for validator in [weak.as_str(), modified.as_str()] {
        let reply = get(
            &server,
            &file,
            &[("range", "bytes=12-"), ("if-range", validator)],
        )
        .await;
        reply.assert_status(200);
        assert_eq!(reply.body.as_ref(), b"0123456789abcdefghij", "{validator}");
        assert_eq!(reply.header("content-range"), None);
    }

    // The file is replaced: a resume with the old tag gets the whole new
    // file, never its tail after the old file's head.
    put(&server, &file, b"NEW CONTENT, LONGER THAN BEFORE".to_vec()).await;
    let resumed = get(
        &server,
        &file,
        &[("range", "bytes=12-"), ("if-range", &etag)],
    )
    .await;
    resumed.assert_status(200);
    assert_eq!(resumed.body.as_ref(), b"NEW CONTENT, LONGER THAN BEFORE");
    assert_eq!(resumed.header("content-range"), None);
    assert_eq!(resumed.header("content-length"), Some("31"));
    let new_etag = resumed.header("etag").expect("etag");
    assert_ne!(new_etag, etag);
    // If-Range without Range changes nothing.
    get(&server, &file, &[("if-range", &etag)])
        .await
        .assert_status(200);
}

#[tokio::test]
async fn if_match_of_another_version_is_412() {
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("fs-if-match");
    let file = dir.write("data.bin", b"first version");
    let etag = get(&server, &file, &[])
        .await
        .header("etag")
        .expect("etag")
        .to_owned();

    let weak = format!("W/{etag}");
    let listed = format!("\"other\", {etag}");
    for matching in ["*", etag.as_str(), listed.as_str()] {
        let reply = get(&server, &file, &[("if-match", matching)]).await;
        reply.assert_status(200);
        assert_eq!(reply.body.as_ref(), b"first version", "{matching}");
    }
    for failing in ["\"other\"", weak.as_str()] {
        let reply = get(&server, &file, &[("if-match", failing)]).await;
        assert_problem(&reply, 412, "precondition-failed");
    }
    // With a Range too: the precondition comes first.
    let reply = get(
        &server,
        &file,
        &[("if-match", "\"other\""), ("range", "bytes=0-3")],
    )
    .await;
    assert_problem(&reply, 412, "precondition-failed");
    let reply = get(
        &server,
        &file,
        &[("if-match", &etag), ("range", "bytes=0-4")],
    )
    .await;
    reply.assert_status(206);
    assert_eq!(reply.body.as_ref(), b"first");

    // The file is replaced: the old tag no longer matches.
    put(&server, &file, b"second version".to_vec()).await;
    let reply = get(&server, &file, &[("if-match", &etag)]).await;
    let problem = assert_problem(&reply, 412, "precondition-failed");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("If-Match"),
        "{problem}"
    );
    // A missing file is 404 whatever the precondition (RFC 9110 section
    // 13.2.1: without it the answer would not be 2xx either).
    let missing = dir.path().join("missing.bin");
    let reply = get(&server, &missing, &[("if-match", "*")]).await;
    assert_problem(&reply, 404, "file-not-found");
}

/// The race the validators exist for: a writer replaces the file over and
/// over while a reader downloads it in two halves, resuming the second
/// half with `If-Range`. Every download must be one version: the two
/// halves of the same one (206), or the whole current one (200).
#[tokio::test]
async fn a_resumed_download_under_concurrent_writes_is_never_stitched() {
    const LEN: usize = 64 * 1024;
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("fs-if-range-race");
    let file = dir.path().join("data.bin");
    std::fs::write(&file, version(0, LEN)).expect("first version");

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (api, file, stop) = (server.api(), file.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut n = 1;
            while !stop.load(Ordering::Relaxed) {
                put(&api, &file, version(n, LEN)).await;
                n += 1;
            }
            n
        })
    };
    let (mut resumed, mut restarted, mut stitched) = (0, 0, Vec::new());
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let head = get(&server, &file, &[("range", "bytes=0-999")]).await;
        head.assert_status(206);
        let etag = head.header("etag").expect("etag").to_owned();
        let rest = get(
            &server,
            &file,
            &[("range", "bytes=1000-"), ("if-range", &etag)],
        )
        .await;
        let bytes = match rest.status.as_u16() {
            206 => {
                resumed += 1;
                [head.body.as_ref(), rest.body.as_ref()].concat()
            }
            200 => {
                restarted += 1;
                rest.body.to_vec()
            }
            other => panic!("resume answered {other}: {rest:?}"),
        };
        if !one_version(&bytes, LEN) {
            stitched.push((
                bytes[0] as char,
                bytes[bytes.len() - 1] as char,
                bytes.len(),
            ));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let versions = v2_api_tests::join_within(writer, REQUEST_TIMEOUT).await;
    assert!(
        stitched.is_empty(),
        "{} of {} resumed downloads mixed two versions (first byte, last byte, length): {:?}",
        stitched.len(),
        resumed + restarted,
        &stitched[..stitched.len().min(5)]
    );
    assert!(versions > 3, "the writer wrote only {versions} versions");
    assert!(
        restarted > 0,
        "no resume ever saw a replaced file ({resumed} resumed): the race was not exercised"
    );
}

/// `sandbox-agent fs get REMOTE LOCAL --url URL`, through `url`; its stdout
/// and stderr, and whether it succeeded.
async fn fs_get(url: &str, remote: &Path, local: &Path) -> (bool, String) {
    let mut command = v2_api_tests::server::sandbox_agent_command();
    command
        .args(["fs", "get"])
        .arg(remote)
        .arg(local)
        .args(["--url", url])
        .stdin(std::process::Stdio::null());
    let output = tokio::time::timeout(
        REQUEST_TIMEOUT,
        tokio::task::spawn_blocking(move || command.output()),
    )
    .await
    .expect("fs get in time")
    .expect("join")
    .expect("run sandbox-agent fs get");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The head of the request that resumed the download.
fn resume_head(proxy: &ResponseCut) -> String {
    proxy
        .heads()
        .into_iter()
        .filter(|head| head.starts_with("GET /v2/fs/file"))
        .nth(1)
        .expect("a second GET of the file: the resume")
        .to_ascii_lowercase()
}

#[tokio::test]
async fn fs_get_resumes_a_broken_download_with_if_range() {
    const LEN: usize = 4 << 20;
    const CUT_AFTER: usize = 1 << 20;
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("fs-get-resume");
    let remote = dir.path().join("big.bin");
    let local = TempDir::new("fs-get-resume-local");

    // Unchanged: the rest is fetched and appended.
    let mut first = version(0, LEN);
    first[..7].copy_from_slice(b"HEADER:");
    first.extend_from_slice(b":TRAILER");
    std::fs::write(&remote, &first).expect("first version");
    let proxy = ResponseCut::start(server.addr(), "GET /v2/fs/file", CUT_AFTER, || {}).await;
    let kept = local.path().join("kept.bin");
    let (ok, stderr) = fs_get(&proxy.url(), &remote, &kept).await;
    assert!(ok, "fs get failed: {stderr}");
    let got = std::fs::read(&kept).expect("downloaded");
    assert!(got == first, "{} bytes, not the file", got.len());
    let head = resume_head(&proxy);
    let etag = get(&server, &remote, &[])
        .await
        .header("etag")
        .expect("etag")
        .to_ascii_lowercase();
    assert!(head.contains("\r\nrange: bytes="), "{head}");
    assert!(head.contains(&format!("\r\nif-range: {etag}")), "{head}");

    // Replaced while the download is broken: the local file is the whole
    // new version, not the old head with the new tail.
    let second = version(1, LEN);
    let (path, replacement) = (remote.clone(), second.clone());
    let proxy = ResponseCut::start(server.addr(), "GET /v2/fs/file", CUT_AFTER, move || {
        let temp = path.with_extension("new");
        std::fs::write(&temp, &replacement).expect("write the new version");
        std::fs::rename(&temp, &path).expect("replace the file");
    })
    .await;
    let replaced = local.path().join("replaced.bin");
    let (ok, stderr) = fs_get(&proxy.url(), &remote, &replaced).await;
    assert!(ok, "fs get failed: {stderr}");
    let got = std::fs::read(&replaced).expect("downloaded");
    assert!(
        got == second,
        "{} bytes starting {:?} and ending {:?}, not the new version",
        got.len(),
        got.first().map(|&b| b as char),
        got.last().map(|&b| b as char)
    );
    assert!(resume_head(&proxy).contains("\r\nif-range: "));
}

async fn put_with(api: &Api, path: &Path, body: &[u8], headers: &[(&str, &str)]) -> Reply {
    let mut request = api
        .request(Method::PUT, &file_route(path))
        .body(body.to_vec());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    Api::send(request).await
}

#[tokio::test]
async fn a_write_with_a_stale_if_match_is_412_and_changes_nothing() {
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("fs-put-if-match");
    let file = dir.write("notes.txt", b"v1");
    let etag = get(&server, &file, &[])
        .await
        .header("etag")
        .expect("etag")
        .to_owned();
    put(&server, &file, b"v2".to_vec()).await;
    // Another writer came in between: the old ETag no longer holds.
    let stale = put_with(&server, &file, b"mine", &[("if-match", &etag)]).await;
    assert_problem(&stale, 412, "precondition-failed");
    assert_eq!(std::fs::read(&file).expect("file"), b"v2");
    let current = get(&server, &file, &[])
        .await
        .header("etag")
        .expect("etag")
        .to_owned();
    put_with(&server, &file, b"mine", &[("if-match", &current)])
        .await
        .assert_status(200);
    assert_eq!(std::fs::read(&file).expect("file"), b"mine");
    // `If-Match: *` needs a file; `If-None-Match: *` creates only.
    let missing = dir.path().join("missing.txt");
    assert_problem(
        &put_with(&server, &missing, b"x", &[("if-match", "*")]).await,
        412,
        "precondition-failed",
    );
    assert!(!missing.exists());
    put_with(&server, &missing, b"new", &[("if-none-match", "*")])
        .await
        .assert_status(200);
    assert_problem(
        &put_with(&server, &missing, b"again", &[("if-none-match", "*")]).await,
        412,
        "precondition-failed",
    );
    assert_eq!(std::fs::read(&missing).expect("created"), b"new");
}
