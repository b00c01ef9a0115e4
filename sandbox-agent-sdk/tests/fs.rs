//! The file system methods of `SandboxAgentClient` against the real binary
//! (research/contract.md, "Host file system").

mod common;

use common::{TestResult, server_options, within};
use sandbox_agent_sdk::{Error, FsEntryType, FsPath, SandboxAgentClient, StatusCode, StreamExt};
use v2_api_tests::TestServer;
use v2_api_tests::agents::TempDir;

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
