//! The private PostgreSQL server of the store's tests ([`PgServer`]): it
//! starts, serves SQL over loopback TCP, stops, comes back on the same port
//! with its data, and is gone after drop. When the PostgreSQL binaries are
//! missing this fails (telling to run `scripts/test`), it does not skip.

use std::time::Duration;

use v2_api_tests::PgServer;

/// No test may take longer than this (`initdb` included).
const TEST_TIMEOUT: Duration = Duration::from_secs(180);

#[tokio::test]
async fn starts_serves_sql_stops_and_starts_again() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let server = PgServer::start().await;
        let port = server.port();
        assert_eq!(
            server.url("store"),
            format!("postgres://sandbox@127.0.0.1:{port}/store")
        );

        server.create_database("store").await;
        assert_eq!(server.psql("store", "SELECT 1").await, "1");
        server
            .psql(
                "store",
                "CREATE TABLE kept (id integer); INSERT INTO kept VALUES (7)",
            )
            .await;

        server.stop().await;
        let error = server
            .try_psql("store", "SELECT 1")
            .await
            .expect_err("a stopped server answers nothing");
        assert!(error.contains("psql"), "{error}");
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "nothing listens on the port once stopped"
        );

        server.start_again().await;
        assert_eq!(server.port(), port);
        assert_eq!(server.psql("store", "SELECT id FROM kept").await, "7");
        // A database name that needs quoting.
        server.create_database("odd \"name\"").await;
        assert_eq!(server.psql("odd \"name\"", "SELECT 2").await, "2");

        drop(server);
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "the server is gone after drop"
        );
    })
    .await
    .expect("the test timed out");
}

#[tokio::test]
async fn two_servers_run_side_by_side() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (first, second) = tokio::join!(PgServer::start(), PgServer::start());
        assert_ne!(first.port(), second.port());
        first.create_database("one").await;
        second.create_database("one").await;
        assert_eq!(first.psql("one", "SELECT 1").await, "1");
        assert_eq!(second.psql("one", "SELECT 1").await, "1");
    })
    .await
    .expect("the test timed out");
}
