//! The file system methods of `SandboxAgentClient` against the real binary
//! (research/contract.md, "Host file system").

mod common;

use common::{TestResult, server_options, within};
use sandbox_agent_sdk::{
    ClientOptions, Error, FsEntryType, FsPath, SandboxAgentClient, StatusCode, StreamExt,
};
use v2_api_tests::TestServer;
use v2_api_tests::agents::TempDir;
use v2_api_tests::proxy::ResponseCut;

#[tokio::test]
async fn files_go_in_and_out_through_the_client() -> TestResult {
    let server = TestServer::start(&["--token", "sdk-fs-token"]).await;
    let client = within(
        "connect",
        SandboxAgentClient::connect(server_options(&server).auto_connect(false)),
    )
    .await?;
    let dir = TempDir::new("sdk-fs");
    let root = dir.path().canonicalize()?;

    // A local project, uploaded as a tar stream made on the fly.
    let local = TempDir::new("sdk-fs-local");
    std::fs::create_dir(local.path().join("src"))?;
    local.write("src/main.rs", b"fn main() {}\n");
    local.write("README.md", b"# project\n");
    let project = root.join("project");
    let uploaded = within(
        "upload dir",
        client.upload_fs_dir(project.as_path(), local.path()),
    )
    .await?;
    assert!(!uploaded.truncated);
    assert!(
        uploaded
            .paths
            .contains(&project.join("src/main.rs").to_string_lossy().into_owned()),
        "{uploaded:?}"
    );

    let entries = within("list", client.list_fs_entries(project.as_path())).await?;
    let names: Vec<_> = entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["README.md", "src"]);
    assert_eq!(entries[1].entry_type, FsEntryType::Directory);

    let main = project.join("src/main.rs");
    assert_eq!(
        within("read", client.read_fs_file(main.as_path())).await?,
        b"fn main() {}\n"
    );
    let written = within(
        "write",
        client.write_fs_file(main.as_path(), &b"fn main() { work() }\n"[..]),
    )
    .await?;
    assert_eq!(written.bytes_written, 21);
    let streamed = within(
        "write from a reader",
        client.write_fs_file_from(project.join("out.txt"), &b"result"[..]),
    )
    .await?;
    assert_eq!(streamed.bytes_written, 6);
    let mut download = within(
        "stream",
        client.read_fs_file_stream(project.join("out.txt")),
    )
    .await?;
    assert_eq!(download.content_length(), Some(6));
    let mut bytes = Vec::new();
    while let Some(chunk) = download.next().await {
        bytes.extend_from_slice(&chunk?);
    }
    assert_eq!(bytes, b"result");

    let stat = within("stat", client.stat_fs(main.as_path())).await?;
    assert_eq!(stat.size, 21);
    within("mkdir", client.mkdir_fs(project.join("build/out"))).await?;
    let moved = within(
        "move",
        client.move_fs(
            project.join("out.txt"),
            &project.join("build/out/result.txt").to_string_lossy(),
            false,
        ),
    )
    .await?;
    assert!(moved.to.ends_with("build/out/result.txt"));
    within(
        "delete",
        client.delete_fs_entry(project.join("build"), true),
    )
    .await?;
    assert!(!project.join("build").exists());

    // Errors are HTTP problems with their types.
    let missing = client.stat_fs(project.join("nope")).await;
    match missing {
        Err(Error::Http(failure)) => {
            assert_eq!(failure.status, StatusCode::NOT_FOUND);
        }
        other => panic!("expected a 404, got {other:?}"),
    }
    let unknown = client
        .list_fs_entries(FsPath::from("src").in_session("no-such-session"))
        .await;
    assert!(
        matches!(unknown, Err(ref e) if e.is_not_found()),
        "{unknown:?}"
    );
    Ok(())
}

/// A download that breaks off is resumed with `If-Range`
/// (research/contract.md, "Host file system"): the rest of an unchanged
/// file is appended; a file replaced in between comes whole, and the bytes
/// of the old version are dropped, never stitched to the new ones.
#[tokio::test]
async fn a_broken_download_resumes_with_if_range() -> TestResult {
    const CUT_AFTER: usize = 1 << 20;
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("sdk-fs-resume");
    let remote = dir.path().join("big.bin");
    let first: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();
    let second = vec![b'n'; (4 << 20) + 3];

    let mut seen = Vec::new();
    for (replaced, expected) in [(false, &first), (true, &second)] {
        std::fs::write(&remote, &first)?;
        let (path, replacement) = (remote.clone(), second.clone());
        let proxy = ResponseCut::start(server.addr(), "GET /v2/fs/file", CUT_AFTER, move || {
            if replaced {
                let temp = path.with_extension("new");
                let _ = std::fs::write(&temp, &replacement);
                let _ = std::fs::rename(&temp, &path);
            }
        })
        .await;
        let options = ClientOptions::new("mock")
            .base_url(proxy.url())
            .auto_connect(false);
        let client = within("connect", SandboxAgentClient::connect(options)).await?;
        let bytes = within("read", client.read_fs_file(remote.as_path())).await?;
        assert!(
            bytes == *expected,
            "replaced: {replaced}: {} bytes, not the expected version",
            bytes.len()
        );
        let gets: Vec<String> = proxy
            .heads()
            .into_iter()
            .filter(|head| head.starts_with("GET /v2/fs/file"))
            .map(|head| head.to_ascii_lowercase())
            .collect();
        assert_eq!(gets.len(), 2, "{gets:?}");
        assert!(
            gets[1].contains("\r\nrange: bytes=") && gets[1].contains("\r\nif-range: \""),
            "{}",
            gets[1]
        );
        seen.push(replaced);
    }
    assert_eq!(seen, [false, true]);

    // The explicit form: an old tag gets the whole new file at offset 0.
    let client = within(
        "connect",
        SandboxAgentClient::connect(server_options(&server).auto_connect(false)),
    )
    .await?;
    let download = within("stream", client.read_fs_file_stream(remote.as_path())).await?;
    let etag = download.etag().map(str::to_owned).unwrap_or_default();
    drop(download);
    let rest = within(
        "resume",
        client.resume_fs_file_stream(remote.as_path(), 10, &etag),
    )
    .await?;
    assert_eq!(rest.offset(), 10);
    assert_eq!(rest.content_length(), Some(second.len() as u64 - 10));
    std::fs::write(&remote, b"short")?;
    let restarted = within(
        "resume after a change",
        client.resume_fs_file_stream(remote.as_path(), 10, &etag),
    )
    .await?;
    assert_eq!(restarted.offset(), 0);
    assert_ne!(restarted.etag(), Some(etag.as_str()));
    Ok(())
}
