//! PostgreSQL over TLS (research/contract.md, "PostgreSQL over TLS"): the
//! real server against the harness's private PostgreSQL started with
//! `ssl=on` and a certificate made here with `openssl` (a test root, a
//! server certificate for `localhost` signed by it, and an unrelated root).
//! `pg_stat_ssl` on the database side says whether the runtime's
//! connections are encrypted; a failed check must be a start-up error (or
//! the degraded store's error) that names the check.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use v2_api_tests::server::start_up_outcome;
use v2_api_tests::{MOCK, PgServer, TempDir, TestServer};

/// No test may take longer than this (`initdb` included).
const TEST_TIMEOUT: Duration = Duration::from_secs(240);
/// How long a server that must fail at start-up may take to exit.
const START_FAILS_WITHIN: Duration = Duration::from_secs(30);

/// Certificates made with `openssl` for one test.
struct Certificates {
    dir: TempDir,
}

impl Certificates {
    /// A root `ca`, a server certificate `localhost` (SAN `DNS:localhost`
    /// only) signed by it, another for `elsewhere.test` signed by it, and
    /// an unrelated root `other-ca`.
    fn make() -> Certificates {
        let dir = TempDir::new("pg-tls");
        let certs = Certificates { dir };
        certs.root("ca");
        certs.root("other-ca");
        certs.server("localhost", "ca");
        certs.server("elsewhere.test", "ca");
        certs
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn text(&self, name: &str) -> String {
        self.path(name).to_str().expect("UTF-8 temp dir").to_owned()
    }

    /// `NAME.crt` / `NAME.key`: a self-signed CA (P-256).
    fn root(&self, name: &str) {
        self.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN=sandbox-agent test {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            &self.text(&format!("{name}.key")),
            "-out",
            &self.text(&format!("{name}.crt")),
        ]);
    }

    /// `HOST.crt` / `HOST.key`: a server certificate for `DNS:HOST`,
    /// signed by root `ca`.
    fn server(&self, host: &str, ca: &str) {
        let extensions = self.path(&format!("{host}.ext"));
        std::fs::write(
            &extensions,
            format!(
                "subjectAltName=DNS:{host}\nbasicConstraints=CA:FALSE\n\
                 keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
            ),
        )
        .expect("write the extensions file");
        self.openssl(&[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &format!("/CN={host}"),
            "-keyout",
            &self.text(&format!("{host}.key")),
            "-out",
            &self.text(&format!("{host}.csr")),
        ]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &self.text(&format!("{host}.csr")),
            "-CA",
            &self.text(&format!("{ca}.crt")),
            "-CAkey",
            &self.text(&format!("{ca}.key")),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            extensions.to_str().expect("UTF-8"),
            "-out",
            &self.text(&format!("{host}.crt")),
        ]);
    }

    fn openssl(&self, args: &[&str]) {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .expect("run openssl (the TLS tests make their certificates with it)");
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// A private PostgreSQL with `ssl=on`, serving the `localhost` certificate.
async fn tls_server(certs: &Certificates) -> PgServer {
    PgServer::start_with_tls(&certs.path("localhost.crt"), &certs.path("localhost.key")).await
}

/// `postgres://sandbox@HOST:PORT/DB?QUERY`.
fn url(pg: &PgServer, host: &str, db: &str, query: &str) -> String {
    format!("postgres://sandbox@{host}:{}/{db}?{query}", pg.port())
}

/// `(connections, all encrypted)` of the clients connected to `db`, as
/// `pg_stat_ssl` shows them.
async fn encrypted(pg: &PgServer, db: &str) -> (u64, bool) {
    let row = pg
        .psql(
            "postgres",
            &format!(
                "SELECT count(*), coalesce(bool_and(s.ssl), false) FROM pg_stat_ssl s \
                 JOIN pg_stat_activity a USING (pid) WHERE a.datname = '{db}'"
            ),
        )
        .await;
    let (count, all) = row.split_once('|').expect("count|bool");
    (count.parse().expect("a count"), all == "t")
}

/// Starts a server on `store` and makes one session, so the store is
/// written through the connection (its inventory entry).
async fn serving(store: &str) -> TestServer {
    let server = TestServer::start(&["--store", store]).await;
    let conn = server.initialize(MOCK).await;
    let answer = server
        .rpc(
            &conn,
            1,
            "session/new",
            v2_api_tests::acp::new_session_params(MOCK),
        )
        .await;
    assert!(answer["result"]["sessionId"].is_string(), "{answer}");
    server
}

/// Runs a server on `store` that must fail to start: its stderr.
async fn start_up_error(store: &str) -> String {
    let (status, stderr) = start_up_outcome(&["--store", store], START_FAILS_WITHIN)
        .await
        .unwrap_or_else(|| panic!("the server started on {store}; it must refuse"));
    eprintln!("{store}:\n{stderr}");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot open the session store"),
        "the error names the store: {stderr}"
    );
    stderr
}

#[tokio::test]
async fn verify_full_with_the_right_root_is_encrypted_and_a_changed_certificate_degrades_naming_the_check()
 {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let certs = Certificates::make();
        let pg = tls_server(&certs).await;
        pg.create_database("verified").await;
        let store = url(
            &pg,
            "localhost",
            "verified",
            &format!("sslmode=verify-full&sslrootcert={}", certs.text("ca.crt")),
        );
        let server = serving(&store).await;
        let health = server.store_state("ok", Duration::from_secs(20)).await;
        assert_eq!(health["storeBackend"], "postgres", "{health}");
        let (connections, all) = encrypted(&pg, "verified").await;
        assert!(connections >= 1, "the runtime is connected");
        assert!(all, "every connection of the runtime is encrypted");

        // The server now presents a certificate for another host name:
        // the next connection fails verify-full's host name check, and the
        // degraded store says so.
        pg.replace_tls_files(
            &certs.path("elsewhere.test.crt"),
            &certs.path("elsewhere.test.key"),
        )
        .await;
        pg.psql(
            "postgres",
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'verified'",
        )
        .await;
        let conn = server.initialize(MOCK).await;
        server
            .rpc(
                &conn,
                2,
                "session/new",
                v2_api_tests::acp::new_session_params(MOCK),
            )
            .await;
        // The writer's own connection was terminated first (that may be
        // the first error the store reports); its next connection fails
        // the check, and the store then says why.
        let deadline = std::time::Instant::now() + Duration::from_secs(40);
        let degraded = loop {
            let health = server
                .store_state("degraded", Duration::from_secs(40))
                .await;
            let error = health["storeError"].as_str().unwrap_or_default();
            if error.contains("TLS check failed") || std::time::Instant::now() > deadline {
                break health;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let error = degraded["storeError"].as_str().unwrap_or_default();
        eprintln!("degraded: {error}");
        assert!(
            error.contains("TLS check failed") && error.contains("checks the host name"),
            "the degraded store names the failed check: {degraded}"
        );
        assert!(error.contains("\"localhost\""), "{degraded}");
    })
    .await
    .expect("the test timed out");
}

#[tokio::test]
async fn require_and_the_default_encrypt_disable_does_not_and_failed_checks_are_named() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let certs = Certificates::make();
        let pg = tls_server(&certs).await;

        // `require`: encrypted, the certificate unchecked (the test root
        // is not given).
        pg.create_database("required").await;
        let server = serving(&url(&pg, "127.0.0.1", "required", "sslmode=require")).await;
        server.store_state("ok", Duration::from_secs(20)).await;
        let (connections, all) = encrypted(&pg, "required").await;
        assert!(connections >= 1 && all, "require encrypts");
        drop(server);

        // No sslmode: `prefer`, as libpq, so TLS when the server offers it.
        pg.create_database("preferred").await;
        let server = serving(&url(&pg, "127.0.0.1", "preferred", "")).await;
        server.store_state("ok", Duration::from_secs(20)).await;
        let (connections, all) = encrypted(&pg, "preferred").await;
        assert!(
            connections >= 1 && all,
            "the default (prefer) encrypts when the server offers TLS"
        );
        drop(server);

        // `disable`: plain, which shows the check above can see "no".
        pg.create_database("plain").await;
        let server = serving(&url(&pg, "127.0.0.1", "plain", "sslmode=disable")).await;
        server.store_state("ok", Duration::from_secs(20)).await;
        let (connections, all) = encrypted(&pg, "plain").await;
        assert!(connections >= 1 && !all, "disable does not encrypt");
        drop(server);

        // verify-full against an address the certificate does not name.
        let root = certs.text("ca.crt");
        let stderr = start_up_error(&url(
            &pg,
            "127.0.0.1",
            "required",
            &format!("sslmode=verify-full&sslrootcert={root}"),
        ))
        .await;
        assert!(
            stderr.contains("TLS check failed: sslmode=verify-full checks the host name")
                && stderr.contains("\"127.0.0.1\""),
            "a wrong host name is named as such: {stderr}"
        );

        // verify-ca (and verify-full) with a root that did not sign it.
        let other = certs.text("other-ca.crt");
        for mode in ["verify-ca", "verify-full"] {
            let stderr = start_up_error(&url(
                &pg,
                "localhost",
                "required",
                &format!("sslmode={mode}&sslrootcert={other}"),
            ))
            .await;
            assert!(
                stderr.contains(&format!(
                    "TLS check failed: sslmode={mode} checks the certificate chain"
                )) && stderr.contains("not signed by a trusted root")
                    && stderr.contains(&other),
                "a wrong root is named as such: {stderr}"
            );
        }

        // `require` with a root checks the chain too (libpq's rule).
        let stderr = start_up_error(&url(
            &pg,
            "localhost",
            "required",
            &format!("sslmode=require&sslrootcert={other}"),
        ))
        .await;
        assert!(
            stderr.contains(
                "sslmode=require with sslrootcert (as verify-ca) checks the certificate chain"
            ),
            "{stderr}"
        );

        // A root file that is not there, before any connection.
        let missing = certs.text("missing.crt");
        let stderr = start_up_error(&url(
            &pg,
            "localhost",
            "required",
            &format!("sslmode=verify-full&sslrootcert={missing}"),
        ))
        .await;
        assert!(
            stderr.contains(&format!("sslrootcert {missing}: ")),
            "{stderr}"
        );

        // TLS switched off on the server: require is refused with that
        // reason, the default (prefer) connects in plain text.
        pg.psql("postgres", "ALTER SYSTEM SET ssl = off").await;
        pg.psql("postgres", "SELECT pg_reload_conf()").await;
        // The postmaster reloads asynchronously; new sessions show when.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while pg.psql("postgres", "SHOW ssl").await != "off" {
            assert!(tokio::time::Instant::now() < deadline, "ssl stays on");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let stderr = start_up_error(&url(&pg, "127.0.0.1", "required", "sslmode=require")).await;
        assert!(
            stderr.contains("TLS check failed: the server does not offer TLS, and sslmode=require"),
            "{stderr}"
        );
        pg.create_database("fallback").await;
        let server = serving(&url(&pg, "127.0.0.1", "fallback", "")).await;
        server.store_state("ok", Duration::from_secs(20)).await;
        let (connections, all) = encrypted(&pg, "fallback").await;
        assert!(
            connections >= 1 && !all,
            "prefer goes plain when TLS is off"
        );
    })
    .await
    .expect("the test timed out");
}

#[tokio::test]
async fn an_unknown_sslmode_is_refused_with_the_accepted_ones_and_no_password() {
    for (query, wanted) in [
        ("sslmode=strict", "unknown sslmode \"strict\""),
        ("sslmode=allow", "sslmode=allow is not supported"),
    ] {
        let store = format!("postgres://sandbox:hunter2@127.0.0.1:1/db?{query}");
        let stderr = start_up_error(&store).await;
        assert!(
            stderr.contains(wanted) && stderr.contains("verify-full"),
            "{query}: {stderr}"
        );
        assert!(
            !stderr.contains("hunter2"),
            "the password is shown: {stderr}"
        );
    }
}
