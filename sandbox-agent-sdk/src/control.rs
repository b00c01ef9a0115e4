//! The control plane: plain HTTP JSON routes next to `/v2/rpc`, usable
//! without a connection to an agent (research/contract.md,
//! "Extension methods and control plane").

use crate::error::Error;
use crate::meta::SessionEntry;
use acp_http_client::HttpFailure;
use agent_client_protocol::v1::schema::SessionInfo;
use ext_methods::{AgentInfo, AgentListResult, SessionEventsPage};
use reqwest::header::{AUTHORIZATION, HeaderValue};
use reqwest::{Method, Url};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Answer of `GET /v2/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// `"ok"` when the server serves.
    pub status: String,
    /// The server's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// Options of [`install_agent`](crate::SandboxAgentClient::install_agent)
/// (body of `POST /v2/agents/{agent}/install`): the wire type from
/// `ext-methods`, under the SDK's name.
pub use ext_methods::AgentInstallParams as InstallOptions;
/// Answer of `POST /v2/agents/{agent}/install`: what is installed now and
/// whether this call installed it (the wire type from `ext-methods`).
pub use ext_methods::AgentInstallResult as InstallResult;

/// `{"sessions": [...], "nextCursor"?}` of `GET /v2/sessions`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SessionsBody {
    sessions: Vec<SessionInfo>,
    /// Absent on the last page (and from servers that do not page).
    #[serde(default)]
    next_cursor: Option<String>,
}

/// HTTP access to one server's control plane.
#[derive(Debug, Clone)]
pub(crate) struct ControlPlane {
    http: reqwest::Client,
    base_url: Url,
    /// `Bearer <token>`, marked sensitive.
    authorization: Option<HeaderValue>,
}

impl ControlPlane {
    /// Control-plane access to the server at `base_url`.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a URL that is not absolute http(s), or
    /// a token that is not a valid header value.
    pub(crate) fn new(
        http: reqwest::Client,
        base_url: &str,
        token: Option<&str>,
    ) -> Result<ControlPlane, Error> {
        let base_url = Url::parse(base_url)
            .map_err(|e| Error::InvalidOptions(format!("base URL {base_url:?}: {e}")))?;
        if !matches!(base_url.scheme(), "http" | "https") || base_url.cannot_be_a_base() {
            return Err(Error::InvalidOptions(format!(
                "base URL {base_url}: must be an http or https URL"
            )));
        }
        let authorization = token
            .map(|token| {
                let mut value =
                    HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                        Error::InvalidOptions("the token is not a valid header value".to_owned())
                    })?;
                value.set_sensitive(true);
                Ok::<_, Error>(value)
            })
            .transpose()?;
        Ok(ControlPlane {
            http,
            base_url,
            authorization,
        })
    }

    /// `GET /v2/health` (no auth).
    pub(crate) async fn health(&self) -> Result<Health, Error> {
        self.send(Method::GET, &["v2", "health"], &[], None).await
    }

    /// `GET /v2/agents`.
    pub(crate) async fn agents(&self) -> Result<Vec<AgentInfo>, Error> {
        let list: AgentListResult = self.send(Method::GET, &["v2", "agents"], &[], None).await?;
        Ok(list.agents)
    }

    /// `POST /v2/agents/{agent}/install`.
    pub(crate) async fn install(
        &self,
        agent: &str,
        options: &InstallOptions,
    ) -> Result<InstallResult, Error> {
        let body = serde_json::to_vec(options).map_err(|e| Error::InvalidOptions(e.to_string()))?;
        self.send(
            Method::POST,
            &["v2", "agents", agent, "install"],
            &[],
            Some(body),
        )
        .await
    }

    /// `GET /v2/sessions?limit=&cursor=&agent=&state=&q=` (the pairs of
    /// `query`): one page of entries and the cursor of the next.
    pub(crate) async fn sessions(
        &self,
        query: &[(&str, &str)],
    ) -> Result<(Vec<SessionEntry>, Option<String>), Error> {
        let body: SessionsBody = self
            .send(Method::GET, &["v2", "sessions"], query, None)
            .await?;
        let entries = body
            .sessions
            .into_iter()
            .map(SessionEntry::from_info)
            .collect();
        Ok((entries, body.next_cursor))
    }

    /// `GET /v2/sessions/{id}?agent=`: session ids are per agent; without
    /// `agent` the server finds the one session with that id.
    pub(crate) async fn session(
        &self,
        agent: Option<&str>,
        session_id: &str,
    ) -> Result<SessionEntry, Error> {
        let query: Vec<(&str, &str)> = agent.map(|agent| ("agent", agent)).into_iter().collect();
        let info: SessionInfo = self
            .send(Method::GET, &["v2", "sessions", session_id], &query, None)
            .await?;
        Ok(SessionEntry::from_info(info))
    }

    /// `GET /v2/sessions/{id}/events?agent=&offset=&limit=`.
    pub(crate) async fn session_events(
        &self,
        agent: Option<&str>,
        session_id: &str,
        offset: u64,
        limit: Option<u32>,
    ) -> Result<SessionEventsPage, Error> {
        let offset = offset.to_string();
        let limit = limit.map(|limit| limit.to_string());
        let mut query: Vec<(&str, &str)> =
            agent.map(|agent| ("agent", agent)).into_iter().collect();
        query.push(("offset", offset.as_str()));
        if let Some(limit) = &limit {
            query.push(("limit", limit.as_str()));
        }
        self.send(
            Method::GET,
            &["v2", "sessions", session_id, "events"],
            &query,
            None,
        )
        .await
    }

    /// A request to `segments` with auth, for callers that build the body
    /// themselves (the file system API streams its bodies).
    pub(crate) fn request(
        &self,
        method: Method,
        segments: &[&str],
        query: &[(&str, &str)],
    ) -> reqwest::RequestBuilder {
        let request = self.http.request(method, self.url(segments, query));
        match &self.authorization {
            Some(authorization) => request.header(AUTHORIZATION, authorization.clone()),
            None => request,
        }
    }

    /// Sends `request`: the response on 2xx, [`Error::Http`] with the
    /// problem document otherwise.
    pub(crate) async fn exchange(
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, Error> {
        let response = request.send().await?;
        if !response.status().is_success() {
            return Err(Error::Http(HttpFailure::from_response(response).await));
        }
        Ok(response)
    }

    /// The JSON body of a 2xx `response` to `what`.
    pub(crate) async fn json<T: DeserializeOwned>(
        response: reqwest::Response,
        what: &str,
    ) -> Result<T, Error> {
        let bytes = response.bytes().await?;
        serde_json::from_slice(&bytes).map_err(|error| Error::InvalidResponse {
            what: what.to_owned(),
            message: error.to_string(),
        })
    }

    /// The URL of `segments` under the base URL (each segment escaped).
    fn url(&self, segments: &[&str], query: &[(&str, &str)]) -> Url {
        let mut url = self.base_url.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        url
    }

    /// One exchange: a JSON answer on 2xx, [`Error::Http`] with the problem
    /// document otherwise.
    async fn send<T: DeserializeOwned>(
        &self,
        method: Method,
        segments: &[&str],
        query: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Result<T, Error> {
        let url = self.url(segments, query);
        let what = format!("{method} {}", url.path());
        let mut request = self
            .http
            .request(method, url)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(authorization) = &self.authorization {
            request = request.header(AUTHORIZATION, authorization.clone());
        }
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        let response = request.send().await?;
        if !response.status().is_success() {
            return Err(Error::Http(HttpFailure::from_response(response).await));
        }
        let bytes = response.bytes().await?;
        serde_json::from_slice(&bytes).map_err(|error| Error::InvalidResponse {
            what,
            message: error.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_keep_prefixes_and_escape_segments() -> Result<(), Error> {
        let plane = ControlPlane::new(reqwest::Client::new(), "https://host/sandbox/", None)?;
        let url = plane.url(&["v2", "sessions", "a/b c", "events"], &[("offset", "3")]);
        assert_eq!(
            url.as_str(),
            "https://host/sandbox/v2/sessions/a%2Fb%20c/events?offset=3"
        );
        let plane = ControlPlane::new(reqwest::Client::new(), "http://127.0.0.1:9", None)?;
        assert_eq!(
            plane.url(&["v2", "health"], &[]).as_str(),
            "http://127.0.0.1:9/v2/health"
        );
        assert!(ControlPlane::new(reqwest::Client::new(), "ftp://x", None).is_err());
        assert!(ControlPlane::new(reqwest::Client::new(), "http://x", Some("bad\ntoken")).is_err());
        Ok(())
    }

    #[test]
    fn install_options_serialize_only_what_is_set() -> Result<(), serde_json::Error> {
        assert_eq!(serde_json::to_string(&InstallOptions::default())?, "{}");
        let options = InstallOptions {
            reinstall: true,
            version: Some("0.15.0".into()),
        };
        assert_eq!(
            serde_json::to_string(&options)?,
            r#"{"reinstall":true,"version":"0.15.0"}"#
        );
        Ok(())
    }
}
