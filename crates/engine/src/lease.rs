//! The one request entry: [`Engine::lease`] takes a [`LeaseRequest`] (the model asked for, the
//! [`Endpoint`], its priority, keep-alive and forwarded headers) and gives the request its
//! backend: a remote provider's model, a spillover upstream, or a local backend that is pulled
//! first when auto-load allows and loaded if needed. Every request that reaches a model, from a
//! client or composed in process ([`crate::call`]), comes through here.

use api_types::ModelType;

use crate::error::{EngineError, Result, Serves};
use crate::lifecycle::Lease;
use crate::Engine;

/// The priorities a request may ask for (`priority` in its body); 0 by default.
pub use backends::options::PRIORITIES;

pub use crate::lifecycle::Forwarded;

/// A request's priority (an integer in [`PRIORITIES`], higher served first): its body's
/// `priority`, else `header`'s (`X-Lemonade-Priority`), else 0. The body is parsed only when it
/// names one; a bad value is refused, naming the field.
pub fn priority(body: &[u8], header: Option<i32>) -> Result<i32> {
    let from_header = header.unwrap_or(0);
    if memchr::memmem::find(body, b"\"priority\"").is_none() {
        return Ok(from_header);
    }
    #[derive(serde::Deserialize)]
    struct P {
        priority: Option<serde_json::Value>,
    }
    let p: P = serde_json::from_slice(body)
        .map_err(|e| EngineError::invalid(format!("Invalid JSON in request body: {e}"), None))?;
    match p.priority {
        None | Some(serde_json::Value::Null) => Ok(from_header),
        Some(v) => v.as_i64().and_then(|n| i32::try_from(n).ok()).filter(|n| PRIORITIES.contains(n)).ok_or_else(|| {
            let msg = format!("'priority' must be a whole number from -10 to 10 (higher is served first), got {v}");
            EngineError::invalid(msg, Some("priority"))
        }),
    }
}

/// What a request asks a model for: its path at the backend and the model types it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    ChatCompletions,
    Completions,
    Responses,
    Embeddings,
    Rerank,
    /// Anthropic's messages and its token count.
    Messages,
    CountTokens,
    /// Ollama's chat, generate and embed.
    OllamaChat,
    OllamaGenerate,
    OllamaEmbed,
    Speech,
    Transcriptions,
    ImageGenerations,
    ImageEdits,
    ImageVariations,
    /// llama-server's own endpoints (`/completion`, `/tokenize`, `/props`, …), on any model.
    Native(&'static str),
}

const LLM: &[ModelType] = &[ModelType::Llm];

impl Endpoint {
    /// Ollama's `/api/chat` (`chat`), else `/api/generate`.
    pub fn ollama(chat: bool) -> Endpoint {
        if chat {
            Endpoint::OllamaChat
        } else {
            Endpoint::OllamaGenerate
        }
    }

    /// llama-server's own endpoint at `path`, when it is one lemonade forwards.
    pub fn native(path: &str) -> Option<Endpoint> {
        let all = backends::llamacpp::NATIVE_POST.into_iter().chain(backends::llamacpp::NATIVE_GET);
        all.into_iter().find(|p| *p == path).map(Endpoint::Native)
    }

    /// The model types it serves.
    pub fn accepts(self) -> &'static [ModelType] {
        match self {
            Endpoint::Embeddings | Endpoint::OllamaEmbed => &[ModelType::Embedding],
            Endpoint::Rerank => &[ModelType::Reranking],
            Endpoint::Speech => &[ModelType::Tts],
            Endpoint::Transcriptions => &[ModelType::Audio],
            Endpoint::ImageGenerations | Endpoint::ImageEdits | Endpoint::ImageVariations => &[ModelType::Image],
            Endpoint::Native(_) => &ModelType::ALL,
            _ => LLM,
        }
    }

    /// Its path at the backend that serves it (llama-server's OpenAI paths, sd-server's,
    /// Kokoro's and whisper-server's own).
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions | Endpoint::OllamaChat => "/v1/chat/completions",
            Endpoint::Completions | Endpoint::OllamaGenerate => "/v1/completions",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Embeddings | Endpoint::OllamaEmbed => "/v1/embeddings",
            Endpoint::Rerank => "/v1/rerank",
            Endpoint::Messages => "/v1/messages",
            Endpoint::CountTokens => "/v1/messages/count_tokens",
            Endpoint::Speech => backends::kokoro::SPEECH_PATH,
            Endpoint::Transcriptions => backends::whispercpp::INFERENCE_PATH,
            Endpoint::ImageGenerations => backends::sdcpp::GENERATIONS_PATH,
            // sd-server redraws an image for an edit and for a variation alike.
            Endpoint::ImageEdits | Endpoint::ImageVariations => backends::sdcpp::EDITS_PATH,
            Endpoint::Native(p) => p,
        }
    }

    /// How a message to a client names it ("Model 'x' is … model; chat/completions needs …").
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "chat/completions",
            Endpoint::Completions => "completions",
            Endpoint::Responses => "responses",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Rerank => "reranking",
            Endpoint::Messages => "messages",
            Endpoint::CountTokens => "messages/count_tokens",
            Endpoint::OllamaChat => "/api/chat",
            Endpoint::OllamaGenerate => "/api/generate",
            Endpoint::OllamaEmbed => "/api/embed",
            Endpoint::Speech => "audio/speech",
            Endpoint::Transcriptions => "audio/transcriptions",
            Endpoint::ImageGenerations => "images/generations",
            Endpoint::ImageEdits => "images/edits",
            Endpoint::ImageVariations => "images/variations",
            Endpoint::Native(p) => p,
        }
    }

    /// Whether a remote provider is sent it: the text endpoints (its upstream knows what its
    /// model serves); audio and image requests are shaped for lemonade's own backends.
    fn forwarded_to_remotes(self) -> bool {
        let text = [ModelType::Llm, ModelType::Embedding, ModelType::Reranking];
        self.accepts().iter().any(|t| text.contains(t))
    }
}

/// One request for a model.
#[derive(Debug, Clone)]
pub struct LeaseRequest {
    pub model: String,
    pub endpoint: Endpoint,
    /// Higher is served first among the requests waiting for the model ([`PRIORITIES`]).
    pub priority: i32,
    /// The model's idle timeout (ms; 0 = never), set when given (Ollama's `keep_alive`).
    pub keep_alive: Option<u64>,
    /// The context size the request asks for (`ctx_size`, Ollama's `num_ctx`): used when this
    /// request loads the model, never otherwise (Lemonade v11's one load field an inference
    /// request forwards).
    pub ctx_size: Option<api_types::CtxSize>,
    /// A router collection's classifier asks: the model serves in the routing-helper pool.
    pub helper: bool,
    pub forwarded: Forwarded,
}

impl LeaseRequest {
    pub fn new(model: impl Into<String>, endpoint: Endpoint) -> LeaseRequest {
        LeaseRequest {
            model: model.into(),
            endpoint,
            priority: 0,
            keep_alive: None,
            ctx_size: None,
            helper: false,
            forwarded: Forwarded::default(),
        }
    }

    pub fn priority(mut self, priority: i32) -> LeaseRequest {
        self.priority = priority;
        self
    }

    pub fn keep_alive(mut self, ms: Option<u64>) -> LeaseRequest {
        self.keep_alive = ms;
        self
    }

    pub fn ctx_size(mut self, ctx: Option<api_types::CtxSize>) -> LeaseRequest {
        self.ctx_size = ctx;
        self
    }

    pub fn forwarded(mut self, headers: Forwarded) -> LeaseRequest {
        self.forwarded = headers;
        self
    }
}

impl Engine {
    /// Gives `req` its backend. A model registered but not downloaded is pulled first when
    /// auto-load is on; a model that will load for this request has its arguments checked
    /// first (a 400, not a backend that dies); spillover may send it to an upstream.
    pub async fn lease(&self, req: LeaseRequest) -> Result<Lease> {
        let mut lease = self.lease_for(&req).await?;
        lease.forwarded = req.forwarded;
        Ok(lease)
    }

    async fn lease_for(&self, req: &LeaseRequest) -> Result<Lease> {
        let (name, endpoint) = (req.model.as_str(), req.endpoint);
        // `<provider>.<id>` of a registered remote provider, unless a local model has that name.
        let reg = self.catalogue.registry();
        if reg.get(name).is_err() {
            if let Some(c) = reg.collection(name) {
                let is = if c.omni().is_some() { Serves::OmniCollection } else { Serves::RouterCollection };
                return Err(EngineError::WrongModelType {
                    model: name.to_string(),
                    is,
                    wants: endpoint.name().to_string(),
                });
            }
            if let Some(mut route) = self.remotes.route(name).await? {
                if !endpoint.forwarded_to_remotes() {
                    return Err(EngineError::WrongModelType {
                        model: name.to_string(),
                        is: Serves::Remote { provider: route.provider.name.clone() },
                        wants: endpoint.name().to_string(),
                    });
                }
                route.admitted = Some(route.provider.admit()?);
                return Ok(Lease::remote(&self.lifecycle, route));
            }
        }
        drop(reg);
        let info = self.lifecycle.model_for(name, endpoint.accepts(), endpoint.name())?;
        let info = match (info.loads_without_pull(), self.cfg.auto_load) {
            (true, _) => info,
            (false, true) => crate::pulls::ensure_downloaded(self, &info).await?,
            (false, false) => return Err(EngineError::NotDownloaded { model: name.to_string() }),
        };
        let load = api_types::OptionsPatch {
            set: api_types::LoadOptions { ctx_size: req.ctx_size, ..Default::default() },
            ..Default::default()
        };
        if self.cfg.auto_load && self.lifecycle.state_of(&info.name) != Some(scheduler::State::Loaded) {
            let options = self.lifecycle.effective_options(&info, &load);
            self.lifecycle.check_args(&info, &options).await?;
        }
        let (elsewhere, stayed) = crate::spill::place(self, &info).await?;
        if let Some(lease) = elsewhere {
            return Ok(lease);
        }
        let mut lease = self.lifecycle.acquire(&info, req.keep_alive, (req.priority, req.helper), &load).await?;
        lease.spilled = stayed;
        Ok(lease)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_endpoint_names_its_path_and_the_types_it_serves() {
        assert_eq!(Endpoint::OllamaChat.path(), "/v1/chat/completions");
        assert_eq!(Endpoint::Rerank.accepts(), &[ModelType::Reranking]);
        assert_eq!(Endpoint::Native("/tokenize").accepts(), &ModelType::ALL);
        assert!(Endpoint::Embeddings.forwarded_to_remotes() && Endpoint::Native("/props").forwarded_to_remotes());
        assert!(!Endpoint::Speech.forwarded_to_remotes() && !Endpoint::ImageEdits.forwarded_to_remotes());
    }

    #[test]
    fn a_body_priority_wins_over_the_header_and_a_bad_one_is_refused_naming_it() {
        assert_eq!(priority(br#"{"model":"m"}"#, Some(3)).unwrap(), 3);
        assert_eq!(priority(br#"{"model":"m"}"#, None).unwrap(), 0);
        assert_eq!(priority(br#"{"priority": -2}"#, Some(3)).unwrap(), -2);
        assert_eq!(priority(br#"{"priority": null}"#, Some(3)).unwrap(), 3);
        for bad in [&br#"{"priority": 11}"#[..], br#"{"priority": "high"}"#, br#"{"priority": 1.5}"#] {
            match priority(bad, None) {
                Err(EngineError::Invalid { param, message, .. }) => {
                    assert_eq!(param.as_deref(), Some("priority"));
                    assert!(message.contains("from -10 to 10"), "{message}");
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
