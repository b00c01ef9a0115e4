//! The schema: the migrations embedded in the binary, one list per
//! backend (`acp-runtime/migrations/<backend>/`).

use sqlx::migrate::{Migration, MigrationSource, MigrationType};
use std::borrow::Cow;

/// The embedded migrations of one backend (`acp-runtime/migrations/<backend>/`).
#[derive(Debug)]
pub(crate) struct Embedded(&'static [(i64, &'static str, &'static str)]);

pub(crate) const SQLITE_MIGRATIONS: Embedded = Embedded(&[
    (
        1,
        "sessions and events",
        include_str!("../../migrations/sqlite/0001_sessions_and_events.sql"),
    ),
    (
        2,
        "hints and listing index",
        include_str!("../../migrations/sqlite/0002_hints_and_listing_index.sql"),
    ),
    (
        3,
        "first prompt and id index",
        include_str!("../../migrations/sqlite/0003_first_prompt_and_id_index.sql"),
    ),
    (
        4,
        "integer session keys",
        include_str!("../../migrations/sqlite/0004_integer_session_keys.sql"),
    ),
    (
        5,
        "events as a rowid table",
        include_str!("../../migrations/sqlite/0005_events_as_a_rowid_table.sql"),
    ),
]);

// PostgreSQL stays at version 4: its events table is a heap, which appends
// cheaply as it is (research/decisions.md, "The writer's cost per event").
pub(crate) const POSTGRES_MIGRATIONS: Embedded = Embedded(&[
    (
        1,
        "sessions and events",
        include_str!("../../migrations/postgres/0001_sessions_and_events.sql"),
    ),
    (
        2,
        "hints and listing index",
        include_str!("../../migrations/postgres/0002_hints_and_listing_index.sql"),
    ),
    (
        3,
        "first prompt and id index",
        include_str!("../../migrations/postgres/0003_first_prompt_and_id_index.sql"),
    ),
    (
        4,
        "integer session keys",
        include_str!("../../migrations/postgres/0004_integer_session_keys.sql"),
    ),
]);

impl<'s> MigrationSource<'s> for &'s Embedded {
    fn resolve(
        self,
    ) -> futures::future::BoxFuture<'s, Result<Vec<Migration>, sqlx::error::BoxDynError>> {
        Box::pin(async move {
            Ok(self
                .0
                .iter()
                .map(|(version, description, sql)| {
                    Migration::new(
                        *version,
                        Cow::Borrowed(*description),
                        MigrationType::Simple,
                        Cow::Borrowed(*sql),
                        false,
                    )
                })
                .collect())
        })
    }
}

/// The SQL of the schema versions this binary knows, per backend
/// (`"sqlite"` or `"postgres"`): `(version, description, sql)` in order.
/// Tests use it to build a database at an older version.
pub fn migrations(backend: &str) -> &'static [(i64, &'static str, &'static str)] {
    match backend {
        "postgres" => POSTGRES_MIGRATIONS.0,
        _ => SQLITE_MIGRATIONS.0,
    }
}
