//! [`KeyedClient`]: the gateway's HTTP client for a streamable HTTP upstream, which also sends a
//! spend's idempotency key as the `Idempotency-Key` header.
//!
//! It is `reqwest::Client` as rmcp uses it, except that a `tools/call` request whose `_meta`
//! holds `callid/idempotency-key` is posted with that key in `Idempotency-Key` too, so an
//! upstream (or a proxy in front of it) that honours the HTTP convention sees it without reading
//! the JSON-RPC body. Redirects are not followed.

use crate::keys::{IDEMPOTENCY_HEADER, IDEMPOTENCY_META};
use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, JsonRpcRequest, MetaObject, RequestMetaObject,
};
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use sse_stream::Sse;
use std::collections::HashMap;
use std::sync::Arc;

/// `reqwest::Client` plus the `Idempotency-Key` header on spends.
#[derive(Debug, Clone)]
pub struct KeyedClient(reqwest::Client);

impl KeyedClient {
    /// A client that follows no redirects.
    pub fn new() -> Result<KeyedClient, reqwest::Error> {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .tcp_nodelay(true)
            .build()
            .map(KeyedClient)
    }
}

/// The idempotency key in a `tools/call` request's `_meta`, if any, read where the message holds
/// it (nothing of the call, its arguments least, is copied). rmcp writes one `_meta` on the wire
/// from three places, and this reads them in the order it lets win: the request's typed
/// metadata, the legacy metadata beside it, then the parameters' own `_meta`.
pub fn idempotency_key(message: &ClientJsonRpcMessage) -> Option<&str> {
    let ClientJsonRpcMessage::Request(JsonRpcRequest {
        request: ClientRequest::CallToolRequest(call),
        ..
    }) = message
    else {
        return None;
    };
    let extensions = &call.extensions;
    [
        extensions.get::<RequestMetaObject>().map(|m| &m.0.0),
        extensions.get::<MetaObject>().map(|m| &m.0),
        call.params.meta.as_ref().map(|m| &m.0.0),
    ]
    .into_iter()
    .flatten()
    .find_map(|meta| meta.get(IDEMPOTENCY_META))?
    .as_str()
}

fn with_key(
    message: &ClientJsonRpcMessage,
    mut headers: HashMap<HeaderName, HeaderValue>,
) -> HashMap<HeaderName, HeaderValue> {
    if let Some(value) = idempotency_key(message).and_then(|k| HeaderValue::from_str(k).ok()) {
        headers.insert(HeaderName::from_static(IDEMPOTENCY_HEADER), value);
    }
    headers
}

impl StreamableHttpClient for KeyedClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let headers = with_key(&message, custom_headers);
        self.0
            .post_message(uri, message, session_id, auth_header, headers)
            .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let headers = with_key(&message, custom_headers);
        self.0
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                headers,
                max_sse_event_size,
            )
            .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let headers = with_key(&message, custom_headers);
        self.0
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                headers,
                limits,
            )
            .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.0
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        self.0
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        self.0
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_a_spend_call_carries_the_header() {
        use rmcp::model::{
            CallToolRequest, CallToolRequestParams, ClientRequest, RequestId, RequestMetaObject,
        };
        let call = |meta: Option<RequestMetaObject>| {
            let mut params = CallToolRequestParams::new("pay");
            params.meta = meta;
            ClientJsonRpcMessage::request(
                ClientRequest::CallToolRequest(CallToolRequest::new(params)),
                RequestId::Number(1),
            )
        };
        let mut meta = RequestMetaObject::default();
        meta.0
            .0
            .insert(IDEMPOTENCY_META.into(), json!("callid-idem-v1-ab"));
        let headers = with_key(&call(Some(meta)), HashMap::new());
        assert_eq!(
            headers[&HeaderName::from_static(IDEMPOTENCY_HEADER)],
            "callid-idem-v1-ab"
        );
        assert!(with_key(&call(None), HashMap::new()).is_empty());
    }

    /// The key read from the message is the one its JSON carries, wherever rmcp keeps it.
    #[test]
    fn the_key_is_the_one_on_the_wire() {
        use rmcp::model::{CallToolRequest, CallToolRequestParams, ListToolsRequest, RequestId};
        let meta = |key: &str| {
            let mut m = RequestMetaObject::default();
            m.0.0.insert(IDEMPOTENCY_META.into(), json!(key));
            m
        };
        let call = |params: Option<&str>, typed: Option<&str>, legacy: Option<&str>| {
            let mut p = CallToolRequestParams::new("pay");
            p.meta = params.map(meta);
            let mut request = CallToolRequest::new(p);
            if let Some(k) = typed {
                request.extensions.insert(meta(k));
            }
            if let Some(k) = legacy {
                request.extensions.insert(meta(k).0);
            }
            ClientJsonRpcMessage::request(
                ClientRequest::CallToolRequest(request),
                RequestId::Number(1),
            )
        };
        let list = ClientJsonRpcMessage::request(
            ClientRequest::ListToolsRequest(ListToolsRequest::default()),
            RequestId::Number(2),
        );
        let cases = [
            (call(None, None, None), None),
            (call(Some("p"), None, None), Some("p")),
            (call(None, None, Some("l")), Some("l")),
            (call(Some("p"), None, Some("l")), Some("l")),
            (call(Some("p"), Some("t"), Some("l")), Some("t")),
            (call(None, Some("t"), None), Some("t")),
            (list, None),
        ];
        for (i, (message, want)) in cases.iter().enumerate() {
            let wire = serde_json::to_value(message).unwrap();
            assert_eq!(
                wire["params"]["_meta"][IDEMPOTENCY_META].as_str(),
                *want,
                "case {i}: {wire}"
            );
            assert_eq!(idempotency_key(message), *want, "case {i}: {wire}");
        }
    }
}
