//! The agent's `/metrics`: what the device plugin tells the kubelet and how the kubelet's calls
//! went on this node — the node side of the chart's GPU dashboard. Per node (the scrape's
//! `instance`), never per pod or GPU: a fleet of thousands of nodes stays a small series count.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::device_plugin::NodeGpus;

/// Exports `gpus`' health and the kubelet's calls at scrape time.
struct DevicePluginCollector(Arc<NodeGpus>);

impl std::fmt::Debug for DevicePluginCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DevicePluginCollector")
    }
}

type NoLabels = Vec<(String, String)>;

impl Collector for DevicePluginCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let gpus = self.0.gpus();
        let mut health = encoder.encode_descriptor(
            "wasmsched_agent_gpus",
            "GPUs this node's device plugin offers the kubelet, by health (unhealthy ones are offered to nobody).",
            None,
            MetricType::Gauge,
        )?;
        for (state, healthy) in [("healthy", true), ("unhealthy", false)] {
            let n = gpus.iter().filter(|g| g.healthy == healthy).count() as i64;
            health.encode_family(&[("health", state)])?.encode_gauge(&n)?;
        }
        let mut calls = encoder.encode_descriptor(
            "wasmsched_agent_device_plugin_calls",
            "The kubelet's GetPreferredAllocation and Allocate calls answered, by resource and result (ok or refused: the pod fails admission with the reason).",
            None,
            MetricType::Counter,
        )?;
        for ((resource, call, result), n) in self.0.calls() {
            calls
                .encode_family(&[("resource", resource), ("call", call), ("result", result)])?
                .encode_counter::<NoLabels, u64, f64>(&n, None)?;
        }
        Ok(())
    }
}

/// The text exposition of `gpus`' metrics.
pub fn render(gpus: &Arc<NodeGpus>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(DevicePluginCollector(gpus.clone())));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).expect("writing to a String cannot fail");
    out
}

/// Serves `/metrics` (and `/healthz`) on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, gpus: Arc<NodeGpus>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "metrics listener accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let gpus = gpus.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let (status, body, kind) = match req.uri().path() {
                    "/metrics" => {
                        (StatusCode::OK, render(&gpus), "application/openmetrics-text; version=1.0.0; charset=utf-8")
                    }
                    "/healthz" => (StatusCode::OK, "ok".to_string(), "text/plain"),
                    _ => (StatusCode::NOT_FOUND, "not found".to_string(), "text/plain"),
                };
                let mut response = Response::new(Full::new(Bytes::from(body)));
                *response.status_mut() = status;
                response
                    .headers_mut()
                    .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(kind));
                async move { Ok::<_, Infallible>(response) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            if let Err(e) = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await {
                tracing::debug!(error = %e, "metrics connection ended");
            }
        });
    }
}
