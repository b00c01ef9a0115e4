//! The process API's processes (research/contract.md, "Processes and
//! terminals"): programs started in the sandbox on a client's request (or
//! an agent's terminal), each under a tree supervisor, with its output kept
//! in a ring numbered by byte offset so a follower that lost its connection
//! resumes exactly.
//!
//! - [`Processes`]: the table, the bounds (`--max-processes` running at
//!   once, exited ones kept), start, run to completion, shutdown.
//! - [`Process`]: one process: its description, output, stdin, signals,
//!   terminal size, and the exit its followers wait for.
//! - `request`: what a start asks for, the record bounds.
//! - [`output`]: the output ring.
//! - `spawn`: starting the program (pipes or a pseudo-terminal).

mod handle;
pub mod output;
mod request;
mod spawn;
mod table;

pub use handle::*;
pub use request::*;
pub use spawn::TtySize;
pub use table::*;
