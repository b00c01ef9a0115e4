//! The process API through `SandboxAgentClient` against the real binary
//! (research/contract.md, "Processes and terminals"; the SDK's calls in
//! "The process API in the SDK"): run, start and a handle's resumable
//! output stream, stdin, signals, wait, resize, forget, list pages.

mod common;

use common::{TestResult, server_options, within};
use sandbox_agent_sdk::{
    Error, OutputEvent, OutputStream, ProcessHandle, ProcessListParams, ProcessRequest,
    ProcessState, SandboxAgentClient, StatusCode, StreamExt,
};
use v2_api_tests::{CutProxy, TestServer};

/// A client of `server` (or of `url` in front of it) without an agent
/// connection.
async fn client(server: &TestServer, url: Option<String>) -> Result<SandboxAgentClient, Error> {
    let mut options = server_options(server).auto_connect(false);
    if let Some(url) = url {
        options = options.base_url(url);
    }
    within("connect", SandboxAgentClient::connect(options)).await
}

/// Every event of `process`'s output until its exit: the bytes, the
/// dropped markers, the exit.
async fn collect(
    process: &ProcessHandle,
) -> Result<(Vec<u8>, Vec<u64>, sandbox_agent_sdk::Exit), Error> {
    let mut output = process.output();
    let mut bytes = Vec::new();
    let mut dropped = Vec::new();
    let mut exit = None;
    within("output", async {
        while let Some(event) = output.next().await {
            match event? {
                OutputEvent::Chunk(chunk) => bytes.extend(chunk.bytes().unwrap_or_default()),
                OutputEvent::Dropped(gap) => dropped.push(gap.dropped),
                OutputEvent::Exit(done) => exit = Some(done),
            }
        }
        Ok::<_, Error>(())
    })
    .await?;
    let exit =
        exit.ok_or_else(|| Error::InvalidOptions("the output ended without an exit".into()))?;
    Ok((bytes, dropped, exit))
}

#[tokio::test]
async fn a_cut_output_stream_resumes_with_every_byte_once() -> TestResult {
    // The ring holds everything, so every byte must arrive, exactly once.
    let server =
        TestServer::start(&["--token", "sdk-proc", "--process-output-bytes", "67108864"]).await;
    let proxy = CutProxy::start(server.addr()).await;
    let client = client(&server, Some(proxy.url())).await?;
    // About 6.9 MB of numbered lines, written while they are followed, and
    // a second writer at the same time for load.
    let lines = 1_000_000;
    let writer = ProcessRequest::new("seq").arg("1").arg(lines.to_string());
    let process = within("start", client.start_process(writer.clone())).await?;
    let other = within("start", client.start_process(writer)).await?;
    let mut expected = String::new();
    for n in 1..=lines {
        expected.push_str(&n.to_string());
        expected.push('\n');
    }

    let mut output = process.output();
    let mut received: Vec<u8> = Vec::new();
    let mut cuts = 0;
    let mut marks_passed = 0;
    let mut last_end = 0;
    let mut exit = None;
    within("the followed output", async {
        while let Some(event) = output.next().await {
            match event? {
                OutputEvent::Chunk(chunk) => {
                    assert_eq!(chunk.offset, last_end, "chunks follow each other exactly");
                    assert_eq!(chunk.stream, OutputStream::Stdout);
                    let bytes = chunk.bytes().unwrap_or_default();
                    last_end = chunk.end(bytes.len());
                    received.extend_from_slice(&bytes);
                    // Cut the connection mid-stream, up to three times. The
                    // first mark comes while `seq` still writes, so there
                    // is a connection to cut; by a later one the client may
                    // already hold the rest and the exit, the stream closed.
                    let marks = [64 * 1024, 2 * 1024 * 1024, 5 * 1024 * 1024];
                    if marks_passed < marks.len() && received.len() >= marks[marks_passed] {
                        let cut = proxy.cut();
                        assert!(
                            marks_passed > 0 || cut > 0,
                            "nothing to cut at {}",
                            received.len()
                        );
                        marks_passed += 1;
                        cuts += usize::from(cut > 0);
                    }
                }
                OutputEvent::Dropped(gap) => panic!("the ring holds everything: {gap:?}"),
                OutputEvent::Exit(done) => exit = Some(done),
            }
        }
        Ok::<_, Error>(())
    })
    .await?;
    assert_eq!(marks_passed, 3);
    assert!(cuts >= 1, "at least the first mark cut a connection");
    assert_eq!(exit.map(|e| e.exit_code), Some(Some(0)));
    assert_eq!(received.len(), expected.len());
    assert!(received == expected.as_bytes(), "every byte once, in order");
    // Each reopen asked for the rest by offset.
    let resumes: Vec<u64> = proxy
        .heads()
        .iter()
        .filter(|head| head.method == "GET")
        .filter_map(|head| head.last_event_id.as_deref()?.parse().ok())
        .filter(|offset| *offset > 0)
        .collect();
    // At least one: chunks the stream had read before a cut still come
    // out after it, so a later mark can cut a connection that is not the
    // follow's (a pooled one), and two cuts can share one reopen.
    assert!(
        !resumes.is_empty(),
        "resumed with Last-Event-ID: {resumes:?}"
    );
    // The other writer, followed without cuts, is whole too.
    let (bytes, dropped, exit) = collect(&other).await?;
    assert!(bytes == expected.as_bytes() && dropped.is_empty());
    assert!(exit.success());
    Ok(())
}

#[tokio::test]
async fn the_dropped_marker_is_an_item_and_the_exit_the_last() -> TestResult {
    let server = TestServer::start(&["--process-output-bytes", "4096"]).await;
    let client = client(&server, None).await?;
    let process = within(
        "start",
        client.start_process(ProcessRequest::new("head").args(["-c", "100000", "/dev/zero"])),
    )
    .await?;
    let exit = within("wait", process.wait()).await?;
    assert!(exit.success(), "{exit:?}");
    let mut output = process.output();
    let mut items = Vec::new();
    while let Some(event) = within("output", output.next()).await {
        items.push(event?);
    }
    let Some(OutputEvent::Dropped(gap)) = items.first() else {
        panic!("the first item is the dropped marker: {items:?}");
    };
    assert_eq!(gap.offset, 0);
    assert_eq!(gap.next_offset, gap.dropped);
    assert!(gap.dropped >= 100_000 - 4096, "{gap:?}");
    assert!(
        matches!(items.last(), Some(OutputEvent::Exit(_))),
        "{items:?}"
    );
    let delivered: usize = items
        .iter()
        .filter_map(|item| match item {
            OutputEvent::Chunk(chunk) => Some(chunk.bytes().unwrap_or_default().len()),
            _ => None,
        })
        .sum();
    assert_eq!(gap.dropped + delivered as u64, 100_000);
    Ok(())
}

#[tokio::test]
async fn stdin_signals_wait_resize_and_forget() -> TestResult {
    let server = TestServer::start(&[]).await;
    let client = client(&server, None).await?;

    // stdin in pieces, closed; wait gives the exit.
    let cat = within("start", client.start_process(ProcessRequest::new("cat"))).await?;
    assert_eq!(
        cat.started().map(|info| info.state),
        Some(ProcessState::Running)
    );
    within("stdin", cat.write_stdin(&b"abc "[..])).await?;
    within("stdin", cat.write_stdin(vec![0xff, b'\n'])).await?;
    within("eof", cat.close_stdin()).await?;
    let exit = within("wait", cat.wait()).await?;
    assert_eq!(exit.exit_code, Some(0));
    let (bytes, _, _) = collect(&cat).await?;
    assert_eq!(bytes, b"abc \xff\n");
    let late = within("stdin after exit", cat.write_stdin(&b"x"[..])).await;
    assert_eq!(
        late.as_ref().err().and_then(Error::status),
        Some(StatusCode::CONFLICT)
    );

    // An exit code, and a wait on a process that already exited.
    let seven = within(
        "start",
        client.start_process(ProcessRequest::new("sh").args(["-c", "exit 7"])),
    )
    .await?;
    assert_eq!(within("wait", seven.wait()).await?.exit_code, Some(7));
    assert_eq!(within("wait again", seven.wait()).await?.exit_code, Some(7));

    // A signal by name; kill.
    let sleeper = within(
        "start",
        client.start_process(ProcessRequest::new("sleep").arg("30")),
    )
    .await?;
    within("signal", sleeper.signal("SIGTERM")).await?;
    assert_eq!(
        within("wait", sleeper.wait()).await?.signal.as_deref(),
        Some("SIGTERM")
    );
    let bad = within("bad signal", sleeper.signal("SIGNOPE")).await;
    assert_eq!(
        bad.err().and_then(|e| e.status()),
        Some(StatusCode::BAD_REQUEST)
    );
    let sleeper = within(
        "start",
        client.start_process(ProcessRequest::new("sleep").arg("30")),
    )
    .await?;
    within("kill", sleeper.kill()).await?;
    assert_eq!(
        within("wait", sleeper.wait()).await?.signal.as_deref(),
        Some("SIGKILL")
    );

    // A terminal, resized, sees its new size.
    let tty = within(
        "start",
        client.start_process(
            ProcessRequest::new("sh")
                .args(["-c", "read line; stty size"])
                .tty(80, 24),
        ),
    )
    .await?;
    within("resize", tty.resize(120, 50)).await?;
    within("enter", tty.write_stdin(&b"\r"[..])).await?;
    let (bytes, _, exit) = collect(&tty).await?;
    assert!(exit.success());
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("50 120"), "{text:?}");
    let not_tty = within("resize a pipe", cat.resize(10, 10)).await;
    assert_eq!(
        not_tty
            .as_ref()
            .err()
            .and_then(Error::problem)
            .map(|p| p.problem_type.as_str()),
        Some("urn:sandbox-agent:error:not-a-tty")
    );

    // forget: gone afterwards.
    let id = tty.id().to_owned();
    within("forget", tty.forget()).await?;
    let gone = within("get", client.get_process(&id)).await;
    assert!(gone.as_ref().is_err_and(Error::is_not_found), "{gone:?}");
    Ok(())
}

#[tokio::test]
async fn run_and_list_pages() -> TestResult {
    let server = TestServer::start(&[]).await;
    let client = client(&server, None).await?;
    let run = within(
        "run",
        client.run_process(
            ProcessRequest::new("sh")
                .args(["-c", "cat; echo err >&2"])
                .stdin("in\n")
                .env("X", "1"),
        ),
    )
    .await?;
    assert_eq!(run.exit_code, Some(0));
    assert_eq!(run.stdout, "in\n");
    assert_eq!(run.stderr, "err\n");
    let missing = within(
        "run",
        client.run_process(ProcessRequest::new("no-such-program-xyz")),
    )
    .await;
    let problem = missing.as_ref().err().and_then(Error::problem);
    assert_eq!(
        problem.map(|p| p.problem_type.as_str()),
        Some("urn:sandbox-agent:error:program-not-found"),
        "{missing:?}"
    );

    let mut started = Vec::new();
    for n in 0..5 {
        let process = within(
            "start",
            client.start_process(
                ProcessRequest::new("sleep")
                    .arg("30")
                    .title(format!("s{n}")),
            ),
        )
        .await?;
        started.push(process);
    }
    let mut params = ProcessListParams {
        limit: Some(2),
        state: Some(ProcessState::Running),
        ..ProcessListParams::default()
    };
    let mut listed = Vec::new();
    let mut pages = 0;
    loop {
        let page = within("list", client.list_processes(params.clone())).await?;
        pages += 1;
        assert!(page.processes.len() <= 2);
        listed.extend(page.processes.into_iter().map(|p| p.id));
        match page.next_cursor {
            Some(cursor) => params.cursor = Some(cursor),
            None => break,
        }
    }
    let newest_first: Vec<String> = started.iter().rev().map(|p| p.id().to_owned()).collect();
    assert_eq!(listed, newest_first);
    assert_eq!(pages, 3);
    let bad = within(
        "list",
        client.list_processes(ProcessListParams {
            cursor: Some("nope".into()),
            ..ProcessListParams::default()
        }),
    )
    .await;
    assert_eq!(
        bad.err().and_then(|e| e.status()),
        Some(StatusCode::BAD_REQUEST)
    );
    for process in started {
        within("forget", process.forget()).await?;
    }
    Ok(())
}
