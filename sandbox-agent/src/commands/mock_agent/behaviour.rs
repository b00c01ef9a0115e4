//! What a prompt turn does, from the prompt's text: the plain reply, the
//! `tool` and `permission` turns, the client-side file and terminal turns
//! (`read file`, `read lines`, `write file`, `use terminal`), the questions
//! (`ask question`, `ask url`), `echo traceparent`, and the `!`
//! directives (research/contract.md, "The mock agent").

use std::path::PathBuf;
use std::time::Duration;

use agent_client_protocol::Error;
use agent_client_protocol::v1::schema::ContentBlock;

/// Exit code of `!crash` without an argument.
const DEFAULT_CRASH_CODE: i32 = 3;

/// What a prompt turn does; decided from the prompt text by [`Behaviour::from_prompt`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Behaviour {
    /// The plain reply, one chunk per word.
    Reply,
    /// A completed `read` tool call, then the plain reply.
    Tool,
    /// An `edit` tool call that needs `session/request_permission`.
    Permission,
    /// `!crash [CODE]`.
    Crash { code: i32 },
    /// `!garbage`: non-JSON lines on stdout, then the plain reply.
    Garbage,
    /// `!stall`: nothing until `session/cancel`.
    Stall,
    /// `!emit N K`: N chunks of K bytes.
    Emit { chunks: usize, bytes: usize },
    /// `!slow N MS`: N chunks, MS apart.
    Slow { chunks: usize, interval: Duration },
    /// `!huge BYTES`: one non-JSON stdout line of BYTES bytes, then the plain reply.
    Huge { bytes: usize },
    /// `!fs PATH`: `fs/read_text_file` to the client.
    Fs { path: PathBuf },
    /// `!stderr N`: N lines on stderr, then the plain reply.
    Stderr { lines: usize },
    /// `!usage IN OUT`: the plain reply, and the answer reports IN input
    /// and OUT output tokens.
    Usage { input: u64, output: u64 },
    /// `!fail [N [BYTES]]`: N filler lines of BYTES bytes and two known
    /// lines on stderr, then a JSON-RPC error answer.
    Fail { lines: usize, bytes: usize },
    /// `read file PATH` and `read lines LINE LIMIT PATH`:
    /// `fs/read_text_file`, then what it read or the error.
    ReadFile {
        path: PathBuf,
        line: Option<u32>,
        limit: Option<u32>,
    },
    /// `write file PATH TEXT`: `fs/write_text_file`, then the outcome.
    WriteFile { path: PathBuf, text: String },
    /// `use terminal LINE`: a terminal running `sh -c LINE`, shown in a
    /// tool call, waited for, read and released; then its output and exit.
    /// `kill terminal LINE`: the same, killed once it wrote something.
    Terminal { line: String, kill: bool },
    /// `ask question`: a form `elicitation/create` (name, color, confirm),
    /// then a reply naming the answer.
    AskQuestion,
    /// `ask url`: a URL-mode `elicitation/create`; after an accept,
    /// `elicitation/complete`, then a reply.
    AskUrl,
    /// `echo traceparent`: one chunk naming the `_meta.traceparent` the
    /// prompt request carried (filled in by the turn, which has the
    /// request), so a test sees the trace context the runtime passed on.
    EchoTraceparent { traceparent: Option<String> },
}

impl Behaviour {
    /// The one place that maps a prompt's text to what the turn does.
    ///
    /// Text starting with `!` is a directive; an unknown directive name gets
    /// the plain reply, a known one with wrong arguments is an invalid-params
    /// error naming its usage. Otherwise `permission` anywhere in the text
    /// wins over `tool` (plain substrings, case-sensitive: `tools` counts).
    pub(super) fn from_prompt(text: &str) -> Result<Self, Error> {
        if let Some(client_side) = Self::client_side(text) {
            return client_side;
        }
        let Some(directive) = text.strip_prefix('!') else {
            return Ok(if text.contains("permission") {
                Self::Permission
            } else if text.contains("tool") {
                Self::Tool
            } else {
                Self::Reply
            });
        };
        let directive = directive.trim();
        let (name, rest) = directive
            .split_once(char::is_whitespace)
            .unwrap_or((directive, ""));
        let usage = match name {
            "crash" => "!crash [CODE]",
            "garbage" => "!garbage",
            "stall" => "!stall",
            "emit" => "!emit N K",
            "slow" => "!slow N MS",
            "huge" => "!huge BYTES",
            "fs" => "!fs PATH",
            "stderr" => "!stderr N",
            "fail" => "!fail [N [BYTES]]",
            "usage" => "!usage IN OUT",
            _ => return Ok(Self::Reply),
        };
        let wrong = || Error::invalid_params().data(format!("usage: {usage} (got `{text}`)"));
        let args: Vec<&str> = rest.split_whitespace().collect();
        Ok(match (name, args.as_slice()) {
            ("crash", []) => Self::Crash {
                code: DEFAULT_CRASH_CODE,
            },
            ("crash", [code]) => Self::Crash {
                code: parse_arg(code, wrong)?,
            },
            ("garbage", []) => Self::Garbage,
            ("stall", []) => Self::Stall,
            ("emit", [chunks, bytes]) => Self::Emit {
                chunks: parse_arg(chunks, wrong)?,
                bytes: parse_arg(bytes, wrong)?,
            },
            ("slow", [chunks, millis]) => Self::Slow {
                chunks: parse_arg(chunks, wrong)?,
                interval: Duration::from_millis(parse_arg(millis, wrong)?),
            },
            ("huge", [bytes]) => Self::Huge {
                bytes: parse_arg(bytes, wrong)?,
            },
            // The path is the rest of the text, spaces included.
            ("fs", [_, ..]) => Self::Fs {
                path: PathBuf::from(rest.trim()),
            },
            ("stderr", [lines]) => Self::Stderr {
                lines: parse_arg(lines, wrong)?,
            },
            ("usage", [input, output]) => Self::Usage {
                input: parse_arg(input, wrong)?,
                output: parse_arg(output, wrong)?,
            },
            ("fail", []) => Self::Fail { lines: 0, bytes: 0 },
            ("fail", [lines]) => Self::Fail {
                lines: parse_arg(lines, wrong)?,
                bytes: 0,
            },
            ("fail", [lines, bytes]) => Self::Fail {
                lines: parse_arg(lines, wrong)?,
                bytes: parse_arg(bytes, wrong)?,
            },
            _ => return Err(wrong()),
        })
    }
}

impl Behaviour {
    /// The file and terminal turns, by the prompt's first words (before the
    /// `permission` and `tool` keywords, which a path or a command line may
    /// contain); `None` for any other prompt.
    fn client_side(text: &str) -> Option<Result<Self, Error>> {
        let usage = |usage: &str| {
            Err(Error::invalid_params().data(format!("usage: {usage} (got `{text}`)")))
        };
        if let Some(path) = text.strip_prefix("read file ") {
            return Some(if path.is_empty() {
                usage("read file PATH")
            } else {
                Ok(Self::ReadFile {
                    path: PathBuf::from(path),
                    line: None,
                    limit: None,
                })
            });
        }
        if let Some(rest) = text.strip_prefix("read lines ") {
            let mut parts = rest.splitn(3, ' ');
            let parsed = match (parts.next(), parts.next(), parts.next()) {
                (Some(line), Some(limit), Some(path)) if !path.is_empty() => line
                    .parse()
                    .ok()
                    .zip(limit.parse().ok())
                    .map(|(line, limit)| Self::ReadFile {
                        path: PathBuf::from(path),
                        line: Some(line),
                        limit: Some(limit),
                    }),
                _ => None,
            };
            return Some(parsed.map_or_else(|| usage("read lines LINE LIMIT PATH"), Ok));
        }
        if let Some(rest) = text.strip_prefix("write file ") {
            // The path is one word; the text is everything after its space.
            let (path, text) = rest.split_once(' ').unwrap_or((rest, ""));
            return Some(if path.is_empty() {
                usage("write file PATH TEXT")
            } else {
                Ok(Self::WriteFile {
                    path: PathBuf::from(path),
                    text: text.to_owned(),
                })
            });
        }
        for (prefix, kill) in [("use terminal ", false), ("kill terminal ", true)] {
            if let Some(line) = text.strip_prefix(prefix) {
                return Some(if line.trim().is_empty() {
                    usage(&format!("{}LINE", prefix))
                } else {
                    Ok(Self::Terminal {
                        line: line.to_owned(),
                        kill,
                    })
                });
            }
        }
        match text.trim() {
            "ask question" => Some(Ok(Self::AskQuestion)),
            "ask url" => Some(Ok(Self::AskUrl)),
            "echo traceparent" => Some(Ok(Self::EchoTraceparent { traceparent: None })),
            _ => None,
        }
    }
}

/// One numeric directive argument, or the directive's usage error.
fn parse_arg<T: std::str::FromStr>(arg: &str, wrong: impl Fn() -> Error) -> Result<T, Error> {
    arg.parse().map_err(|_| wrong())
}

/// The prompt's text: all text content blocks joined by spaces.
pub(super) fn prompt_text(prompt: &[ContentBlock]) -> String {
    let texts: Vec<&str> = prompt
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text(text) => Some(text.text.as_str()),
            _ => None,
        })
        .collect();
    texts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_client_protocol::ErrorCode;

    #[test]
    fn plain_text_and_keywords() {
        assert_eq!(Behaviour::from_prompt("hi").ok(), Some(Behaviour::Reply));
        assert_eq!(
            Behaviour::from_prompt("use a tool").ok(),
            Some(Behaviour::Tool)
        );
        assert_eq!(
            Behaviour::from_prompt("tool with permission").ok(),
            Some(Behaviour::Permission)
        );
        assert_eq!(
            Behaviour::from_prompt("!unknown").ok(),
            Some(Behaviour::Reply)
        );
    }

    #[test]
    fn questions_need_the_exact_words() {
        assert_eq!(
            Behaviour::from_prompt("ask question").ok(),
            Some(Behaviour::AskQuestion)
        );
        assert_eq!(
            Behaviour::from_prompt(" ask url ").ok(),
            Some(Behaviour::AskUrl)
        );
        assert_eq!(
            Behaviour::from_prompt("ask question about permission").ok(),
            Some(Behaviour::Permission)
        );
    }

    #[test]
    fn directives() {
        assert_eq!(
            Behaviour::from_prompt("!usage 12 34").ok(),
            Some(Behaviour::Usage {
                input: 12,
                output: 34
            })
        );
        assert!(Behaviour::from_prompt("!usage 12").is_err());
        assert_eq!(
            Behaviour::from_prompt("echo traceparent").ok(),
            Some(Behaviour::EchoTraceparent { traceparent: None })
        );
        assert_eq!(
            Behaviour::from_prompt("!crash").ok(),
            Some(Behaviour::Crash { code: 3 })
        );
        assert_eq!(
            Behaviour::from_prompt("!crash 7").ok(),
            Some(Behaviour::Crash { code: 7 })
        );
        assert_eq!(
            Behaviour::from_prompt("!emit 100000 16").ok(),
            Some(Behaviour::Emit {
                chunks: 100_000,
                bytes: 16
            })
        );
        assert_eq!(
            Behaviour::from_prompt("!slow 3 10").ok(),
            Some(Behaviour::Slow {
                chunks: 3,
                interval: Duration::from_millis(10)
            })
        );
        assert_eq!(
            Behaviour::from_prompt("!fail").ok(),
            Some(Behaviour::Fail { lines: 0, bytes: 0 })
        );
        assert_eq!(
            Behaviour::from_prompt("!fail 30 1000").ok(),
            Some(Behaviour::Fail {
                lines: 30,
                bytes: 1000
            })
        );
        assert_eq!(
            Behaviour::from_prompt("!fs /tmp/a file.txt").ok(),
            Some(Behaviour::Fs {
                path: PathBuf::from("/tmp/a file.txt")
            })
        );
    }

    #[test]
    fn client_side_turns_come_before_keywords() {
        assert_eq!(
            Behaviour::from_prompt("read file notes/tool permission.txt").ok(),
            Some(Behaviour::ReadFile {
                path: PathBuf::from("notes/tool permission.txt"),
                line: None,
                limit: None
            })
        );
        assert_eq!(
            Behaviour::from_prompt("read lines 2 3 a b.txt").ok(),
            Some(Behaviour::ReadFile {
                path: PathBuf::from("a b.txt"),
                line: Some(2),
                limit: Some(3)
            })
        );
        assert_eq!(
            Behaviour::from_prompt("write file out.txt hello  world").ok(),
            Some(Behaviour::WriteFile {
                path: PathBuf::from("out.txt"),
                text: "hello  world".to_owned()
            })
        );
        assert_eq!(
            Behaviour::from_prompt("use terminal echo tool; exit 3").ok(),
            Some(Behaviour::Terminal {
                line: "echo tool; exit 3".to_owned(),
                kill: false
            })
        );
        assert_eq!(
            Behaviour::from_prompt("kill terminal sleep 9").ok(),
            Some(Behaviour::Terminal {
                line: "sleep 9".to_owned(),
                kill: true
            })
        );
        for text in [
            "read lines x 1 a",
            "read lines 1 2",
            "use terminal  ",
            "kill terminal ",
        ] {
            assert_eq!(
                Behaviour::from_prompt(text).err().map(|e| e.code),
                Some(agent_client_protocol::ErrorCode::INVALID_PARAMS),
                "{text}"
            );
        }
    }

    #[test]
    fn malformed_directives_are_invalid_params() {
        for text in [
            "!emit 5",
            "!emit a b",
            "!crash x",
            "!fs",
            "!stall now",
            "!huge -1",
            "!fail x",
            "!fail 1 2 3",
        ] {
            let error = Behaviour::from_prompt(text).err();
            assert_eq!(
                error.map(|error| error.code),
                Some(ErrorCode::INVALID_PARAMS),
                "{text}"
            );
        }
    }

    #[test]
    fn prompt_text_joins_text_blocks() {
        let blocks = vec![ContentBlock::from("a"), ContentBlock::from("b c")];
        assert_eq!(prompt_text(&blocks), "a b c");
    }
}
