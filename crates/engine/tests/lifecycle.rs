//! The lifecycle in process, with the fake launcher (as ollama's scheduler scenario tests):
//! loads, eviction, crashes, cancelled loads, draining, preload, idle timeouts, pins, the
//! watchdog, pulls against a Hub double and remote routing. Every wait is on a condition with
//! a bounded deadline. The same behaviours are tested end to end against real llama-server in
//! crates/cli/tests; these pin the orderings down without processes.

use std::sync::Arc;

use lemonade_engine as engine;
use std::time::Duration;

use api_types::{CtxSize, LoadRequest};
use engine::fake::{self, FakeLauncher};
use engine::lease::{Endpoint, LeaseRequest};
use engine::pulls::{self, PullEvent};
use engine::{Config, Engine, EngineError};
use scheduler::{LoadOutcome, Rejection, State};
use serde_json::{json, Value};

const A: &str = "extra.a";
const B: &str = "extra.b";
const WITHIN: Duration = Duration::from_secs(10);

struct Setup {
    engine: Engine,
    launcher: Arc<FakeLauncher>,
    _tmp: tempfile::TempDir,
}

/// An engine over the fake catalogue (`extra.a`, `extra.b`) and the fake launcher.
fn setup(adjust: impl FnOnce(&mut Config)) -> Setup {
    setup_with(adjust, |cfg| fake::catalogue_at(&cfg.cache_dir, &["a.gguf", "b.gguf"]))
}

fn setup_with(adjust: impl FnOnce(&mut Config), catalogue: impl FnOnce(&Config) -> engine::Catalogue) -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = Config::new(tmp.path().join("cache"), tmp.path().join("hub"));
    cfg.remote_refresh = None;
    cfg.watchdog_interval = None;
    adjust(&mut cfg);
    let launcher = FakeLauncher::new();
    let catalogue = catalogue(&cfg);
    let engine = fake::engine(cfg, catalogue, launcher.clone());
    Setup { engine, launcher, _tmp: tmp }
}

impl Setup {
    fn state(&self, model: &str) -> State {
        self.engine.lifecycle().view().get(model).map(|v| v.state).unwrap_or(State::Unloaded)
    }

    /// Waits until `model` is in `state` (bounded); fails the test naming what it saw.
    async fn wait_state(&self, model: &str, state: State) {
        let deadline = tokio::time::Instant::now() + WITHIN;
        while self.state(model) != state {
            assert!(tokio::time::Instant::now() < deadline, "{model} never became {state:?}: {:?}", self.state(model));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    async fn load(&self, model: &str, pin: Option<bool>) -> LoadOutcome {
        let info = self.engine.catalogue().get(model).unwrap();
        let options = self.engine.lifecycle().effective_options(&info, &Default::default());
        self.engine.lifecycle().load(&info, options, pin, Default::default()).await
    }
}

#[tokio::test]
async fn a_request_loads_the_model_and_its_lease_targets_that_process() {
    let s = setup(|_| {});
    let lease = s.engine.lease(LeaseRequest::new(A, Endpoint::ChatCompletions)).await.unwrap();
    let procs = s.launcher.processes(A);
    assert_eq!(procs.len(), 1, "one process for one load");
    assert_eq!(
        lease.url("/v1/chat/completions"),
        format!("{}/v1/chat/completions", engine::launcher::Process::base_url(&*procs[0]))
    );
    assert_eq!(s.state(A), State::Loaded);
    let v = s.engine.lifecycle().view()[A].clone();
    assert_eq!(v.in_flight, 1, "the lease holds the model");
    drop(lease);
    let deadline = tokio::time::Instant::now() + WITHIN;
    while s.engine.lifecycle().view()[A].in_flight != 0 {
        assert!(tokio::time::Instant::now() < deadline, "the dropped lease was never released");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn a_second_model_evicts_the_idle_first_one_from_the_only_slot() {
    let s = setup(|_| {});
    drop(s.engine.lease(LeaseRequest::new(A, Endpoint::ChatCompletions)).await.unwrap());
    drop(s.engine.lease(LeaseRequest::new(B, Endpoint::ChatCompletions)).await.unwrap());
    let a = &s.launcher.processes(A)[0];
    assert!(a.was_stopped(), "A was stopped (SIGTERM) for B, not left running");
    assert_eq!(s.launcher.alive(), vec![B.to_string()]);
    assert_eq!((s.state(A), s.state(B)), (State::Unloaded, State::Loaded));
}

#[tokio::test]
async fn a_crashed_backend_is_reported_and_the_next_request_starts_a_new_one() {
    let s = setup(|c| c.crash_backoff = (Duration::ZERO, Duration::from_secs(60)));
    drop(s.engine.lease(LeaseRequest::new(A, Endpoint::ChatCompletions)).await.unwrap());
    s.launcher.processes(A)[0].crash();
    s.wait_state(A, State::Failed).await;
    let error = s.engine.lifecycle().view()[A].last_error.clone().unwrap();
    assert!(error.contains("exited unexpectedly (exit code 1)"), "{error}");
    assert!(error.contains("fake backend extra.a log"), "the log tail is in the error: {error}");
    let lease = s.engine.lease(LeaseRequest::new(A, Endpoint::ChatCompletions)).await.unwrap();
    let procs = s.launcher.processes(A);
    assert_eq!(procs.len(), 2, "a new process");
    assert!(procs[1].is_alive());
    assert!(lease.url("/x").starts_with(&engine::launcher::Process::base_url(&*procs[1])));
}

#[tokio::test]
async fn an_unload_during_a_load_cancels_it_and_stops_the_starting_process() {
    let s = setup(|_| {});
    s.launcher.hold(A);
    let load = {
        let e = s.engine.clone();
        tokio::spawn(async move {
            let info = e.catalogue().get(A).unwrap();
            let o = e.lifecycle().effective_options(&info, &Default::default());
            e.lifecycle().load(&info, o, None, Default::default()).await
        })
    };
    assert!(s.launcher.wait_until(WITHIN, |l| l.processes(A).len() == 1).await, "the load spawned its process");
    assert_eq!(s.state(A), State::Loading);
    s.engine.lifecycle().unload(Some(A)).await.unwrap();
    assert_eq!(load.await.unwrap(), LoadOutcome::Cancelled, "the load is answered as cancelled, not loaded");
    assert!(s.launcher.processes(A)[0].was_stopped(), "the starting process was stopped");
    assert_eq!(s.state(A), State::Unloaded);
    assert!(s.launcher.alive().is_empty());
}

#[tokio::test]
async fn an_unload_waits_for_the_request_in_flight_then_stops_the_backend() {
    // Without auto-load, so a request during the unload is refused rather than queued for the
    // reload that follows it.
    let s = setup(|c| c.auto_load = false);
    assert_eq!(s.load(A, None).await, LoadOutcome::Loaded);
    let lease = s.engine.lease(LeaseRequest::new(A, Endpoint::ChatCompletions)).await.unwrap();
    let unload = {
        let e = s.engine.clone();
        tokio::spawn(async move { e.lifecycle().unload(Some(A)).await })
    };
    s.wait_state(A, State::Unloading).await;
    // While the lease is held, the backend serves on: watched for 100 ms.
    let until = tokio::time::Instant::now() + Duration::from_millis(100);
    while tokio::time::Instant::now() < until {
        assert!(s.launcher.processes(A)[0].is_alive(), "stopped under a request in flight");
        assert!(!unload.is_finished(), "the unload was answered before the request finished");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A new request is not admitted meanwhile.
    let refused =
        s.engine.lease(LeaseRequest::new(A, Endpoint::ChatCompletions)).await.err().expect("refused while unloading");
    assert!(matches!(refused, EngineError::Rejected { why: Rejection::Unloading, .. }), "{refused:?}");
    drop(lease);
    assert_eq!(tokio::time::timeout(WITHIN, unload).await.unwrap().unwrap().unwrap(), vec![A.to_string()]);
    assert!(s.launcher.processes(A)[0].was_stopped());
}

#[tokio::test]
async fn preload_loads_the_listed_models_in_order_without_a_request() {
    let s = setup(|c| {
        c.preload = vec![B.into(), A.into()];
        c.scheduler.limits = Some(scheduler::Limits::uniform(2));
    });
    engine::loads::preload(&s.engine);
    assert_eq!(s.engine.lifecycle().loading(), vec![B.to_string(), A.to_string()], "both announced as loading");
    s.wait_state(A, State::Loaded).await;
    s.wait_state(B, State::Loaded).await;
    assert_eq!(s.launcher.spawn_order(), vec![B.to_string(), A.to_string()], "in the order given");
    assert!(s.engine.lifecycle().loading().is_empty());
}

#[tokio::test]
async fn an_idle_model_is_unloaded_after_its_idle_timeout_and_not_before_its_lease_ends() {
    let s = setup(|c| c.scheduler.idle_timeout_ms = Some(Some(50)));
    let lease = s.engine.lease(LeaseRequest::new(A, Endpoint::ChatCompletions)).await.unwrap();
    let until = tokio::time::Instant::now() + Duration::from_millis(150);
    while tokio::time::Instant::now() < until {
        assert_eq!(s.state(A), State::Loaded, "unloaded for idleness while in use");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(lease);
    s.wait_state(A, State::Unloaded).await;
    assert!(s.launcher.processes(A)[0].was_stopped());
}

#[tokio::test]
async fn a_load_that_needs_the_pinned_models_slot_is_refused_at_once_naming_it() {
    let s = setup(|_| {});
    assert_eq!(s.load(A, Some(true)).await, LoadOutcome::Loaded);
    match s.load(B, None).await {
        LoadOutcome::Refused(Rejection::SlotsPinned(pinned)) => assert_eq!(pinned, vec![A.to_string()]),
        other => panic!("expected slots_pinned, got {other:?}"),
    }
    assert!(s.launcher.processes(B).is_empty(), "B never started");
    assert!(s.launcher.processes(A)[0].is_alive(), "the pinned model was not touched");
}

#[tokio::test]
async fn a_failed_start_is_retried_once_and_a_missing_binary_is_not_retried() {
    let s = setup(|_| {});
    // A process that never gets ready is retried once (after evicting others), then fails.
    s.launcher.fail_ready(A, "out of memory while loading", 2);
    match s.load(A, None).await {
        LoadOutcome::Failed(m) => assert!(m.contains("out of memory while loading"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.launcher.starts(A), 2, "retried exactly once");
    // Once it would succeed, the first failure is retried into a load.
    s.launcher.fail_ready(A, "out of memory while loading", 1);
    assert_eq!(s.load(A, None).await, LoadOutcome::Loaded);
    assert_eq!(s.launcher.starts(A), 4);
    s.launcher.fail_prepare(B, "llama-server for the 'cpu' backend is not installed");
    match s.load(B, None).await {
        LoadOutcome::Failed(m) => assert!(m.contains("not installed"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.launcher.starts(B), 1, "a fatal start is not retried");
    assert!(s.launcher.processes(B).is_empty(), "nothing was spawned for B");
}

#[tokio::test]
async fn the_watchdog_kills_a_backend_that_stops_answering_and_reports_it() {
    let s = setup(|c| c.watchdog_interval = Some(Duration::from_millis(10)));
    drop(s.engine.lease(LeaseRequest::new(A, Endpoint::ChatCompletions)).await.unwrap());
    s.launcher.set_unhealthy(A, true);
    s.wait_state(A, State::Failed).await;
    let error = s.engine.lifecycle().view()[A].last_error.clone().unwrap();
    assert!(error.contains("stopped answering its health checks"), "{error}");
}

#[tokio::test]
async fn a_request_for_a_model_of_another_type_names_both_types() {
    let s = setup(|_| {});
    let e = s.engine.lease(LeaseRequest::new(A, Endpoint::Embeddings)).await.err().unwrap();
    assert_eq!(e.to_string(), format!("Model '{A}' is an llm model; embeddings needs an embedding model."));
    assert!(s.launcher.processes(A).is_empty());
}

/// A pull against the Hub double: events in order (progress before its file is done, every
/// file done before `Complete`), and a file the double corrupts ends in `Error` naming it.
#[tokio::test]
async fn pull_events_come_in_order_and_a_failed_file_ends_with_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("hub-root/org/tiny-GGUF");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(repo.join("tiny-Q4_0.gguf"), vec![7u8; 300_000]).unwrap();
    let hub = test_support::hub::HubDouble::start(&tmp.path().join("hub-root"), Default::default()).await;
    let adjust = |c: &mut Config| {
        c.hub_endpoint = Some(hub.url.clone());
        c.cache_dir = tmp.path().join("cache");
        c.hf_cache = tmp.path().join("hf");
    };
    // The real catalogue over this test's cache dirs: registration writes user_models.json.
    let s = setup_with(adjust, |c| engine::Catalogue::load(engine::catalogue_config(c)).unwrap());
    let req = api_types::PullRequest {
        model: Some("user.tiny".into()),
        checkpoint: Some("org/tiny-GGUF:Q4_0".into()),
        recipe: Some("llamacpp".into()),
        ..Default::default()
    };
    let m = pulls::resolve(&s.engine, &req).await.unwrap();
    assert!(!m.downloaded);
    let mut rx = pulls::pull_in_background(&s.engine, m.clone());
    let mut events = Vec::new();
    while let Some(ev) = tokio::time::timeout(WITHIN, rx.recv()).await.expect("events keep coming") {
        events.push(ev);
    }
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| match e {
            PullEvent::Progress { .. } => "progress",
            PullEvent::FileDone { .. } => "file_done",
            PullEvent::Complete { .. } => "complete",
            PullEvent::Error(_) => "error",
        })
        .collect();
    assert_eq!(kinds.first(), Some(&"progress"), "{events:?}");
    assert_eq!(&kinds[kinds.len() - 2..], ["file_done", "complete"], "{events:?}");
    match &events[kinds.len() - 2] {
        PullEvent::FileDone { file, index, total, bytes } => {
            assert!(file.ends_with("tiny-Q4_0.gguf"), "{file}");
            assert_eq!((*index, *total, *bytes), (1, 1, 300_000));
        }
        e => panic!("{e:?}"),
    }
    let last_progress = events.iter().rev().find_map(|e| match e {
        PullEvent::Progress { done, size, .. } => Some((*done, *size)),
        _ => None,
    });
    assert_eq!(last_progress, Some((300_000, Some(300_000))), "the last progress says the file is whole");
    assert!(s.engine.catalogue().get("user.tiny").unwrap().downloaded, "downloaded once Complete was sent");

    // The same model again, its file now corrupt on the Hub and gone from the cache.
    std::fs::remove_dir_all(tmp.path().join("hf")).unwrap();
    hub.set_knobs(test_support::hub::Knobs { corrupt: true, ..Default::default() });
    let mut rx = pulls::pull_in_background(&s.engine, m);
    let mut last = None;
    while let Some(ev) = tokio::time::timeout(WITHIN, rx.recv()).await.expect("events keep coming") {
        assert!(
            !matches!(ev, PullEvent::FileDone { .. } | PullEvent::Complete { .. }),
            "a corrupt file is never done: {ev:?}"
        );
        last = Some(ev);
    }
    match last {
        Some(PullEvent::Error(e)) => assert!(e.contains("tiny-Q4_0.gguf") || e.contains("sha256"), "{e}"),
        other => panic!("expected an error event last, got {other:?}"),
    }
}

/// A remote provider double: `/v1/models` lists `up-model`.
async fn provider() -> String {
    use axum::routing::get;
    let app = axum::Router::new().route(
        "/v1/models",
        get(|| async {
            axum::Json(serde_json::json!({"object": "list", "data": [{"id": "up-model", "object": "model"}]}))
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    url
}

#[tokio::test]
async fn a_remote_models_lease_routes_to_its_provider_with_the_upstream_id_and_takes_no_slot() {
    let s = setup(|_| {});
    let url = provider().await;
    let up = s.engine.remotes().install("up", Some(&url), None).await.unwrap();
    assert_eq!(up.models, vec!["up.up-model".to_string()]);
    let lease = s.engine.lease(LeaseRequest::new("up.up-model", Endpoint::ChatCompletions)).await.unwrap();
    match &lease.target {
        engine::Target::Remote(r) => {
            assert_eq!((r.id.as_str(), r.name.as_str()), ("up-model", "up.up-model"));
        }
        engine::Target::Local { .. } => panic!("a remote model leased locally"),
    }
    assert_eq!(lease.name(), "up.up-model", "the name the client asked for");
    assert_eq!(lease.url("/v1/chat/completions"), format!("{url}/v1/chat/completions"));
    assert!(s.engine.lifecycle().view().is_empty(), "the scheduler never saw it");
    assert!(s.launcher.spawn_order().is_empty());
    let e = s.engine.lease(LeaseRequest::new("up.other", Endpoint::ChatCompletions)).await.err().unwrap();
    assert!(e.to_string().contains("does not list 'other'; it offers: up.up-model"), "{e}");
}

/// The admin load's conditions are decided by the owner on the state it holds: a request
/// starts loading the model after the handler could have read "unloaded"; the admin load with
/// overrides is refused naming the state, and its overrides are not recorded.
#[tokio::test]
async fn an_admin_load_racing_a_load_is_decided_on_the_state_the_owner_holds() {
    let s = setup(|_| {});
    s.launcher.hold(A);
    let request = {
        let e = s.engine.clone();
        tokio::spawn(async move { e.lease(LeaseRequest::new(A, Endpoint::ChatCompletions)).await.map(drop) })
    };
    assert!(s.launcher.wait_until(WITHIN, |l| l.processes(A).len() == 1).await);
    let with_ctx = api_types::AdminLoadRequest { gguf_n_ctx: Some(512), ..Default::default() };
    let e = engine::admin::load(&s.engine, A, &with_ctx).await.unwrap_err();
    match &e {
        EngineError::Invalid { code: Some("invalid_load_request"), message, .. } => {
            assert_eq!(message, &format!("Model '{A}' is loading: unload it before loading with overrides"))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.engine.lifecycle().load_override(A), None, "a refused override is not recorded");
    s.launcher.release(A);
    request.await.unwrap().unwrap();
    // Loaded: a plain admin load leaves it as it is (no second process), overrides are refused.
    let m = engine::admin::load(&s.engine, A, &Default::default()).await.unwrap();
    assert!(m.is_loaded && m.runtime_state == "loaded", "{m:?}");
    assert_eq!(s.launcher.processes(A).len(), 1);
    let e = engine::admin::load(&s.engine, A, &with_ctx).await.unwrap_err();
    assert!(e.to_string().contains("is loaded: unload it before loading with overrides"), "{e}");
}

fn body(v: Value) -> serde_json::Map<String, Value> {
    v.as_object().unwrap().clone()
}

/// `POST /models/{id}/options` merges, `null` removes, a dry run saves nothing, a refused body
/// saves nothing, `DELETE` erases; none of it loads the model.
#[tokio::test]
async fn per_model_options_merge_dry_run_refuse_and_reset_without_loading() {
    let s = setup(|_| {});
    let e = &s.engine;
    let info = e.catalogue().get(A).unwrap();
    let fresh = engine::options::view(e, &info);
    assert_eq!(Value::Object(fresh.saved.clone()), json!({}));
    assert_eq!(fresh.effective, fresh.defaults, "nothing saved: effective is the defaults");
    assert_eq!(fresh.effective["model_name"], A);
    assert_eq!((fresh.effective["ctx_size"].clone(), fresh.resolved_ctx_size), (json!(4096), Some(4096)));

    let v = engine::options::save(
        e,
        &info,
        &body(json!({"ctx_size": 2048, "llamacpp_args": "--no-mmap", "model_name": "ignored"})),
    )
    .await
    .unwrap();
    assert_eq!(Value::Object(v.saved), json!({"ctx_size": 2048, "llamacpp_args": "--no-mmap"}));
    assert_eq!(
        (v.effective["ctx_size"].clone(), v.effective["llamacpp_args"].clone()),
        (json!(2048), json!("--no-mmap"))
    );
    assert_eq!(v.defaults["ctx_size"], 4096, "defaults do not move");
    let file = std::fs::read_to_string(e.cfg().cache_dir.join("recipe_options.json")).unwrap();
    assert!(file.contains("--no-mmap"), "{file}");

    let v = engine::options::save(e, &info, &body(json!({"llamacpp_args": null}))).await.unwrap();
    assert_eq!(Value::Object(v.saved), json!({"ctx_size": 2048}), "null removes only its key");

    let dry = engine::options::save(e, &info, &body(json!({"ctx_size": -1, "dry_run": true}))).await.unwrap();
    assert_eq!((dry.effective["ctx_size"].clone(), Value::Object(dry.saved)), (json!(-1), json!({"ctx_size": 2048})));
    assert_eq!(engine::options::view(e, &info).effective["ctx_size"], 2048, "the dry run saved nothing");

    for (bad, param) in [
        (json!({"ctx_size": 0}), "ctx_size"),
        (json!({"ctx_size": "big"}), "ctx_size"),
        (json!({"steps": 4}), "steps"),
        (json!({"llamacpp_argz": "-t 1"}), "llamacpp_argz"),
        (json!({"llamacpp_args": "--port 1"}), "llamacpp_args"),
        (json!({"ctx_size": 1024, "dry_run": "yes"}), "dry_run"),
    ] {
        match engine::options::save(e, &info, &body(bad.clone())).await {
            Err(EngineError::Invalid { param: Some(p), .. }) => assert_eq!(p, param, "{bad}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    assert_eq!(
        Value::Object(engine::options::view(e, &info).saved),
        json!({"ctx_size": 2048}),
        "refused bodies saved nothing"
    );

    let v = engine::options::reset(e, &info).await.unwrap();
    assert_eq!((Value::Object(v.saved), v.effective == v.defaults), (json!({}), true));
    assert_eq!(s.launcher.starts(A), 0, "no option call loads the model");
}

/// `/load`: absent keeps the saved value, `null` ignores it for this load only, a value
/// overrides; the same options twice start once; `-1` is resolved before the backend starts;
/// `save_options` replaces the saved entry but keeps what a `null` named.
#[tokio::test]
async fn load_options_are_three_state_and_a_same_options_load_is_a_no_op() {
    let s = setup(|_| {});
    let e = &s.engine;
    let info = e.catalogue().get(A).unwrap();
    engine::options::save(e, &info, &body(json!({"ctx_size": 2048, "llamacpp_args": "--no-mmap"}))).await.unwrap();
    let load = |v: Value| {
        let mut v = v;
        v["model_name"] = json!(A);
        let req: LoadRequest = serde_json::from_value(v).unwrap();
        let e = e.clone();
        async move { engine::loads::load(&e, &req).await.map(|_| ()) }
    };
    let last = || s.launcher.launched_with(A).last().cloned().unwrap();

    load(json!({})).await.unwrap();
    assert_eq!((last().ctx_size, last().llamacpp_args.as_deref()), (Some(CtxSize::Tokens(2048)), Some("--no-mmap")));
    load(json!({})).await.unwrap();
    assert_eq!(s.launcher.starts(A), 1, "the same options again: no reload");

    load(json!({"ctx_size": null})).await.unwrap();
    assert_eq!((last().ctx_size, s.launcher.starts(A)), (None, 2), "null: the saved 2048 is ignored, reloaded");
    assert_eq!(Value::Object(engine::options::view(e, &info).saved)["ctx_size"], 2048, "and stays saved");

    load(json!({"ctx_size": -1})).await.unwrap();
    assert_eq!(
        last().ctx_size,
        Some(CtxSize::Tokens(4096)),
        "-1 reaches the backend resolved (no header: the default)"
    );

    load(json!({"ctx_size": 1024, "llamacpp_args": null, "save_options": true})).await.unwrap();
    assert_eq!(
        Value::Object(engine::options::view(e, &info).saved),
        json!({"ctx_size": 1024, "llamacpp_args": "--no-mmap"}),
        "save_options replaced the entry, keeping the key the request set to null"
    );
    assert_eq!(last().llamacpp_args, None, "but this load ran without it");
}

/// A client that sends its next request as soon as it has its answer can find the view still
/// counting the request that ended: the lease's release is queued for the owner. Spillover
/// decides on the view once the owner has taken it, so that client is never spilled by its
/// own finished request (on this runtime's one thread the owner cannot run before it is
/// asked, so the stale view is certain here).
#[tokio::test]
async fn a_request_that_just_ended_does_not_make_its_model_spill_the_next_one() {
    let s = setup(|c| c.max_concurrent = Some(1));
    let url = provider().await;
    s.engine.remotes().install("up", Some(&url), None).await.unwrap();
    s.engine.lifecycle().set_spillover(A, Some(vec!["up.up-model".into()]));
    let info = s.engine.catalogue().get(A).unwrap();
    let lease = s.engine.lease(LeaseRequest::new(A, Endpoint::ChatCompletions)).await.unwrap();
    // Held: the model is saturated and the place (no metrics: it has capacity) takes the next.
    let (spilled, _) = engine::spill::place(&s.engine, &info).await.unwrap();
    assert!(spilled.is_some_and(|l| l.name() == "up.up-model"), "a saturated model spills");
    drop(lease);
    assert_eq!(s.engine.lifecycle().view()[A].in_flight, 1, "the release is still queued");
    let (spilled, stayed) = engine::spill::place(&s.engine, &info).await.unwrap();
    assert!(spilled.is_none() && stayed.is_none(), "the ended request spilled the next one");
    assert_eq!(s.engine.lifecycle().view()[A].in_flight, 0);
}

#[tokio::test]
async fn a_backend_measured_past_its_estimates_is_counted_for_what_it_holds_in_memory_and_vram() {
    let s = setup(|_| {});
    s.load(A, None).await;
    let estimate = s.engine.lifecycle().view()[A].memory;
    let (rss, vram) = (estimate + (512 << 20), 3u64 << 30);
    s.launcher.measure(A, Some(rss), Some(vram));
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let v = s.engine.lifecycle().view()[A].clone();
        if (v.memory, v.vram) == (rss, vram) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never counted: {:?}", (v.memory, v.vram));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let snap = s.engine.lifecycle().metrics_snapshot();
    assert_eq!(snap.in_use, [rss, vram], "the budgets count what it holds");
    let m = snap.models.iter().find(|m| m.name == A).unwrap();
    assert_eq!((m.memory, m.measured_vram), (Some((estimate, Some(rss))), Some(vram)));
}

/// Lemonade v11's `effective` is the `/load` body that reproduces the load: saved options,
/// erased, then `effective` replayed verbatim keeps the running backend (explicit ctx_size and
/// `-1`, which the running process holds resolved).
#[tokio::test]
async fn replaying_effective_as_a_load_keeps_the_backend_it_describes() {
    let s = setup(|_| {});
    let e = &s.engine;
    let info = e.catalogue().get(A).unwrap();
    for (round, ctx) in [3072, -1].into_iter().enumerate() {
        engine::options::reset(e, &info).await.unwrap();
        engine::options::save(e, &info, &body(json!({"ctx_size": ctx, "llamacpp_args": "--no-mmap"}))).await.unwrap();
        let effective = engine::options::view(e, &info).effective;
        assert_eq!(effective["ctx_size"], ctx);
        let req: LoadRequest = serde_json::from_value(json!({"model_name": A})).unwrap();
        engine::loads::load(e, &req).await.unwrap();
        assert_eq!(s.launcher.starts(A), round + 1);
        engine::options::reset(e, &info).await.unwrap();
        let req: LoadRequest = serde_json::from_value(Value::Object(effective.clone())).unwrap();
        engine::loads::load(e, &req).await.unwrap();
        assert_eq!(
            s.launcher.starts(A),
            round + 1,
            "replaying {effective:?} reloaded: {:?}",
            s.launcher.launched_with(A)
        );
    }
}
