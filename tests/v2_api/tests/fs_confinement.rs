//! `--fs-root` against an attacker (research/contract.md, "Host file
//! system"): links re-aimed by a move, an upload-batch redirected while it
//! streams, another process swapping directories for symlinks, the hard
//! links and caps of upload-batch, and 403s that say nothing about what is
//! outside. Real binary, real HTTP, real files in temp dirs.

use reqwest::Method;
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use v2_api_tests::agents::TempDir;
use v2_api_tests::{Api, Reply, TestServer, assert_problem};

use v2_api_tests::query_path as encode;

fn s(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

async fn send(api: &Api, method: Method, route: &str, path: &Path) -> Reply {
    Api::send(api.request(method, &format!("{route}?path={}", encode(&s(path))))).await
}

async fn upload_batch(api: &Api, dir: &Path, body: impl Into<reqwest::Body>) -> Reply {
    Api::send(
        api.request(
            Method::POST,
            &format!("/v2/fs/upload-batch?path={}", encode(&s(dir))),
        )
        .header("content-type", "application/x-tar")
        .body(body),
    )
    .await
}

async fn move_entry(api: &Api, from: &Path, to: &Path) -> Reply {
    Api::send(
        api.request(Method::POST, "/v2/fs/move")
            .header("content-type", "application/json")
            .body(json!({"from": s(from), "to": s(to)}).to_string()),
    )
    .await
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn header(kind: tar::EntryType, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(0o644);
    header.set_size(size);
    header
}

fn file_entry(builder: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]) {
    let mut header = header(tar::EntryType::Regular, data.len() as u64);
    builder
        .append_data(&mut header, path, data)
        .expect("append");
}

fn link_entry(builder: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, path: &str, to: &str) {
    let mut header = header(kind, 0);
    builder.append_link(&mut header, path, to).expect("link");
}

/// A tar archive; `end` adds the two zero blocks that close it.
fn tar(end: bool, build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    build(&mut builder);
    if end {
        builder.into_inner().expect("tar")
    } else {
        // `get_mut` leaves the archive open: no end blocks yet.
        let bytes = builder.get_mut().clone();
        std::mem::forget(builder);
        bytes
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).expect("gzip");
    gz.finish().expect("gzip")
}

/// A server confined to `base/root`, with `base/outside/secret` beside it.
struct Confined {
    server: TestServer,
    _dir: TempDir,
    root: PathBuf,
    outside: PathBuf,
}

impl Confined {
    async fn start(extra: &[&str]) -> Self {
        let dir = TempDir::new("fs-confinement");
        let base = dir.path().canonicalize().expect("canonical");
        let root = base.join("root");
        let outside = base.join("outside");
        std::fs::create_dir_all(&root).expect("root");
        std::fs::create_dir_all(&outside).expect("outside");
        std::fs::write(outside.join("secret"), b"secret").expect("secret");
        let mut args = vec!["--fs-root".to_owned(), s(&root)];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = TestServer::start(&args).await;
        Self {
            server,
            _dir: dir,
            root,
            outside,
        }
    }

    /// Nothing outside the root was added, removed or changed.
    fn assert_outside_untouched(&self) {
        assert_eq!(names(&self.outside), ["secret"], "outside the root");
        assert_eq!(
            std::fs::read(self.outside.join("secret")).expect("secret"),
            b"secret"
        );
        let parent = self.root.parent().expect("base");
        assert_eq!(names(parent), ["outside", "root"], "beside the root");
    }
}

#[tokio::test]
async fn a_link_re_aimed_by_a_move_is_checked_again_wherever_it_is_used() {
    let c = Confined::start(&[]).await;
    let (server, root) = (&c.server, &c.root);
    // `a/l -> ../outside` lands on ROOT/outside, inside, when unpacked.
    std::fs::create_dir(root.join("outside")).expect("decoy");
    let archive = tar(true, |b| {
        link_entry(b, tar::EntryType::Symlink, "a/l", "../outside");
    });
    upload_batch(server, root, archive).await.assert_status(200);
    // Moved to ROOT/l, the same text points outside the root.
    move_entry(server, &root.join("a/l"), &root.join("l"))
        .await
        .assert_status(200);
    let through = root.join("l");
    let secret = through.join("secret");
    for (method, route, path) in [
        (Method::GET, "/v2/fs/file", &secret),
        (Method::PUT, "/v2/fs/file", &through.join("new")),
        (Method::PUT, "/v2/fs/file", &secret),
        (Method::GET, "/v2/fs/stat", &secret),
        (Method::GET, "/v2/fs/entries", &through),
        (Method::POST, "/v2/fs/mkdir", &through.join("d")),
        (Method::DELETE, "/v2/fs/entry", &secret),
    ] {
        let reply = send(server, method.clone(), route, path).await;
        assert_problem(&reply, 403, "outside-root");
        assert!(
            !reply.text().contains(&s(&c.outside)),
            "{method} {route}: a 403 names the resolved outside path: {}",
            reply.text()
        );
    }
    assert_problem(
        &upload_batch(server, &through, tar(true, |b| file_entry(b, "x", b"x"))).await,
        403,
        "outside-root",
    );
    // Through the link from the root: refused, nothing unpacked through it.
    assert_problem(
        &upload_batch(server, root, tar(true, |b| file_entry(b, "l/x", b"x"))).await,
        400,
        "invalid-archive",
    );
    assert_problem(
        &move_entry(server, &secret, &root.join("stolen")).await,
        403,
        "outside-root",
    );
    c.assert_outside_untouched();
    assert!(!root.join("stolen").exists());
}

/// Streams `first`, waits until `ready` holds, runs `swap`, then streams
/// `rest`; returns the answer.
async fn upload_in_two_parts(
    server: &TestServer,
    dir: &Path,
    first: Vec<u8>,
    rest: Vec<u8>,
    ready: impl Fn() -> bool,
    swap: impl AsyncFnOnce(),
) -> Reply {
    let (sender, receiver) = futures::channel::mpsc::unbounded::<Result<Vec<u8>, std::io::Error>>();
    sender.unbounded_send(Ok(first)).expect("first part");
    let upload = upload_batch(server, dir, reqwest::Body::wrap_stream(receiver));
    let driver = async move {
        let started = Instant::now();
        while !ready() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the first entry never landed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        swap().await;
        sender.unbounded_send(Ok(rest)).expect("rest");
        drop(sender);
    };
    let (reply, ()) = tokio::join!(upload, driver);
    reply
}

#[tokio::test]
async fn an_upload_batch_redirected_while_it_streams_stays_inside_the_root() {
    let c = Confined::start(&[]).await;
    let (server, root) = (&c.server, &c.root);
    let target = root.join("t");
    // The attacker's link, made with API calls alone: inside where it is
    // unpacked, outside once moved to ROOT/t.
    std::fs::create_dir(root.join("outside")).expect("decoy");
    upload_batch(
        server,
        root,
        tar(true, |b| {
            link_entry(b, tar::EntryType::Symlink, "mk/t", "../outside");
        }),
    )
    .await
    .assert_status(200);

    let first = tar(false, |b| file_entry(b, "first", b"1"));
    let rest = tar(true, |b| {
        file_entry(b, "evil", b"pwned");
        file_entry(b, "sub/evil", b"pwned");
    });
    let reply = upload_in_two_parts(
        server,
        &target,
        first,
        rest,
        || std::fs::read(target.join("first")).is_ok_and(|d| d == b"1"),
        async || {
            move_entry(server, &target, &root.join("away"))
                .await
                .assert_status(200);
            move_entry(server, &root.join("mk/t"), &target)
                .await
                .assert_status(200);
        },
    )
    .await;
    // The rest follows the directory it started in, wherever that went.
    reply.assert_status(200);
    assert_eq!(names(&root.join("away")), ["evil", "first", "sub"]);
    assert_eq!(
        std::fs::read(root.join("away/sub/evil")).expect("moved"),
        b"pwned"
    );
    c.assert_outside_untouched();

    // A hard link in the rest may only point to what the archive unpacked.
    let target = root.join("h");
    let first = tar(false, |b| file_entry(b, "first", b"1"));
    let rest = tar(true, |b| {
        link_entry(b, tar::EntryType::Link, "STOLEN", "secret");
    });
    std::fs::remove_file(root.join("t")).expect("old link");
    let reply = upload_in_two_parts(
        server,
        &target,
        first,
        rest,
        || root.join("h/first").exists(),
        async || {
            move_entry(server, &root.join("h"), &root.join("h-away"))
                .await
                .assert_status(200);
            std::os::unix::fs::symlink(&c.outside, root.join("h")).expect("link");
        },
    )
    .await;
    assert_problem(&reply, 400, "invalid-archive");
    c.assert_outside_untouched();
    let stolen = send(server, Method::GET, "/v2/fs/file", &root.join("h/STOLEN")).await;
    assert_problem(&stolen, 403, "outside-root");
}

#[tokio::test]
async fn a_process_swapping_directories_for_symlinks_never_gets_a_batch_outside() {
    let c = Confined::start(&[]).await;
    let root = c.root.clone();
    std::fs::create_dir_all(root.join("inside")).expect("inside");
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = stop.clone();
        let (dir, parked, outside) = (root.join("inside"), root.join("parked"), c.outside.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = std::fs::rename(&dir, &parked);
                let _ = std::os::unix::fs::symlink(&outside, &dir);
                std::thread::sleep(Duration::from_micros(200));
                let _ = std::fs::remove_file(&dir);
                let _ = std::fs::rename(&parked, &dir);
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let archive = tar(true, |b| {
        for n in 0..300 {
            file_entry(b, &format!("d{}/f{n}", n % 3), b"data");
        }
    });
    let started = Instant::now();
    let mut landed = 0;
    for round in 0..100 {
        if started.elapsed() > Duration::from_secs(15) {
            break;
        }
        let target = root.join("inside").join(format!("up{round}"));
        let reply = upload_batch(&c.server, &target, archive.clone()).await;
        landed += usize::from(reply.status == 200);
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().expect("swapper");
    c.assert_outside_untouched();
    assert!(landed > 0, "no batch got through at all");
}

#[tokio::test]
async fn outside_the_root_is_403_whether_or_not_anything_is_there() {
    let c = Confined::start(&[]).await;
    let (server, root, outside) = (&c.server, &c.root, &c.outside);
    std::os::unix::fs::symlink(outside, root.join("link-out")).expect("link");
    for path in [
        outside.join("secret"),
        outside.join("missing"),
        outside.join("missing/deeper"),
        root.join("link-out/secret"),
        root.join("link-out/missing"),
        root.join("../nowhere"),
        PathBuf::from("/"),
    ] {
        for route in ["/v2/fs/stat", "/v2/fs/file", "/v2/fs/entries"] {
            let reply = send(server, Method::GET, route, &path).await;
            assert_problem(&reply, 403, "outside-root");
            let detail = reply.json()["detail"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            assert!(
                detail.contains(&s(&path)),
                "{route} {path:?}: the 403 names the client's path: {detail}"
            );
            if path.starts_with(root) {
                assert!(
                    !detail.contains(&s(outside)),
                    "{route} {path:?}: the 403 shows where the link resolved: {detail}"
                );
            }
        }
    }
    // Inside, a missing path is still 404.
    assert_problem(
        &send(server, Method::GET, "/v2/fs/stat", &root.join("missing")).await,
        404,
        "file-not-found",
    );
}

#[tokio::test]
async fn upload_batch_hard_links_only_to_its_own_files_and_never_through_links() {
    let c = Confined::start(&[]).await;
    let (server, root) = (&c.server, &c.root);
    std::fs::write(root.join("mine"), b"mine").expect("mine");
    let archive = tar(true, |b| {
        file_entry(b, "a", b"shared");
        link_entry(b, tar::EntryType::Link, "b", "a");
    });
    upload_batch(server, &root.join("ok"), archive)
        .await
        .assert_status(200);
    use std::os::unix::fs::MetadataExt;
    let ino = |p: &Path| std::fs::metadata(p).expect("meta").ino();
    assert_eq!(ino(&root.join("ok/a")), ino(&root.join("ok/b")));
    assert_eq!(std::fs::read(root.join("ok/b")).expect("b"), b"shared");

    // A file the archive did not unpack, even inside the target.
    std::fs::create_dir(root.join("pre")).expect("pre");
    std::fs::write(root.join("pre/there"), b"there").expect("there");
    let archive = tar(true, |b| link_entry(b, tar::EntryType::Link, "x", "there"));
    assert_problem(
        &upload_batch(server, &root.join("pre"), archive).await,
        400,
        "invalid-archive",
    );
    assert!(!root.join("pre/x").exists());

    // An existing symlink in the target is never written through, even one
    // that points inside.
    std::fs::create_dir(root.join("dest")).expect("dest");
    std::os::unix::fs::symlink("../pre", root.join("dest/l")).expect("link");
    let archive = tar(true, |b| file_entry(b, "l/new", b"x"));
    assert_problem(
        &upload_batch(server, &root.join("dest"), archive).await,
        400,
        "invalid-archive",
    );
    assert!(!root.join("pre/new").exists());
    // A file entry over an existing symlink replaces the link, not its target.
    let archive = tar(true, |b| file_entry(b, "l", b"replaced"));
    upload_batch(server, &root.join("dest"), archive)
        .await
        .assert_status(200);
    assert!(
        !std::fs::symlink_metadata(root.join("dest/l"))
            .expect("l")
            .is_symlink()
    );
    assert_eq!(
        std::fs::read(root.join("pre/there")).expect("there"),
        b"there"
    );

    // A link that escapes only through another link the archive made is
    // caught, and removed, even though each text stays inside lexically.
    let archive = tar(true, |b| {
        link_entry(b, tar::EntryType::Symlink, "s/up", "..");
        link_entry(b, tar::EntryType::Symlink, "escape", "s/up/..");
    });
    assert_problem(
        &upload_batch(server, &root.join("esc"), archive).await,
        400,
        "invalid-archive",
    );
    assert!(std::fs::symlink_metadata(root.join("esc/escape")).is_err());
    c.assert_outside_untouched();
}

#[tokio::test]
async fn upload_caps_count_the_body_and_what_it_unpacks_separately() {
    let c = Confined::start(&[
        "--max-upload-bytes",
        "100000",
        "--max-unpacked-bytes",
        "1000000",
    ])
    .await;
    let (server, root) = (&c.server, &c.root);
    // 600 KB unpacked from a few KB sent: within both caps.
    let fits = gzip(&tar(true, |b| file_entry(b, "zeros", &vec![0; 600_000])));
    assert!(fits.len() < 100_000);
    upload_batch(server, &root.join("fits"), fits)
        .await
        .assert_status(200);
    assert_eq!(
        std::fs::metadata(root.join("fits/zeros"))
            .expect("zeros")
            .len(),
        600_000
    );
    // A bomb: past the unpacked cap, 413, and the rest is not written.
    let bomb = gzip(&tar(true, |b| {
        file_entry(b, "a", &vec![0; 600_000]);
        file_entry(b, "b", &vec![0; 600_000]);
    }));
    let reply = upload_batch(server, &root.join("bomb"), bomb).await;
    assert_problem(&reply, 413, "payload-too-large");
    assert!(!root.join("bomb/b").exists());
    // The body as sent is capped on its own.
    let big: Vec<u8> = (0..150_000u32).map(|n| (n * 7919 % 251) as u8).collect();
    let sent = tar(true, |b| file_entry(b, "noise", &big));
    assert_problem(
        &upload_batch(server, &root.join("big"), sent).await,
        413,
        "payload-too-large",
    );
}

#[tokio::test]
async fn a_multi_member_gzip_is_read_whole() {
    let c = Confined::start(&[]).await;
    let archive = tar(true, |b| {
        for n in 0..40 {
            file_entry(b, &format!("f{n:02}"), &vec![b'x'; 1000]);
        }
    });
    // Two gzip members, as `cat a.gz b.gz` makes.
    let (front, back) = archive.split_at(archive.len() / 2);
    let mut two = gzip(front);
    two.extend(gzip(back));
    let target = c.root.join("multi");
    let reply = upload_batch(&c.server, &target, two).await;
    reply.assert_status(200);
    let body: Value = reply.json();
    assert_eq!(body["paths"].as_array().map(Vec::len), Some(40), "{body}");
    assert_eq!(names(&target).len(), 40);
}

#[tokio::test]
async fn a_root_replaced_by_a_symlink_is_not_followed() {
    let c = Confined::start(&[]).await;
    let (server, root, outside) = (&c.server, &c.root, &c.outside);
    std::fs::write(root.join("mine"), b"mine").expect("mine");
    send(server, Method::GET, "/v2/fs/file", &root.join("mine"))
        .await
        .assert_status(200);
    // Whoever can write the root's parent swaps the root for a link out.
    let parked = root.with_file_name("root.real");
    std::fs::rename(root, &parked).expect("park the root");
    std::os::unix::fs::symlink(outside, root).expect("link");
    for path in [outside.join("secret"), root.join("secret")] {
        for (method, route) in [
            (Method::GET, "/v2/fs/file"),
            (Method::GET, "/v2/fs/stat"),
            (Method::PUT, "/v2/fs/file"),
        ] {
            let reply = send(server, method.clone(), route, &path).await;
            assert_problem(&reply, 403, "outside-root");
        }
    }
    assert_problem(
        &send(server, Method::GET, "/v2/fs/entries", root).await,
        403,
        "outside-root",
    );
    std::fs::remove_file(root).expect("unlink");
    std::fs::rename(&parked, root).expect("restore the root");
    c.assert_outside_untouched();
}

#[tokio::test]
async fn a_refused_mkdir_creates_nothing() {
    // Without a root: `..` below a directory that does not exist is 400
    // (with one, any `..` is outside: 403), and nothing is made first.
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("fs-mkdir-dotdot");
    let path = dir.path().join("new/../x");
    assert_problem(
        &send(&server, Method::POST, "/v2/fs/mkdir", &path).await,
        400,
        "invalid-path",
    );
    assert_eq!(
        names(dir.path()),
        Vec::<String>::new(),
        "nothing was created"
    );
}

#[tokio::test]
async fn nothing_about_what_is_outside_leaks_through_dot_dot_or_dangling_links() {
    let c = Confined::start(&[]).await;
    let (server, root, outside) = (&c.server, &c.root, &c.outside);
    std::fs::write(root.join("a.txt"), b"hi").expect("a.txt");
    let up = |rest: &str| PathBuf::from(format!("{}/{rest}", s(root)));
    // Out and back in with `..`: the same 403 whatever is on the way.
    for path in [
        up("../outside/../root/a.txt"),
        up("../nope/../root/a.txt"),
        up("../outside/secret/../../root/a.txt"),
        up("../outside/nope/../../root/a.txt"),
        up("sub/../a.txt"),
    ] {
        for route in ["/v2/fs/stat", "/v2/fs/file", "/v2/fs/entries"] {
            assert_problem(
                &send(server, Method::GET, route, &path).await,
                403,
                "outside-root",
            );
        }
    }
    // Dangling links: one whose text leads outside is 403 like an outside
    // path that exists; one inside is a symlink to nothing.
    std::os::unix::fs::symlink(outside.join("missing"), root.join("out-missing")).expect("link");
    std::os::unix::fs::symlink(outside.join("secret"), root.join("out-present")).expect("link");
    std::os::unix::fs::symlink("nowhere", root.join("in-missing")).expect("link");
    for name in ["out-missing", "out-present"] {
        let link = root.join(name);
        for (method, route, path) in [
            (Method::GET, "/v2/fs/stat", link.clone()),
            (Method::GET, "/v2/fs/file", link.clone()),
            (Method::PUT, "/v2/fs/file", link.join("x")),
            (Method::POST, "/v2/fs/mkdir", link.join("d")),
        ] {
            let reply = send(server, method.clone(), route, &path).await;
            assert_problem(&reply, 403, "outside-root");
        }
    }
    let stat = send(server, Method::GET, "/v2/fs/stat", &root.join("in-missing")).await;
    stat.assert_status(200);
    assert_eq!(stat.json()["entry_type"], "symlink", "{}", stat.text());
    assert_problem(
        &send(server, Method::GET, "/v2/fs/file", &root.join("in-missing")).await,
        404,
        "file-not-found",
    );
    let list = send(server, Method::GET, "/v2/fs/entries", root).await;
    list.assert_status(200);
    for entry in list.json()["entries"].as_array().expect("entries") {
        if entry["name"]
            .as_str()
            .is_some_and(|n| n.contains("missing") || n.contains("present"))
        {
            assert_eq!(entry["entry_type"], "symlink", "{entry}");
            assert_eq!(entry["size"], 0, "{entry}");
        }
    }
    // The root itself can be looked at.
    let stat = send(server, Method::GET, "/v2/fs/stat", root).await;
    stat.assert_status(200);
    assert_eq!(stat.json()["entry_type"], "directory", "{}", stat.text());
    // A hard link to itself is an unsafe entry, and the file stays.
    let archive = tar(true, |b| {
        file_entry(b, "f", b"f");
        link_entry(b, tar::EntryType::Link, "f", "f");
    });
    assert_problem(
        &upload_batch(server, &root.join("self"), archive).await,
        400,
        "invalid-archive",
    );
    assert_eq!(std::fs::read(root.join("self/f")).expect("f"), b"f");
    c.assert_outside_untouched();
}

#[tokio::test]
async fn a_session_cwd_or_a_link_text_cannot_walk_outside_and_back() {
    let c = Confined::start(&[]).await;
    let (server, root, outside) = (&c.server, &c.root, &c.outside);
    std::fs::write(root.join("marker"), b"m").expect("marker");
    // A session whose cwd goes out and back in: relative paths are 403.
    let conn = server.initialize(v2_api_tests::MOCK).await;
    let base = root.parent().expect("base");
    for cwd in [
        format!("{}/../root", s(outside)),
        format!("{}/secret/../../root", s(outside)),
        format!("{}/nope/../root", s(base)),
    ] {
        let created = server
            .rpc(
                &conn,
                1,
                "session/new",
                json!({"cwd": cwd, "mcpServers": [],
                       "_meta": {"sandboxagent.dev": {"agent": v2_api_tests::MOCK}}}),
            )
            .await;
        let session = created["result"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("session/new: {created}"));
        let reply = Api::send(server.request(
            Method::GET,
            &format!("/v2/fs/stat?path=marker&sessionId={session}"),
        ))
        .await;
        assert_problem(&reply, 403, "outside-root");
        assert!(
            !reply.text().contains("file-not-found") && !reply.text().contains("not-a-directory"),
            "{cwd}: {}",
            reply.text()
        );
    }
    // A link whose text climbs out of the root and comes back in: 403
    // whatever is on the way (a directory, a file, nothing).
    for (name, probe) in [("d", "outside"), ("f", "outside/secret"), ("n", "nope")] {
        let text = format!("../{probe}/../root/marker");
        let text = if probe.contains('/') {
            format!("../{probe}/../../root/marker")
        } else {
            text
        };
        std::os::unix::fs::symlink(&text, root.join(name)).expect("link");
        for route in ["/v2/fs/stat", "/v2/fs/file"] {
            assert_problem(
                &send(server, Method::GET, route, &root.join(name)).await,
                403,
                "outside-root",
            );
        }
    }
    c.assert_outside_untouched();
}

#[tokio::test]
async fn a_recursive_delete_of_a_very_deep_tree_never_crashes_the_server() {
    use nix::fcntl::{OFlag, openat};
    use nix::sys::stat::{Mode, mkdirat};
    let c = Confined::start(&[]).await;
    // What a process in the sandbox (or enough mkdir and move calls) can
    // build: 25,000 nested directories, then one of 3,000.
    let build = |top: &Path, depth: usize| {
        std::fs::create_dir(top).expect("top");
        let mut fd = openat(
            nix::fcntl::AT_FDCWD,
            top,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY,
            Mode::empty(),
        )
        .expect("open top");
        for _ in 0..depth {
            mkdirat(&fd, "d", Mode::from_bits_truncate(0o755)).expect("mkdir");
            fd = openat(
                &fd,
                "d",
                OFlag::O_DIRECTORY | OFlag::O_RDONLY,
                Mode::empty(),
            )
            .expect("open");
        }
        std::fs::write(
            format!(
                "/proc/self/fd/{}/leaf",
                std::os::fd::AsRawFd::as_raw_fd(&fd)
            ),
            b"x",
        )
        .expect("leaf");
    };
    let deep = c.root.join("deep");
    // Removed by `rm` (not std's recursive walk, which this deep a tree
    // overflows) before the temp dir goes, whether or not the test passes.
    struct RemoveDeep(PathBuf);
    impl Drop for RemoveDeep {
        fn drop(&mut self) {
            let _ = std::process::Command::new("rm")
                .arg("-rf")
                .arg(&self.0)
                .status();
        }
    }
    let _remove = RemoveDeep(deep.clone());
    build(&deep, 25_000);
    let reply = Api::send(c.server.request(
        Method::DELETE,
        &format!("/v2/fs/entry?path={}&recursive=true", encode(&s(&deep))),
    ))
    .await;
    assert_problem(&reply, 409, "directory-not-empty");
    c.server.api().health().await.assert_status(200);
    let shallow = c.root.join("shallow");
    build(&shallow, 3_000);
    Api::send(c.server.request(
        Method::DELETE,
        &format!("/v2/fs/entry?path={}&recursive=true", encode(&s(&shallow))),
    ))
    .await
    .assert_status(200);
    assert!(!shallow.exists());
}

#[tokio::test]
async fn long_names_are_refused_and_a_relative_403_shows_only_what_was_sent() {
    let c = Confined::start(&[]).await;
    // One component of 200 bytes, 30 deep: 6 KB, more than PATH_MAX.
    let long = vec!["c".repeat(200); 30].join("/") + "/f";
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = header(tar::EntryType::Regular, 1);
    builder
        .append_data(&mut header, &long, &b"x"[..])
        .expect("append a GNU long name");
    let archive = builder.into_inner().expect("tar");
    assert_problem(
        &upload_batch(&c.server, &c.root.join("long"), archive).await,
        400,
        "invalid-archive",
    );
    // A relative path, joined to the server's working directory (outside
    // the root): the 403 names it as sent.
    let reply = Api::send(c.server.request(Method::GET, "/v2/fs/stat?path=a.txt")).await;
    assert_problem(&reply, 403, "outside-root");
    let detail = reply.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        detail.starts_with("a.txt "),
        "the 403 shows the server's working directory: {detail}"
    );
}
