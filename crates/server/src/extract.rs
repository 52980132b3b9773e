//! Request body parsing with precise 400s: malformed JSON, a missing field and a wrong type
//! each name the field; a multipart form is split into its parts; bodies over the limit get a
//! JSON 413.

use axum::extract::{FromRequest, Request};
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;

/// A parsed JSON body together with its raw bytes (forwarded unchanged when not rewritten).
pub struct JsonBody<T> {
    pub value: T,
    pub raw: Bytes,
}

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let raw = read_whole(req, state).await?;
        let value = parse(&raw)?;
        Ok(JsonBody { value, raw })
    }
}

/// A JSON body whose errors are answered in a dialect's shape `E` (Ollama's, Anthropic's).
pub struct DialectJson<T, E> {
    pub value: T,
    shape: std::marker::PhantomData<E>,
}

impl<T: DeserializeOwned, E: From<ApiError>> FromRequest<AppState> for DialectJson<T, E>
where
    E: axum::response::IntoResponse,
{
    type Rejection = E;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let body = JsonBody::<T>::from_request(req, state).await.map_err(E::from)?;
        Ok(DialectJson { value: body.value, shape: std::marker::PhantomData })
    }
}

/// Reads a whole body under the body limit (a JSON 413 over it).
async fn read_whole(req: Request, state: &AppState) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|e| {
        if e.status() == http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge { limit: state.http.body_limit }
        } else {
            ApiError::bad_request(format!("Cannot read request body: {}", e.body_text()), None)
        }
    })
}

/// A `multipart/form-data` body (an upload), read whole under the body limit and split into
/// its parts by `multer`.
pub struct Form(pub api_types::form::Form);

impl FromRequest<AppState> for Form {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let ct = req.headers().get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let ct = ct.to_string();
        // The body is read before the content type is judged: a rejection that leaves it unread
        // makes hyper close the connection, which a client may be reusing for its next request.
        let raw = read_whole(req, state).await?;
        let not_multipart = || ApiError::bad_request("Request must be multipart/form-data", None);
        if !ct.trim_start().to_ascii_lowercase().starts_with("multipart/form-data") {
            return Err(not_multipart());
        }
        let boundary = multer::parse_boundary(&ct).map_err(|_| not_multipart())?;
        let body = futures_util::stream::once(async move { Ok::<_, std::convert::Infallible>(raw) });
        let mut multipart = multer::Multipart::new(body, boundary);
        let malformed = |e: multer::Error| ApiError::bad_request(format!("Malformed multipart body: {e}"), None);
        let mut parts = Vec::new();
        while let Some(field) = multipart.next_field().await.map_err(malformed)? {
            let name = field.name().unwrap_or_default().to_string();
            let file_name = field.file_name().map(str::to_string);
            let content_type = field.content_type().map(|m| m.to_string());
            let data = field.bytes().await.map_err(malformed)?;
            parts.push(api_types::form::Part { name, file_name, content_type, data });
        }
        Ok(Form(api_types::form::Form { parts }))
    }
}

/// Parses `bytes` as `T`; the error names the offending field.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("Request body is empty; expected a JSON object", None));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            return ApiError::bad_request(format!("Invalid JSON in request body: {inner}"), None);
        }
        let msg = inner.to_string();
        // serde reports a missing field at its parent's path.
        if let Some(field) = msg.strip_prefix("missing field `").and_then(|r| r.split('`').next()) {
            let param = if path == "." { field.to_string() } else { format!("{path}.{field}") };
            return ApiError::bad_request(format!("Missing required field '{param}'"), Some(&param));
        }
        let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
        if path == "." {
            ApiError::bad_request(format!("Invalid request body: {msg}"), None)
        } else {
            ApiError::bad_request(format!("Invalid value for '{path}': {msg}"), Some(&path))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use api_types::ChatCompletionRequest;

    fn err(body: &str) -> (String, Option<String>) {
        match parse::<ChatCompletionRequest>(body.as_bytes()) {
            Err(ApiError::BadRequest { message, param, .. }) => (message, param),
            Err(e) => panic!("unexpected {e:?}"),
            Ok(v) => panic!("parsed {v:?}"),
        }
    }

    #[test]
    fn names_the_field() {
        assert_eq!(err(r#"{"model":"m"}"#), ("Missing required field 'messages'".into(), Some("messages".into())));
        let (m, p) = err(r#"{"model":"m","messages":"hi"}"#);
        assert_eq!(p.as_deref(), Some("messages"));
        assert!(m.starts_with("Invalid value for 'messages': invalid type: string \"hi\", expected a sequence"), "{m}");
        let (m, p) = err(r#"{"model":"m","messages":[{"content":"x"}]}"#);
        assert_eq!((m.as_str(), p.as_deref()), ("Missing required field 'messages[0].role'", Some("messages[0].role")));
        let (_, p) = err(r#"{"model":"m","messages":[],"stream":"yes"}"#);
        assert_eq!(p.as_deref(), Some("stream"));
        let (_, p) = err(r#"{"model":7,"messages":[]}"#);
        assert_eq!(p.as_deref(), Some("model"));
    }

    #[test]
    fn malformed_and_empty() {
        let (m, p) = err(r#"{"model": "#);
        assert!(m.starts_with("Invalid JSON in request body"), "{m}");
        assert_eq!(p, None);
        assert!(err("  ").0.contains("empty"));
        assert!(err("[1]").0.starts_with("Invalid request body: invalid type: sequence"));
    }

    #[test]
    fn unknown_fields_are_kept() {
        let v: ChatCompletionRequest = parse(br#"{"model":"m","messages":[],"top_k":5,"min_p":0.1}"#).unwrap();
        assert_eq!(v.extra.get("top_k"), Some(&serde_json::json!(5)));
        assert_eq!(v.extra.get("min_p"), Some(&serde_json::json!(0.1)));
    }
}
