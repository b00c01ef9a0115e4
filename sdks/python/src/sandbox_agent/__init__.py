"""sandbox-agent: an async Python client of a sandbox-agent server
(`research/contract.md`, "Transport: /v2/rpc", "Control plane", "Host file
system", "Processes and terminals").

Layout:

- `client`: `SandboxAgentClient`: connection, sessions, prompt turns,
  permissions, questions, agents, files, processes;
- `turn`: `PromptTurn`, a turn read as an async iterator of session updates;
- `process`: `ProcessHandle`, a process's output followed by byte offset;
- `errors`: `SandboxAgentError` and its predicates;
- `question`: `check_answer`, an answer checked against its form;
- `embedded`: `EmbeddedServer`, a private server started from the binary;
- `types`: the shapes taken and returned;
- `_connection`: ACP over ``/v2/rpc`` (POST, the SSE stream resumed with
  ``Last-Event-ID``, DELETE); `_protocol`: wire names; `_meta`: the
  server's ``_meta["sandboxagent.dev"]`` read into fields; `_check`: the
  argument checks (``TypeError("<call>: <name> must be …")``).
"""

__version__ = "0.1.0"

from .client import CLIENT_NAME, FileDownload, SandboxAgentClient
from ._meta import turn_interrupted_of
from .embedded import EmbeddedServer, resolve_binary
from .errors import ErrorKind, Problem, SandboxAgentError
from .process import OutputChunkEvent, OutputDropped, OutputEvent, ProcessExit, ProcessHandle, chunk_bytes
from .question import check_answer
from .turn import PromptTurn
from .types import (
    ContentBlock,
    FsEntry,
    OutputChunk,
    PermissionDecision,
    PermissionHandler,
    PermissionRequest,
    ProcessInfo,
    QuestionAnswer,
    QuestionHandler,
    QuestionRequest,
    RunResult,
    SessionDetails,
    SessionEvent,
    SessionEventPage,
    SessionInfo,
    SessionNotification,
    SessionPage,
    SessionUpdate,
    StopReason,
)

__all__ = [
    "__version__",
    "CLIENT_NAME",
    "SandboxAgentClient",
    "FileDownload",
    "PromptTurn",
    "ProcessHandle",
    "OutputChunkEvent",
    "OutputDropped",
    "ProcessExit",
    "OutputEvent",
    "chunk_bytes",
    "SandboxAgentError",
    "ErrorKind",
    "Problem",
    "check_answer",
    "turn_interrupted_of",
    "EmbeddedServer",
    "resolve_binary",
    "ContentBlock",
    "FsEntry",
    "OutputChunk",
    "PermissionDecision",
    "PermissionHandler",
    "PermissionRequest",
    "ProcessInfo",
    "QuestionAnswer",
    "QuestionHandler",
    "QuestionRequest",
    "RunResult",
    "SessionDetails",
    "SessionEvent",
    "SessionEventPage",
    "SessionInfo",
    "SessionNotification",
    "SessionPage",
    "SessionUpdate",
    "StopReason",
]
