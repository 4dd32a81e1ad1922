//! The JSON API (`/api/v1/...`) and the event stream, over the latest published view. Every error
//! is a JSON object `{"error": "..."}` with a 4xx status: an unknown route, a malformed query, a
//! node that does not exist.

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use futures_util::Stream;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;

use crate::Publisher;
use crate::view::NodeView;

/// The most nodes one page of `/api/v1/nodes` holds.
pub const MAX_PAGE: usize = 1000;

pub(crate) fn router(publisher: Publisher) -> Router {
    Router::new()
        .route("/", get(crate::assets::index))
        .route("/app.js", get(crate::assets::script))
        .route("/style.css", get(crate::assets::style))
        .route("/vendor/uplot-1.6.32/uPlot.iife.min.js", get(crate::assets::chart_script))
        .route("/vendor/uplot-1.6.32/uPlot.min.css", get(crate::assets::chart_style))
        .route("/api/v1", get(versions))
        .route("/api/v1/cluster", get(cluster))
        .route("/api/v1/nodes", get(nodes))
        .route("/api/v1/nodes/{name}", get(node))
        .route("/api/v1/queues", get(queues))
        .route("/api/v1/queues/{name}", get(queue))
        .route("/api/v1/workloads", get(workloads))
        .route("/api/v1/policies", get(policies))
        .route("/api/v1/experiments", get(experiments))
        .route("/api/v1/comparison", get(comparison))
        .route("/api/v1/events", get(events))
        .fallback(not_found)
        .with_state(publisher)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

async fn not_found(uri: axum::http::Uri) -> Response {
    error(StatusCode::NOT_FOUND, format!("no such page or API route: {}", uri.path()))
}

async fn versions() -> Json<serde_json::Value> {
    Json(json!({
        "version": "v1",
        "endpoints": ["/api/v1/cluster", "/api/v1/nodes", "/api/v1/nodes/{name}", "/api/v1/queues", "/api/v1/queues/{name}",
                      "/api/v1/workloads", "/api/v1/policies", "/api/v1/experiments", "/api/v1/comparison",
                      "/api/v1/events"],
    }))
}

async fn cluster(State(p): State<Publisher>) -> Response {
    let v = p.current();
    Json(json!({
        "source": v.source, "atSeconds": v.at_seconds, "cluster": v.cluster, "series": v.series, "series_x": v.series_x,
        "domains": v.domains,
    }))
    .into_response()
}

/// `/api/v1/nodes` filters and paging.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeQuery {
    /// Only nodes with GPUs of this model.
    model: Option<String>,
    /// Only nodes with this label, `key=value` (or `key` for any value).
    label: Option<String>,
    /// Only nodes running work of this queue.
    queue: Option<String>,
    /// Skip this many matching nodes.
    #[serde(default)]
    offset: usize,
    /// At most this many (1–1000; 200 when absent).
    limit: Option<usize>,
}

async fn nodes(State(p): State<Publisher>, query: Result<Query<NodeQuery>, QueryRejection>) -> Response {
    let Query(q) = match query {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad query: {}", e.body_text())),
    };
    let limit = q.limit.unwrap_or(200);
    if limit == 0 || limit > MAX_PAGE {
        return error(StatusCode::BAD_REQUEST, format!("limit must be 1 to {MAX_PAGE}, not {limit}"));
    }
    let label = q.label.as_deref().map(|l| l.split_once('=').unwrap_or((l, "")));
    let v = p.current();
    let keep = |n: &&NodeView| {
        q.model.as_ref().is_none_or(|m| &n.model == m)
            && label.is_none_or(|(k, val)| n.labels.iter().any(|(nk, nv)| nk == k && (val.is_empty() || nv == val)))
            && q.queue.as_ref().is_none_or(|queue| n.tasks.iter().any(|t| &t.queue == queue))
    };
    let matching: Vec<&NodeView> = v.nodes.iter().filter(keep).collect();
    let page: Vec<&NodeView> = matching.iter().skip(q.offset).take(limit).copied().collect();
    Json(json!({ "total": matching.len(), "offset": q.offset, "nodes": page })).into_response()
}

async fn node(State(p): State<Publisher>, Path(name): Path<String>) -> Response {
    let v = p.current();
    match v.nodes.iter().find(|n| n.name == name) {
        Some(n) => {
            let mut doc = serde_json::to_value(n).unwrap_or_default();
            doc["topology"] = v.topologies.get(&name).map_or(serde_json::Value::Null, |t| t.as_ref().into());
            Json(doc).into_response()
        }
        None => error(StatusCode::NOT_FOUND, format!("no node {name:?}")),
    }
}

async fn queue(State(p): State<Publisher>, Path(name): Path<String>) -> Response {
    let v = p.current();
    match v.queues.iter().find(|q| q.name == name) {
        Some(q) => {
            let history: Vec<_> = v.queue_history.get(&name).map(|h| h.iter().collect()).unwrap_or_default();
            Json(json!({ "queue": q, "history": history })).into_response()
        }
        None => error(StatusCode::NOT_FOUND, format!("no queue {name:?}")),
    }
}

async fn queues(State(p): State<Publisher>) -> Response {
    Json(json!({ "queues": p.current().queues })).into_response()
}

/// `/api/v1/workloads` filters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkloadQuery {
    queue: Option<String>,
    phase: Option<String>,
}

async fn workloads(State(p): State<Publisher>, query: Result<Query<WorkloadQuery>, QueryRejection>) -> Response {
    let Query(q) = match query {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad query: {}", e.body_text())),
    };
    let v = p.current();
    let list: Vec<_> = v
        .workloads
        .iter()
        .filter(|w| q.queue.as_ref().is_none_or(|x| &w.queue == x) && q.phase.as_ref().is_none_or(|x| &w.phase == x))
        .collect();
    Json(json!({ "workloads": list })).into_response()
}

async fn policies(State(p): State<Publisher>) -> Response {
    Json(json!({ "policies": p.current().policies })).into_response()
}

/// The experiment grid being run or run (`null` when the source runs none).
async fn experiments(State(p): State<Publisher>) -> Response {
    Json(json!({ "experiments": p.current().experiments.as_deref() })).into_response()
}

/// The two replays being compared, or compared (`null` when the source compares none).
async fn comparison(State(p): State<Publisher>) -> Response {
    Json(json!({ "comparison": p.current().comparison.as_deref() })).into_response()
}

/// Scheduling events as they happen. A browser that falls behind by more than
/// [`crate::EVENTS_BUFFERED`] batches gets a `lagged` event with the count of batches it missed;
/// events the tap left out (over [`crate::EVENTS_PER_SECOND`]) are counted in `skipped` events.
async fn events(State(p): State<Publisher>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    use futures_util::StreamExt;
    let rx = p.events.subscribe();
    let batches = futures_util::stream::unfold(rx, |mut rx| async move {
        let events: Vec<Event> = match rx.recv().await {
            Ok(batch) => {
                let mut out: Vec<Event> =
                    batch.events.iter().map(|json| Event::default().event("decision").data(&**json)).collect();
                if batch.skipped > 0 {
                    out.push(Event::default().event("skipped").data(batch.skipped.to_string()));
                }
                out
            }
            Err(RecvError::Lagged(n)) => vec![Event::default().event("lagged").data(n.to_string())],
            Err(RecvError::Closed) => return None,
        };
        Some((futures_util::stream::iter(events.into_iter().map(Ok)), rx))
    });
    Sse::new(batches.flatten()).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// Headers every page carries: nothing from elsewhere may load, nothing may frame it.
pub(crate) fn page(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, "default-src 'self'; connect-src 'self'; img-src 'self' data:"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}
