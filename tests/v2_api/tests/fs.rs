//! The host file system API (research/contract.md, "Host file system"):
//! `/v2/fs/*` and the `_sandboxagent/fs/*` methods, over real HTTP against
//! the real binary, on real files in temp dirs.

use reqwest::Method;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;
use v2_api_tests::agents::TempDir;
use v2_api_tests::ext::{expect_error, expect_result, namespace};
use v2_api_tests::{Api, MOCK, REQUEST_TIMEOUT, Reply, TestServer, assert_problem};

const LIST: &str = "_sandboxagent/fs/list_entries";
const STAT: &str = "_sandboxagent/fs/stat";
const MKDIR: &str = "_sandboxagent/fs/mkdir";
const MOVE: &str = "_sandboxagent/fs/move";
const DELETE: &str = "_sandboxagent/fs/delete_entry";
const INVALID_PARAMS: i64 = -32602;

/// `path` with its query value percent-encoded.
fn q(path: &Path) -> String {
    encode(&path.to_string_lossy())
}

use v2_api_tests::query_path as encode;

async fn send(api: &Api, method: Method, path: &str) -> Reply {
    Api::send(api.request(method, path)).await
}

async fn put(api: &Api, path: &str, body: impl Into<reqwest::Body>) -> Reply {
    Api::send(
        api.request(Method::PUT, &format!("/v2/fs/file?path={}", encode(path)))
            .body(body),
    )
    .await
}

async fn get_file(api: &Api, path: &str) -> Reply {
    send(
        api,
        Method::GET,
        &format!("/v2/fs/file?path={}", encode(path)),
    )
    .await
}

async fn move_entry(api: &Api, body: Value) -> Reply {
    Api::send(
        api.request(Method::POST, "/v2/fs/move")
            .header("content-type", "application/json")
            .body(body.to_string()),
    )
    .await
}

async fn upload_batch(api: &Api, dir: &str, archive: Vec<u8>) -> Reply {
    Api::send(
        api.request(
            Method::POST,
            &format!("/v2/fs/upload-batch?path={}", encode(dir)),
        )
        .header("content-type", "application/x-tar")
        .body(archive),
    )
    .await
}

/// The JSON-RPC error's `data.type` kind (after the URN prefix).
fn rpc_problem(response: &Value) -> String {
    let error = expect_error(response, INVALID_PARAMS);
    error["data"]["type"]
        .as_str()
        .unwrap_or_else(|| panic!("no data.type: {response}"))
        .trim_start_matches("urn:sandbox-agent:error:")
        .to_owned()
}

/// Names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The `name`s of a `{entries}` answer.
fn entry_names(list: &Value) -> Vec<String> {
    list["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("no entries: {list}"))
        .iter()
        .map(|e| e["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn tar(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    build(&mut builder);
    builder.into_inner().expect("tar")
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).expect("gzip");
    gz.finish().expect("gzip")
}

fn file_entry(builder: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]) {
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    builder
        .append_data(&mut header, path, data)
        .expect("append");
}

/// An entry with raw header fields (unsafe names allowed).
fn raw_entry(builder: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, path: &str, link: &str) {
    let mut header = tar::Header::new_gnu();
    header.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
    header.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
    header.set_entry_type(kind);
    header.set_mode(0o644);
    let data: &[u8] = if kind == tar::EntryType::Regular {
        b"bad"
    } else {
        b""
    };
    header.set_size(data.len() as u64);
    header.set_cksum();
    builder.append(&header, data).expect("append");
}

#[tokio::test]
async fn every_operation_works_over_http() {
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("fs-http");
    let root = dir.path().canonicalize().expect("canonical");
    let sub = root.join("a/b");

    let made = server
        .request(Method::POST, &format!("/v2/fs/mkdir?path={}", q(&sub)))
        .send()
        .await
        .expect("mkdir");
    assert_eq!(made.status(), 200);
    let made: Value = made.json().await.expect("json");
    assert_eq!(made["path"], json!(sub.to_string_lossy()));
    assert!(sub.is_dir());
    // Idempotent.
    send(
        &server,
        Method::POST,
        &format!("/v2/fs/mkdir?path={}", q(&sub)),
    )
    .await
    .assert_status(200);

    let file = sub.join("hello.txt");
    let written = put(&server, &file.to_string_lossy(), "hello world").await;
    written.assert_status(200);
    let body = written.json();
    assert_eq!(body["path"], json!(file.to_string_lossy()));
    assert_eq!(body["bytes_written"], 11);
    assert_eq!(body["bytesWritten"], 11);
    assert_eq!(std::fs::read(&file).expect("file"), b"hello world");

    let read = get_file(&server, &file.to_string_lossy()).await;
    read.assert_status(200);
    assert_eq!(read.body.as_ref(), b"hello world");
    assert_eq!(read.header("content-length"), Some("11"));
    assert_eq!(read.header("accept-ranges"), Some("bytes"));

    let stat = server
        .get_json(&format!("/v2/fs/stat?path={}", q(&file)))
        .await;
    assert_eq!(stat["name"], "hello.txt");
    assert_eq!(stat["path"], json!(file.to_string_lossy()));
    assert_eq!(stat["size"], 11);
    assert_eq!(stat["entry_type"], "file");
    assert_eq!(stat["entryType"], "file");
    assert!(
        stat["modified"]
            .as_str()
            .is_some_and(v2_api_tests::ext::is_rfc3339),
        "{stat}"
    );

    let list = server
        .get_json(&format!("/v2/fs/entries?path={}", q(&root.join("a"))))
        .await;
    assert_eq!(entry_names(&list), ["b"]);
    assert_eq!(list["entries"][0]["entry_type"], "directory");
    assert_eq!(list["entries"][0]["entryType"], "directory");

    let to = root.join("moved.txt");
    let moved = move_entry(
        &server,
        json!({"from": file.to_string_lossy(), "to": to.to_string_lossy()}),
    )
    .await;
    moved.assert_status(200);
    assert_eq!(
        moved.json(),
        json!({"from": file.to_string_lossy(), "to": to.to_string_lossy()})
    );
    assert!(!file.exists());
    assert_eq!(std::fs::read(&to).expect("moved"), b"hello world");

    let deleted = send(
        &server,
        Method::DELETE,
        &format!("/v2/fs/entry?path={}", q(&to)),
    )
    .await;
    deleted.assert_status(200);
    assert_eq!(deleted.json(), json!({"path": to.to_string_lossy()}));
    assert!(!to.exists());
    send(
        &server,
        Method::DELETE,
        &format!("/v2/fs/entry?path={}&recursive=true", q(&root.join("a"))),
    )
    .await
    .assert_status(200);
    assert!(names(&root).is_empty());

    // A missing file is a 404 problem.
    let missing = get_file(&server, &root.join("nope").to_string_lossy()).await;
    assert_problem(&missing, 404, "file-not-found");
}

#[tokio::test]
async fn every_operation_works_over_rpc_and_is_advertised() {
    let server = TestServer::start(&[]).await;
    let init = server.initialize_reply(MOCK).await;
    let conn = init.connection_id().expect("connection id");
    let init = init.json();
    let extensions = &namespace(&init["result"]["agentCapabilities"])["extensions"];
    for (flag, method) in [
        ("fsListEntries", LIST),
        ("fsStat", STAT),
        ("fsMkdir", MKDIR),
        ("fsMove", MOVE),
        ("fsDeleteEntry", DELETE),
    ] {
        assert_eq!(extensions[flag], true, "{extensions}");
        assert!(
            extensions["methods"]
                .as_array()
                .is_some_and(|m| m.contains(&json!(method))),
            "{extensions}"
        );
    }
    let dir = TempDir::new("fs-rpc");
    let root = dir.path().canonicalize().expect("canonical");
    let sub = root.join("x/y");

    let made = server
        .rpc(&conn, 1, MKDIR, json!({"path": sub.to_string_lossy()}))
        .await;
    assert_eq!(expect_result(&made)["path"], json!(sub.to_string_lossy()));
    assert!(sub.is_dir());
    std::fs::write(sub.join("f.txt"), b"abc").expect("write");

    let stat = server
        .rpc(
            &conn,
            2,
            STAT,
            json!({"path": sub.join("f.txt").to_string_lossy()}),
        )
        .await;
    let stat = expect_result(&stat);
    assert_eq!(stat["size"], 3);
    assert_eq!(stat["entry_type"], "file");
    assert_eq!(stat["entryType"], "file");

    let list = server
        .rpc(&conn, 3, LIST, json!({"path": sub.to_string_lossy()}))
        .await;
    assert_eq!(entry_names(expect_result(&list)), ["f.txt"]);

    let to = root.join("g.txt");
    let moved = server
        .rpc(
            &conn,
            4,
            MOVE,
            json!({"from": sub.join("f.txt").to_string_lossy(), "to": to.to_string_lossy()}),
        )
        .await;
    assert_eq!(expect_result(&moved)["to"], json!(to.to_string_lossy()));
    assert_eq!(std::fs::read(&to).expect("moved"), b"abc");

    let deleted = server
        .rpc(
            &conn,
            5,
            DELETE,
            json!({"path": root.join("x").to_string_lossy(), "recursive": true}),
        )
        .await;
    expect_result(&deleted);
    assert_eq!(names(&root), ["g.txt"]);

    // Errors carry the same problem type as over HTTP.
    let missing = server
        .rpc(
            &conn,
            6,
            STAT,
            json!({"path": root.join("nope").to_string_lossy()}),
        )
        .await;
    assert_eq!(rpc_problem(&missing), "file-not-found");
    let error = &missing["error"]["data"];
    assert_eq!(error["status"], 404);
}

#[tokio::test]
async fn relative_paths_start_at_the_session_cwd_or_the_server_cwd() {
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("fs-relative");
    let root = dir.path().canonicalize().expect("canonical");
    let conn = server.initialize(MOCK).await;
    let created = server
        .rpc(
            &conn,
            1,
            "session/new",
            v2_api_tests::ext::new_session_params(MOCK, &root.to_string_lossy(), &json!({})),
        )
        .await;
    let session = expect_result(&created)["sessionId"]
        .as_str()
        .expect("session id")
        .to_owned();

    // HTTP, both spellings of the session parameter.
    for (key, name) in [("sessionId", "one.txt"), ("session_id", "two.txt")] {
        let reply = Api::send(
            server
                .request(
                    Method::PUT,
                    &format!("/v2/fs/file?path=sub/{name}&{key}={}", encode(&session)),
                )
                .body("x"),
        )
        .await;
        reply.assert_status(200);
        assert_eq!(
            reply.json()["path"],
            json!(root.join("sub").join(name).to_string_lossy())
        );
    }
    // RPC, both spellings.
    for (id, key) in [(2, "sessionId"), (3, "session_id")] {
        let list = server
            .rpc(&conn, id, LIST, json!({"path": "sub", key: session}))
            .await;
        assert_eq!(entry_names(expect_result(&list)), ["one.txt", "two.txt"]);
    }
    let list = server
        .rpc(&conn, 4, LIST, json!({"sessionId": session}))
        .await;
    assert_eq!(entry_names(expect_result(&list)), ["sub"]);

    // Without a session: the server's working directory.
    let cwd = std::fs::read_link(format!("/proc/{}/cwd", server.pid())).expect("server cwd");
    let stat = server.get_json("/v2/fs/stat?path=Cargo.toml").await;
    assert_eq!(
        stat["path"],
        json!(cwd.join("Cargo.toml").to_string_lossy())
    );

    // Unknown session: 404 on both surfaces.
    let unknown = send(&server, Method::GET, "/v2/fs/entries?path=.&sessionId=nope").await;
    assert_problem(&unknown, 404, "unknown-session");
    let unknown = server
        .rpc(&conn, 5, LIST, json!({"path": ".", "sessionId": "nope"}))
        .await;
    assert_eq!(rpc_problem(&unknown), "unknown-session");

    // `..` in a relative path: 400 on both surfaces, nothing written.
    let climbing = put(&server, "../escape.txt", "x").await;
    assert_problem(&climbing, 400, "invalid-path");
    let climbing = server
        .rpc(
            &conn,
            6,
            STAT,
            json!({"path": "sub/../..", "sessionId": session}),
        )
        .await;
    assert_eq!(rpc_problem(&climbing), "invalid-path");
    assert!(!cwd.join("..").join("escape.txt").exists());
}

/// A server confined to `root` with `--fs-root`, and a secret outside it.
struct Confined {
    server: TestServer,
    _dir: TempDir,
    root: PathBuf,
    outside: PathBuf,
}

async fn confined() -> Confined {
    let dir = TempDir::new("fs-root");
    let base = dir.path().canonicalize().expect("canonical");
    let root = base.join("root");
    let outside = base.join("outside");
    std::fs::create_dir_all(root.join("inside")).expect("root");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(outside.join("secret"), b"secret").expect("secret");
    std::fs::write(root.join("inside/f"), b"inside").expect("inside");
    std::os::unix::fs::symlink(&outside, root.join("link-out")).expect("link");
    std::os::unix::fs::symlink(outside.join("secret"), root.join("file-out")).expect("link");
    std::os::unix::fs::symlink("inside/f", root.join("file-in")).expect("link");
    let server = TestServer::start(&["--fs-root", &root.to_string_lossy()]).await;
    Confined {
        server,
        _dir: dir,
        root,
        outside,
    }
}

#[tokio::test]
async fn fs_root_confines_every_path_after_symlinks() {
    let Confined {
        server,
        _dir,
        root,
        outside,
    } = confined().await;
    let escapes = [
        outside.join("secret"),
        root.join("..").join("outside").join("secret"),
        root.join("link-out").join("secret"),
        root.join("file-out"),
    ];
    for escape in &escapes {
        let path = escape.to_string_lossy();
        assert_problem(&get_file(&server, &path).await, 403, "outside-root");
        assert_problem(
            &send(
                &server,
                Method::GET,
                &format!("/v2/fs/stat?path={}", q(escape)),
            )
            .await,
            403,
            "outside-root",
        );
        assert_problem(&put(&server, &path, "pwned").await, 403, "outside-root");
    }
    for escape in [root.join("link-out"), outside.clone(), root.join("..")] {
        assert_problem(
            &send(
                &server,
                Method::GET,
                &format!("/v2/fs/entries?path={}", q(&escape)),
            )
            .await,
            403,
            "outside-root",
        );
        assert_problem(
            &send(
                &server,
                Method::POST,
                &format!("/v2/fs/mkdir?path={}", q(&escape.join("new"))),
            )
            .await,
            403,
            "outside-root",
        );
        assert_problem(
            &upload_batch(
                &server,
                &escape.join("up").to_string_lossy(),
                tar(|b| file_entry(b, "x", b"x")),
            )
            .await,
            403,
            "outside-root",
        );
    }
    assert_problem(
        &move_entry(
            &server,
            json!({"from": root.join("inside/f").to_string_lossy(), "to": root.join("link-out/f").to_string_lossy()}),
        )
        .await,
        403,
        "outside-root",
    );
    assert_problem(
        &send(
            &server,
            Method::DELETE,
            &format!("/v2/fs/entry?path={}&recursive=true", q(&root)),
        )
        .await,
        403,
        "outside-root",
    );
    // Over RPC too.
    let conn = server.initialize(MOCK).await;
    let denied = server
        .rpc(
            &conn,
            1,
            LIST,
            json!({"path": root.join("link-out").to_string_lossy()}),
        )
        .await;
    assert_eq!(rpc_problem(&denied), "outside-root");
    let error = &denied["error"]["data"];
    assert_eq!(error["status"], 403);

    assert_eq!(names(&outside), ["secret"]);
    assert_eq!(
        std::fs::read(outside.join("secret")).expect("secret"),
        b"secret"
    );

    // Inside the root everything works, through links that stay inside too.
    let read = get_file(&server, &root.join("file-in").to_string_lossy()).await;
    read.assert_status(200);
    assert_eq!(read.body.as_ref(), b"inside");
    let list = server
        .get_json(&format!("/v2/fs/entries?path={}", q(&root)))
        .await;
    assert_eq!(
        entry_names(&list),
        ["file-in", "file-out", "inside", "link-out"]
    );
    let by_name = |name: &str| {
        list["entries"]
            .as_array()
            .and_then(|e| e.iter().find(|e| e["name"] == name))
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(by_name("file-in")["entry_type"], "file");
    assert_eq!(by_name("file-in")["symlinkTarget"], "inside/f");
    // A link out of the root is listed as a link, not followed.
    assert_eq!(by_name("link-out")["entry_type"], "symlink");
    assert_eq!(by_name("file-out")["size"], 0);
    // Deleting the link itself is fine; its target stays.
    send(
        &server,
        Method::DELETE,
        &format!("/v2/fs/entry?path={}", q(&root.join("link-out"))),
    )
    .await
    .assert_status(200);
    assert!(outside.join("secret").exists());
}

#[tokio::test]
async fn a_symlink_swapped_in_during_requests_never_escapes_the_root() {
    let Confined {
        server,
        _dir,
        root,
        outside,
    } = confined().await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let stop = stop.clone();
        let (dir, parked, outside) = (root.join("inside"), root.join("parked"), outside.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Half of the time a link out, half the real directory.
                let _ = std::fs::rename(&dir, &parked);
                let _ = std::os::unix::fs::symlink(&outside, &dir);
                std::thread::sleep(Duration::from_micros(500));
                let _ = std::fs::remove_file(&dir);
                let _ = std::fs::rename(&parked, &dir);
                std::thread::sleep(Duration::from_micros(500));
            }
        })
    };
    let target = root.join("inside/f").to_string_lossy().into_owned();
    let secret = outside.join("secret").to_string_lossy().into_owned();
    let mut served = 0;
    for _ in 0..300 {
        let read = get_file(&server, &target).await;
        assert_ne!(
            read.body.as_ref(),
            b"secret",
            "read through the swapped link"
        );
        served += usize::from(read.status == 200);
        // Writes through the swapped directory must not land outside either.
        let _ = put(&server, &target, "inside").await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    swapper.join().expect("swapper");
    assert_eq!(std::fs::read(&secret).expect("secret"), b"secret");
    assert_eq!(names(&outside), ["secret"]);
    assert!(served > 0, "no read got through at all");
}

#[tokio::test]
async fn range_reads_validators_and_not_modified() {
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("fs-range");
    let file = dir.write("data.bin", b"0123456789abcdefghij");
    let path = format!("/v2/fs/file?path={}", q(&file));

    let partial = Api::send(
        server
            .request(Method::GET, &path)
            .header("range", "bytes=5-9"),
    )
    .await;
    partial.assert_status(206);
    assert_eq!(partial.body.as_ref(), b"56789");
    assert_eq!(partial.header("content-range"), Some("bytes 5-9/20"));
    assert_eq!(partial.header("content-length"), Some("5"));
    let tail = Api::send(
        server
            .request(Method::GET, &path)
            .header("range", "bytes=-4"),
    )
    .await;
    tail.assert_status(206);
    assert_eq!(tail.body.as_ref(), b"ghij");
    let open = Api::send(
        server
            .request(Method::GET, &path)
            .header("range", "bytes=15-"),
    )
    .await;
    open.assert_status(206);
    assert_eq!(open.body.as_ref(), b"fghij");

    let past = Api::send(
        server
            .request(Method::GET, &path)
            .header("range", "bytes=20-"),
    )
    .await;
    assert_problem(&past, 416, "range-not-satisfiable");
    assert_eq!(past.header("content-range"), Some("bytes */20"));

    let whole = get_file(&server, &file.to_string_lossy()).await;
    whole.assert_status(200);
    let etag = whole.header("etag").expect("etag").to_owned();
    let modified = whole.header("last-modified").expect("last-modified");
    assert!(modified.ends_with(" GMT"), "{modified}");
    let again = Api::send(
        server
            .request(Method::GET, &path)
            .header("if-none-match", &etag),
    )
    .await;
    again.assert_status(304);
    assert!(again.body.is_empty());
    // A rewrite changes the validator.
    put(&server, &file.to_string_lossy(), "new")
        .await
        .assert_status(200);
    let fresh = Api::send(
        server
            .request(Method::GET, &path)
            .header("if-none-match", &etag),
    )
    .await;
    fresh.assert_status(200);
    assert_eq!(fresh.body.as_ref(), b"new");
}

/// Sends a PUT head announcing `declared` bytes plus `sent` of them, then
/// closes the socket.
fn abandoned_put(addr: &str, path: &Path, declared: usize, sent: usize) {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        stream,
        "PUT /v2/fs/file?path={} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: {declared}\r\n\r\n",
        q(path)
    )
    .expect("head");
    stream
        .write_all(&vec![b'n'; sent])
        .expect("part of the body");
    stream.flush().expect("flush");
    std::thread::sleep(Duration::from_millis(200));
    drop(stream);
}

#[tokio::test]
async fn an_interrupted_upload_leaves_the_old_file_and_no_temp_file() {
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("fs-interrupted");
    let file = dir.write("keep.txt", b"old contents");
    let addr = server.addr().to_owned();
    let target = file.clone();
    tokio::task::spawn_blocking(move || abandoned_put(&addr, &target, 10_000_000, 100_000))
        .await
        .expect("client");
    let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
    while names(dir.path()) != ["keep.txt"] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "temp file left behind: {:?}",
            names(dir.path())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(std::fs::read(&file).expect("old file"), b"old contents");
}

#[tokio::test]
async fn concurrent_writers_to_one_path_leave_one_whole_file() {
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("fs-concurrent");
    let file = dir.path().join("shared.bin");
    let size = 2 * 1024 * 1024;
    let writers: Vec<_> = (0..8u8)
        .map(|n| {
            let api = server.api();
            let path = file.to_string_lossy().into_owned();
            tokio::spawn(async move { put(&api, &path, vec![b'a' + n; size]).await })
        })
        .collect();
    for writer in writers {
        writer.await.expect("writer").assert_status(200);
    }
    let contents = std::fs::read(&file).expect("file");
    assert_eq!(contents.len(), size);
    let first = contents[0];
    assert!(contents.iter().all(|&b| b == first), "torn file");
    assert_eq!(names(dir.path()), ["shared.bin"]);
}

#[tokio::test]
async fn upload_batch_unpacks_tar_and_gzip_and_refuses_hostile_archives() {
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("fs-batch");
    let base = dir.path().canonicalize().expect("canonical");

    let project = tar(|b| {
        file_entry(b, "src/main.rs", b"fn main() {}");
        file_entry(b, "README.md", b"hi");
    });
    for (name, archive) in [("plain", project.clone()), ("gz", gzip(&project))] {
        let target = base.join(name).join("project");
        let reply = upload_batch(&server, &target.to_string_lossy(), archive).await;
        reply.assert_status(200);
        let body = reply.json();
        assert_eq!(
            body,
            json!({
                "paths": [
                    target.join("src/main.rs").to_string_lossy(),
                    target.join("README.md").to_string_lossy(),
                ],
                "truncated": false,
            })
        );
        assert_eq!(
            std::fs::read(target.join("src/main.rs")).expect("unpacked"),
            b"fn main() {}"
        );
    }

    let hostile: [(&str, Vec<u8>); 5] = [
        (
            "absolute",
            tar(|b| raw_entry(b, tar::EntryType::Regular, "/tmp/sa-evil", "")),
        ),
        (
            "dotdot",
            tar(|b| raw_entry(b, tar::EntryType::Regular, "../evil", "")),
        ),
        (
            "link-absolute",
            tar(|b| raw_entry(b, tar::EntryType::Symlink, "l", "/etc")),
        ),
        (
            "link-out",
            tar(|b| raw_entry(b, tar::EntryType::Symlink, "a/l", "../../..")),
        ),
        (
            "not-a-tar",
            b"this is not an archive at all, not even close to one".repeat(20),
        ),
    ];
    for (name, archive) in hostile {
        let target = base.join("hostile").join(name);
        let reply = upload_batch(&server, &target.to_string_lossy(), archive).await;
        assert_problem(&reply, 400, "invalid-archive");
    }
    assert!(!Path::new("/tmp/sa-evil").exists());
    assert!(!base.join("hostile/evil").exists());

    // Device files are skipped, not created.
    let devices = tar(|b| {
        raw_entry(b, tar::EntryType::Char, "null", "");
        raw_entry(b, tar::EntryType::Fifo, "fifo", "");
        file_entry(b, "ok", b"ok");
    });
    let target = base.join("devices");
    let reply = upload_batch(&server, &target.to_string_lossy(), devices).await;
    reply.assert_status(200);
    assert_eq!(names(&target), ["ok"]);

    // 10,000 entries unpack; the answer lists the first 1000.
    let many = gzip(&tar(|b| {
        for n in 0..10_000 {
            file_entry(b, &format!("d{}/f{n}", n % 10), b"");
        }
    }));
    let target = base.join("many");
    let reply = upload_batch(&server, &target.to_string_lossy(), many).await;
    reply.assert_status(200);
    let body = reply.json();
    assert_eq!(body["truncated"], true);
    assert_eq!(body["paths"].as_array().map(Vec::len), Some(1000));
    assert_eq!(names(&target.join("d3")).len(), 1000);
}

#[tokio::test]
async fn upload_caps_hold_with_max_upload_bytes() {
    let server = TestServer::start(&[
        "--max-upload-bytes",
        "100000",
        "--max-unpacked-bytes",
        "100000",
    ])
    .await;
    let dir = TempDir::new("fs-caps");
    let file = dir.write("keep.txt", b"old");

    // Declared too large: refused before reading.
    let reply = put(&server, &file.to_string_lossy(), vec![b'x'; 100_001]).await;
    assert_problem(&reply, 413, "payload-too-large");
    // Streamed without a length: cut off past the cap.
    let chunks = futures::stream::iter(
        (0..20).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'y'; 10_000]))),
    );
    let reply = put(
        &server,
        &file.to_string_lossy(),
        reqwest::Body::wrap_stream(chunks),
    )
    .await;
    assert_problem(&reply, 413, "payload-too-large");
    assert_eq!(std::fs::read(&file).expect("old"), b"old");
    assert_eq!(names(dir.path()), ["keep.txt"]);
    // At the cap it is fine.
    put(&server, &file.to_string_lossy(), vec![b'x'; 100_000])
        .await
        .assert_status(200);

    // A gzip bomb: 10 MB of zeros in a few KB; the unpacked size is capped.
    let bomb = gzip(&tar(|b| file_entry(b, "zeros", &vec![0; 10_000_000])));
    assert!(bomb.len() < 100_000, "bomb is {} bytes", bomb.len());
    let target = dir.path().join("bomb");
    let reply = upload_batch(&server, &target.to_string_lossy(), bomb).await;
    assert_problem(&reply, 413, "payload-too-large");
    assert!(!target.join("zeros").exists());
}

#[tokio::test]
async fn conflicts_are_409_with_their_own_types() {
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("fs-conflicts");
    let file = dir.write("file.txt", b"x");
    let other = dir.write("other.txt", b"y");
    let sub = dir.path().join("sub");
    std::fs::create_dir_all(sub.join("inner")).expect("dirs");

    let exists = move_entry(
        &server,
        json!({"from": file.to_string_lossy(), "to": other.to_string_lossy()}),
    )
    .await;
    assert_problem(&exists, 409, "already-exists");
    assert_eq!(std::fs::read(&other).expect("other"), b"y");
    move_entry(
        &server,
        json!({"from": file.to_string_lossy(), "to": other.to_string_lossy(), "overwrite": true}),
    )
    .await
    .assert_status(200);
    assert_eq!(std::fs::read(&other).expect("other"), b"x");

    let mkdir_over_file = send(
        &server,
        Method::POST,
        &format!("/v2/fs/mkdir?path={}", q(&other)),
    )
    .await;
    assert_problem(&mkdir_over_file, 409, "already-exists");
    let not_empty = send(
        &server,
        Method::DELETE,
        &format!("/v2/fs/entry?path={}", q(&sub)),
    )
    .await;
    assert_problem(&not_empty, 409, "directory-not-empty");
    assert!(sub.join("inner").is_dir());
    assert_problem(
        &get_file(&server, &sub.to_string_lossy()).await,
        409,
        "is-a-directory",
    );
    assert_problem(
        &put(&server, &sub.to_string_lossy(), "x").await,
        409,
        "is-a-directory",
    );
    assert_problem(
        &send(
            &server,
            Method::GET,
            &format!("/v2/fs/entries?path={}", q(&other)),
        )
        .await,
        409,
        "not-a-directory",
    );
    let conn = server.initialize(MOCK).await;
    let not_empty = server
        .rpc(&conn, 1, DELETE, json!({"path": sub.to_string_lossy()}))
        .await;
    assert_eq!(rpc_problem(&not_empty), "directory-not-empty");
}

#[tokio::test]
async fn permission_denied_is_403() {
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("fs-denied");
    // Root passes permission bits; sysfs refuses it directories all the same.
    let is_root =
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").expect("proc")) == 0;
    let denied = if is_root {
        PathBuf::from("/sys/sandbox-agent-test")
    } else {
        let locked = dir.path().join("locked");
        std::fs::create_dir(&locked).expect("dir");
        std::fs::set_permissions(&locked, std::os::unix::fs::PermissionsExt::from_mode(0o500))
            .expect("chmod");
        locked.join("new")
    };
    let reply = send(
        &server,
        Method::POST,
        &format!("/v2/fs/mkdir?path={}", q(&denied)),
    )
    .await;
    assert_problem(&reply, 403, "permission-denied");
}

#[tokio::test]
async fn every_fs_route_requires_the_bearer_token_and_speaks_cors() {
    let server = TestServer::start(&[
        "--token",
        "secret-token",
        "--cors-allow-origin",
        "https://app.example",
    ])
    .await;
    let dir = TempDir::new("fs-auth");
    let file = dir.write("f.txt", b"data");
    let p = q(&file);
    let routes = [
        (
            Method::GET,
            format!("/v2/fs/entries?path={}", q(dir.path())),
        ),
        (Method::GET, format!("/v2/fs/stat?path={p}")),
        (Method::POST, format!("/v2/fs/mkdir?path={p}.d")),
        (Method::POST, "/v2/fs/move".to_owned()),
        (Method::DELETE, format!("/v2/fs/entry?path={p}")),
        (Method::GET, format!("/v2/fs/file?path={p}")),
        (Method::PUT, format!("/v2/fs/file?path={p}")),
        (Method::POST, format!("/v2/fs/upload-batch?path={p}.d")),
    ];
    for (method, path) in &routes {
        let reply = Api::send(server.http().request(method.clone(), server.url(path))).await;
        assert_problem(&reply, 401, "unauthorized");
    }
    assert_eq!(names(dir.path()), ["f.txt"]);
    assert_eq!(std::fs::read(&file).expect("file"), b"data");

    let preflight = Api::send(
        server
            .http()
            .request(Method::OPTIONS, server.url("/v2/fs/file"))
            .header("origin", "https://app.example")
            .header("access-control-request-method", "PUT"),
    )
    .await;
    let methods = preflight
        .header("access-control-allow-methods")
        .unwrap_or_default();
    assert!(methods.contains("PUT"), "{methods}");
    let read = Api::send(
        server
            .request(Method::GET, &format!("/v2/fs/file?path={p}"))
            .header("origin", "https://app.example"),
    )
    .await;
    read.assert_status(200);
    assert_eq!(
        read.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    let exposed = read
        .header("access-control-expose-headers")
        .unwrap_or_default();
    assert!(
        exposed.contains("etag") && exposed.contains("content-range"),
        "{exposed}"
    );
}

/// Resident set size of `pid`, in bytes (`/proc/<pid>/status`, `VmRSS`).
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[tokio::test]
async fn a_gibibyte_streams_both_ways_in_constant_server_memory() {
    const SIZE: u64 = 1 << 30;
    const CHUNK: usize = 1 << 20;
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("fs-gib");
    let file = dir.path().join("big.bin");
    let before = rss(server.pid());
    let pid = server.pid();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before));
    let sampling = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss(pid), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    // Upload from a generator: byte i of the file is (i / CHUNK) as u8.
    let chunks = futures::stream::iter(
        (0..SIZE / CHUNK as u64)
            .map(|n| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![n as u8; CHUNK]))),
    );
    let upload = server
        .request(Method::PUT, &format!("/v2/fs/file?path={}", q(&file)))
        .body(reqwest::Body::wrap_stream(chunks));
    let reply = Api::send_within(upload, Duration::from_secs(300)).await;
    reply.assert_status(200);
    assert_eq!(reply.json()["bytes_written"], SIZE);

    // Download and check every chunk without keeping it.
    let download = async {
        let mut response = server
            .request(Method::GET, &format!("/v2/fs/file?path={}", q(&file)))
            .send()
            .await
            .expect("download");
        assert_eq!(response.status(), 200);
        let mut offset = 0u64;
        while let Some(chunk) = response.chunk().await.expect("chunk") {
            for (i, byte) in chunk.iter().enumerate() {
                let expected = ((offset + i as u64) / CHUNK as u64) as u8;
                assert_eq!(*byte, expected, "byte {}", offset + i as u64);
            }
            offset += chunk.len() as u64;
        }
        offset
    };
    let read = tokio::time::timeout(Duration::from_secs(300), download)
        .await
        .expect("download in time");
    assert_eq!(read, SIZE);
    sampling.abort();
    let growth = peak
        .load(std::sync::atomic::Ordering::Relaxed)
        .saturating_sub(before);
    assert!(growth < 32 << 20, "server RSS grew by {growth} bytes");
    let mut first = [0u8; 4];
    std::fs::File::open(&file)
        .and_then(|mut f| f.read_exact(&mut first))
        .expect("file");
    assert_eq!(first, [0; 4]);
}

/// Runs `sandbox-agent fs <args> --url <server>`; stdout on success.
async fn fs_cli(server: &TestServer, args: &[&str]) -> String {
    let mut command = v2_api_tests::server::sandbox_agent_command();
    command
        .arg("fs")
        .args(args)
        .args(["--url", server.base_url()])
        .stdin(std::process::Stdio::null());
    let output = tokio::time::timeout(
        REQUEST_TIMEOUT,
        tokio::task::spawn_blocking(move || command.output()),
    )
    .await
    .expect("fs command in time")
    .expect("join")
    .expect("run sandbox-agent fs");
    assert!(
        output.status.success(),
        "sandbox-agent fs {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn the_fs_command_moves_files_in_and_out() {
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("fs-cli");
    let remote = dir.path().canonicalize().expect("canonical").join("remote");
    let local = TempDir::new("fs-cli-local");
    std::fs::create_dir_all(local.path().join("tree/sub")).expect("tree");
    std::fs::write(local.path().join("tree/sub/a.txt"), b"tree file").expect("a");
    let upload = local.write("one.bin", b"single file");
    let r = |name: &str| remote.join(name).to_string_lossy().into_owned();

    fs_cli(&server, &["mkdir", &r("")]).await;
    let put = fs_cli(&server, &["put", &upload.to_string_lossy(), &r("one.bin")]).await;
    assert!(put.contains("11 bytes"), "{put}");
    let tree = fs_cli(
        &server,
        &[
            "upload",
            &local.path().join("tree").to_string_lossy(),
            &r("tree"),
        ],
    )
    .await;
    assert!(tree.contains(&r("tree/sub/a.txt")), "{tree}");
    let got = fs_cli(&server, &["get", &r("tree/sub/a.txt")]).await;
    assert_eq!(got, "tree file");
    let downloaded = local.path().join("back.bin");
    fs_cli(
        &server,
        &["get", &r("one.bin"), &downloaded.to_string_lossy()],
    )
    .await;
    assert_eq!(std::fs::read(&downloaded).expect("back"), b"single file");
    let stat: Value =
        serde_json::from_str(&fs_cli(&server, &["stat", &r("one.bin")]).await).expect("stat json");
    assert_eq!(stat["size"], 11);
    fs_cli(&server, &["mv", &r("one.bin"), &r("two.bin")]).await;
    let listing = fs_cli(&server, &["ls", &r("")]).await;
    assert!(
        listing.contains("two.bin") && listing.contains("tree"),
        "{listing}"
    );
    fs_cli(&server, &["rm", "-r", &r("tree")]).await;
    assert_eq!(names(&remote), ["two.bin"]);
}

/// Unmounts a test tmpfs when dropped (also when the test fails).
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[tokio::test]
async fn a_full_disk_is_507_and_leaves_the_old_file() {
    let dir = TempDir::new("fs-full");
    let small = dir.path().join("small");
    std::fs::create_dir(&small).expect("mount point");
    // A 1 MiB tmpfs needs the right to mount (root in a container); where
    // that is missing there is no full disk to test against.
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&small)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !mounted {
        eprintln!("cannot mount a tmpfs here (needs root): no full disk to test");
        return;
    }
    let _unmount = Unmount(small.clone());
    let server = TestServer::start(&[]).await;
    let file = small.join("keep.txt");
    std::fs::write(&file, b"old").expect("old file");

    let reply = put(&server, &file.to_string_lossy(), vec![7u8; 4 << 20]).await;
    assert_problem(&reply, 507, "insufficient-storage");
    assert_eq!(std::fs::read(&file).expect("old"), b"old");
    assert_eq!(names(&small), ["keep.txt"]);

    let archive = gzip(&tar(|b| file_entry(b, "big", &vec![7u8; 4 << 20])));
    let reply = upload_batch(&server, &small.join("up").to_string_lossy(), archive).await;
    assert_problem(&reply, 507, "insufficient-storage");

    // A disk already full: the failure comes after the whole (small) body
    // was read, when the file is flushed.
    let mut filler = std::fs::File::create(small.join("filler")).expect("filler");
    while filler.write_all(&[1u8; 4096]).is_ok() {}
    drop(filler);
    let reply = put(&server, &small.join("late.txt").to_string_lossy(), "x").await;
    assert_problem(&reply, 507, "insufficient-storage");
    assert!(
        !names(&small).iter().any(|n| n.contains("late.txt")),
        "{:?}",
        names(&small)
    );
    server.health().await.assert_status(200);
}

#[tokio::test]
async fn non_utf8_names_are_listed_with_their_raw_bytes() {
    use std::os::unix::ffi::OsStrExt;
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("fs-non-utf8");
    let name = std::ffi::OsStr::from_bytes(b"caf\xe9 1.txt");
    std::fs::write(dir.path().join(name), b"x").expect("odd name");
    dir.write("plain.txt", b"y");
    let list = server
        .get_json(&format!("/v2/fs/entries?path={}", q(dir.path())))
        .await;
    let entries = list["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), 2, "{list}");
    let odd = entries
        .iter()
        .find(|e| e.get("rawName").is_some())
        .unwrap_or_else(|| panic!("no rawName: {list}"));
    assert_eq!(odd["rawName"], "caf%E9%201.txt");
    assert_eq!(odd["name"], "caf\u{fffd} 1.txt");
    assert_eq!(odd["size"], 1);
    let plain = entries
        .iter()
        .find(|e| e["name"] == "plain.txt")
        .expect("plain");
    assert!(plain.get("rawName").is_none(), "{plain}");
}

/// Without `--fs-root` the file system API reaches every file the server's
/// user can: the server says so once, at start; with `--fs-root`, it does
/// not (research/contract.md, "Host file system").
#[tokio::test]
async fn a_server_without_fs_root_warns_once_at_start() {
    const WARNING: &str = "no --fs-root: the file system API";
    let open = TestServer::start(&[]).await;
    // The warning comes before the start-up line; the inspector's address
    // is logged after it.
    let started = |log: &str| log.contains("inspector: http://");
    open.log_when(started, REQUEST_TIMEOUT).await;
    get_file(&open, "/etc/hostname").await;
    send(&open, Method::GET, "/v2/fs/stat?path=/").await;
    let log = open.stderr_text();
    assert_eq!(log.matches(WARNING).count(), 1, "{log}");
    let line = log
        .lines()
        .find(|line| line.contains(WARNING))
        .unwrap_or_default();
    assert!(
        line.contains("WARN") && line.contains("every file this server's user can"),
        "{line}"
    );

    let root = TempDir::new("fs-root-quiet");
    let confined = TestServer::start(&["--fs-root", root.utf8()]).await;
    let log = confined.log_when(started, REQUEST_TIMEOUT).await;
    assert!(started(&log), "{log}");
    assert!(!log.contains("--fs-root"), "{log}");
}

/// A listing is held whole until the client reads it, so one directory of
/// any size must not make it unbounded: the first 10,000 entries by name,
/// and `truncated` (research/contract.md, "Host file system"). Before, a
/// 100,000-file directory answered 35 MB per listing, and 50 clients that
/// never read held 1.5 GB.
#[tokio::test]
async fn a_listing_stops_at_ten_thousand_entries() {
    let dir = TempDir::new("fs-many");
    let root = dir.path().to_path_buf();
    let big = root.join("big");
    std::fs::create_dir(&big).expect("mkdir");
    for i in 0..10_001 {
        std::fs::write(big.join(format!("f{i:05}")), b"").expect("create");
    }
    let server = TestServer::start(&["--fs-root", &root.to_string_lossy()]).await;
    let list = server
        .get_json(&format!("/v2/fs/entries?path={}", q(&big)))
        .await;
    let names = entry_names(&list);
    assert_eq!(names.len(), 10_000);
    assert_eq!(names.first().map(String::as_str), Some("f00000"));
    assert_eq!(names.last().map(String::as_str), Some("f09999"));
    assert_eq!(list["truncated"], true, "more than the cap is said");
    std::fs::remove_file(big.join("f10000")).expect("remove");
    let list = server
        .get_json(&format!("/v2/fs/entries?path={}", q(&big)))
        .await;
    assert_eq!(entry_names(&list).len(), 10_000);
    assert!(list.get("truncated").is_none(), "{}", list["truncated"]);
}

/// A write never replaces a FIFO (or a device) with a regular file: 400
/// `invalid-path`, and the FIFO is still there (research/contract.md,
/// "Host file system", writes; a PUT to /dev/null once made it a file).
#[tokio::test]
async fn a_write_to_a_fifo_is_refused_and_leaves_it() {
    use std::os::unix::fs::FileTypeExt;
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("fs-fifo");
    let fifo = dir.path().join("pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success());
    let reply = put(&server.api(), &fifo.to_string_lossy(), "bytes").await;
    let problem = assert_problem(&reply, 400, "invalid-path");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("not a regular file")),
        "{problem}"
    );
    let meta = std::fs::symlink_metadata(&fifo).expect("still there");
    assert!(meta.file_type().is_fifo(), "{meta:?}");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .expect("list")
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "no temp file left: {leftovers:?}");
}
