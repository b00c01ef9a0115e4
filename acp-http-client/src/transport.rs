//! The typed layer: [`HttpTransport`] plugs an [`HttpConnection`] into the
//! `agent-client-protocol` crate as a transport, through its `Lines`
//! adapter (one JSON-RPC message per "line").

use crate::connection::{HttpConnection, Incoming};
use crate::error::{Error, HttpFailure};
use crate::options::TransportOptions;
use crate::protocol;
use crate::shared::{PostFailure, Shared};
use agent_client_protocol::{Agent, Channel, Client, ConnectTo, ConnectionDriver, Lines};
use futures::stream::FuturesUnordered;
use futures::{Sink, StreamExt};
use reqwest::StatusCode;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::task::JoinHandle;

/// JSON-RPC "internal error", the code of the error responses this crate
/// makes up for requests the server never answered.
const INTERNAL_ERROR: i32 = -32603;

/// `data` member holding the HTTP status of a made-up error response.
const DATA_HTTP_STATUS: &str = "httpStatus";
/// `data` member holding the problem document of a made-up error response.
const DATA_PROBLEM: &str = "problem";
/// `data` member holding the transport error text of a made-up error
/// response that has no HTTP status.
const DATA_TRANSPORT_ERROR: &str = "transportError";

/// ACP over HTTP as an `agent-client-protocol` transport: the agent side of
/// a `Client` connection.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use acp_http_client::{HttpTransport, TransportOptions};
/// use agent_client_protocol::Client;
///
/// let transport = HttpTransport::new(TransportOptions::new("http://127.0.0.1:2468")?)?;
/// let handle = transport.handle();
/// Client.v1()
///     .connect_with(transport, async |cx| {
///         // cx.send_request(InitializeRequest::new(..)) and so on, exactly
///         // as over stdio.
///         Ok(())
///     })
///     .await?;
/// assert!(handle.is_closed(), "the connection is closed when the ACP connection ends");
/// # Ok(())
/// # }
/// ```
///
/// Every outgoing message is POSTed by its own task (started in submission
/// order, so requests run concurrently); responses and everything on the
/// event stream come back through one stream, each response once. When a
/// request's POST fails so that the server will never answer it (a non-2xx
/// status, a connect failure, the connection closed), the waiting caller
/// gets a JSON-RPC error response made up here: code `-32603`, a message
/// naming the failure, and `data` `{"httpStatus": N, "problem": {..}}` (or
/// `{"transportError": ".."}`); read it back with [`http_failure`]. When the
/// ACP connection ends, the connection is closed (DELETE).
///
/// Needs a Tokio runtime.
#[derive(Debug)]
pub struct HttpTransport {
    connection: HttpConnection,
    incoming: Incoming,
}

/// A handle to the connection behind an [`HttpTransport`]; cheap to clone,
/// usable while `connect_with` runs and after.
#[derive(Debug, Clone)]
pub struct TransportHandle {
    connection: HttpConnection,
}

impl HttpTransport {
    /// A transport for the endpoint `options` describe. Nothing is sent
    /// until the ACP connection sends its first message (`initialize`).
    ///
    /// # Errors
    /// [`Error::InvalidOptions`], as [`HttpConnection::new`].
    pub fn new(options: TransportOptions) -> Result<HttpTransport, Error> {
        let (connection, incoming) = HttpConnection::new(options)?;
        Ok(HttpTransport {
            connection,
            incoming,
        })
    }

    /// A handle to read the connection id and close the connection.
    pub fn handle(&self) -> TransportHandle {
        TransportHandle {
            connection: self.connection.clone(),
        }
    }

    /// The connection, and the `Lines` transport over it: outgoing lines
    /// are POSTed, incoming lines are [`Incoming`].
    fn into_lines(
        self,
    ) -> (
        HttpConnection,
        Lines<PostSink, impl futures::Stream<Item = std::io::Result<String>> + Send + 'static>,
    ) {
        let HttpTransport {
            connection,
            incoming,
        } = self;
        let outgoing = PostSink {
            shared: Arc::clone(connection.shared()),
            delivering: FuturesUnordered::new(),
        };
        let incoming = incoming.map(|item| item.map_err(std::io::Error::other));
        (connection, Lines::new(outgoing, incoming))
    }
}

impl TransportHandle {
    /// The connection id the server named; `None` before the `initialize`
    /// response.
    pub fn connection_id(&self) -> Option<String> {
        self.connection.connection_id()
    }

    /// Whether the connection is closed.
    pub fn is_closed(&self) -> bool {
        self.connection.is_closed()
    }

    /// Closes the connection (DELETE), as [`HttpConnection::close`]. A
    /// running ACP connection sees its incoming side end: requests still
    /// waiting fail.
    ///
    /// # Errors
    /// As [`HttpConnection::close`].
    pub async fn close(&self) -> Result<(), Error> {
        self.connection.close().await
    }
}

impl ConnectTo<Client> for HttpTransport {
    async fn connect_to(self, client: impl ConnectTo<Agent>) -> agent_client_protocol::Result<()> {
        let (connection, lines) = self.into_lines();
        let guard = CloseOnDrop(Some(connection));
        let result = ConnectTo::<Client>::connect_to(lines, client).await;
        guard.close().await;
        result
    }

    /// `Lines`' own channel and driver (which can finish gracefully:
    /// accepted output is POSTed before it completes), followed by the
    /// DELETE.
    fn into_channel_and_future(self) -> (Channel, Option<ConnectionDriver>) {
        let (connection, lines) = self.into_lines();
        let guard = CloseOnDrop(Some(connection));
        let (channel, driver) = ConnectTo::<Client>::into_channel_and_future(lines);
        let driver = driver.map(|driver| {
            driver.map_future(move |work| async move {
                let result = work.await;
                guard.close().await;
                result
            })
        });
        (channel, driver)
    }
}

/// Closes the connection when the ACP connection is over: explicitly with
/// [`close`](Self::close), or in the background if the driver is dropped
/// first.
struct CloseOnDrop(Option<HttpConnection>);

impl CloseOnDrop {
    async fn close(mut self) {
        if let Some(connection) = self.0.take()
            && let Err(error) = connection.close().await
        {
            tracing::warn!(%error, "closing the connection failed");
        }
    }
}

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        if let Some(connection) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                let _ = connection.close().await;
            });
        }
    }
}

/// The outgoing half given to `Lines`: each message is checked and recorded
/// here, in submission order, then POSTed by a task of its own.
struct PostSink {
    shared: Arc<Shared>,
    /// POSTs of notifications and responses not finished yet; closing the
    /// sink waits for them (the SDK's contract: drain accepted output).
    /// Requests are not waited for: their answers are no longer wanted once
    /// the client is done, and the DELETE that follows releases them on the
    /// server.
    delivering: FuturesUnordered<JoinHandle<()>>,
}

impl PostSink {
    /// Forgets finished POST tasks.
    fn reap(&mut self, cx: &mut Context<'_>) {
        while let Poll::Ready(Some(_)) = self.delivering.poll_next_unpin(cx) {}
    }
}

impl Sink<String> for PostSink {
    type Error = std::io::Error;

    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.reap(cx);
        Poll::Ready(Ok(()))
    }

    fn start_send(self: Pin<&mut Self>, message: String) -> Result<(), Self::Error> {
        let this = self.get_mut();
        match this.shared.prepare(message) {
            Ok(prepared) => {
                let is_request = prepared.is_request();
                let shared = Arc::clone(&this.shared);
                let task = tokio::spawn(async move {
                    if let Err(failure) = shared.execute(prepared).await {
                        answer_failure(&shared, failure);
                    }
                });
                if !is_request {
                    this.delivering.push(task);
                }
            }
            Err(failure) => answer_failure(&this.shared, failure),
        }
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each message is handed to its own POST task at once.
        Poll::Ready(Ok(()))
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        loop {
            match self.delivering.poll_next_unpin(cx) {
                Poll::Ready(Some(_)) => {}
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// A POST failed: answer a released request with a made-up error response
/// so its caller is not left waiting; anything else can only be logged.
fn answer_failure(shared: &Shared, failure: PostFailure) {
    let PostFailure {
        error,
        released,
        method,
    } = failure;
    match released {
        Some(id) => {
            tracing::debug!(%error, id, method, "request failed; answering it locally");
            shared.push(protocol::error_response(&id, &error_object(&error)));
        }
        None => tracing::warn!(%error, method, "sending a message failed"),
    }
}

/// The JSON-RPC error object standing in for the answer to a request that
/// failed with `error`.
fn error_object(error: &Error) -> serde_json::Value {
    let data = match error {
        Error::Http(HttpFailure { status, problem }) => {
            let mut data = serde_json::Map::new();
            data.insert(DATA_HTTP_STATUS.to_owned(), status.as_u16().into());
            if let Some(problem) = problem
                && let Ok(problem) = serde_json::to_value(problem)
            {
                data.insert(DATA_PROBLEM.to_owned(), problem);
            }
            serde_json::Value::Object(data)
        }
        other => serde_json::json!({ DATA_TRANSPORT_ERROR: other.to_string() }),
    };
    serde_json::json!({
        "code": INTERNAL_ERROR,
        "message": error.to_string(),
        "data": data,
    })
}

/// The HTTP status and problem document of an error that [`HttpTransport`]
/// made up for a request whose POST got a non-2xx answer; `None` for any
/// other error (including a JSON-RPC error from the agent itself).
///
/// Recognises code `-32603` with `data.httpStatus` (an integer 100..=999)
/// and an optional `data.problem`.
pub fn http_failure(error: &agent_client_protocol::Error) -> Option<HttpFailure> {
    if i32::from(error.code) != INTERNAL_ERROR {
        return None;
    }
    let data = error.data.as_ref()?;
    let status = data
        .get(DATA_HTTP_STATUS)?
        .as_u64()
        .and_then(|status| u16::try_from(status).ok())
        .and_then(|status| StatusCode::from_u16(status).ok())?;
    let problem = data
        .get(DATA_PROBLEM)
        .and_then(|problem| serde_json::from_value(problem.clone()).ok())
        .map(Box::new);
    Some(HttpFailure { status, problem })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Problem;

    #[test]
    fn made_up_errors_carry_status_and_problem_and_read_back() {
        let problem = Problem {
            problem_type: "urn:sandbox-agent:error:unknown-agent".into(),
            title: Some("Unknown agent".into()),
            status: Some(404),
            detail: Some("no agent nope".into()),
            instance: None,
            extensions: serde_json::Map::new(),
        };
        let error = Error::Http(HttpFailure {
            status: StatusCode::NOT_FOUND,
            problem: Some(Box::new(problem.clone())),
        });
        let text = protocol::error_response("7", &error_object(&error));
        let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let acp: agent_client_protocol::Error = serde_json::from_value(value["error"].clone())
            .unwrap_or_else(|_| {
                agent_client_protocol::Error::new(0, "not an error object".to_owned())
            });
        assert_eq!(i32::from(acp.code), -32603);
        assert!(acp.message.contains("404"), "{}", acp.message);
        assert!(acp.message.contains("no agent nope"), "{}", acp.message);
        assert_eq!(
            http_failure(&acp),
            Some(HttpFailure {
                status: StatusCode::NOT_FOUND,
                problem: Some(Box::new(problem))
            })
        );
    }

    #[test]
    fn other_errors_are_not_http_failures() {
        let transport = error_object(&Error::NotConnected);
        assert!(transport["data"][DATA_TRANSPORT_ERROR].is_string());
        let acp = agent_client_protocol::Error::internal_error();
        assert_eq!(http_failure(&acp), None);
        let agent = agent_client_protocol::Error::new(-32002, "Resource not found")
            .data(serde_json::json!({"httpStatus": 404}));
        assert_eq!(http_failure(&agent), None, "only code -32603 is ours");
    }
}
