//! Creating a run's pods: all at once (a batch as a training job's controller makes it) or at a
//! fixed rate (steady arrivals), recording when each creation was sent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::{Arrival, Config, Error, OwnRequests};

/// Creates pods `make(0..count)`, all at once (a batch or a burst) or at a rate; returns when
/// each creation was sent, by index. Any refused creation ends the run: a pod missing would make
/// every figure wrong.
pub async fn all(
    client: &Client,
    config: &Config,
    count: usize,
    arrival: Arrival,
    make: impl Fn(usize) -> Value,
    own: &OwnRequests,
) -> Result<Vec<Instant>, Error> {
    let api = Api::<Pod>::namespaced(client.clone(), &config.namespace);
    let pods: Vec<Pod> = (0..count)
        .map(|i| serde_json::from_value(make(i)))
        .collect::<Result<_, _>>()
        .map_err(|e| Error::Settings(format!("a pod of the workload does not parse: {e}")))?;
    let sent = match arrival {
        Arrival::Batch | Arrival::Burst => burst(&api, pods, config.create_in_flight, own).await,
        Arrival::Rate(rate) => steady(&api, pods, rate, config.create_in_flight, own).await,
    };
    sent.map_err(Error::api("creating pods"))
}

async fn create(api: &Api<Pod>, pod: &Pod, own: &OwnRequests) -> Result<Instant, kube::Error> {
    let sent = Instant::now();
    own.count("POST pods");
    api.create(&PostParams::default(), pod).await?;
    Ok(sent)
}

async fn burst(
    api: &Api<Pod>,
    pods: Vec<Pod>,
    in_flight: usize,
    own: &OwnRequests,
) -> Result<Vec<Instant>, kube::Error> {
    stream::iter(pods.iter()).map(|pod| create(api, pod, own)).buffered(in_flight).try_collect().await
}

/// One creation every `1 / rate` seconds on the clock, each on its own task so a slow answer
/// does not delay the next arrival; at most `in_flight` unanswered (then arrivals wait, and the
/// report's rate shows it).
async fn steady(
    api: &Api<Pod>,
    pods: Vec<Pod>,
    rate: f64,
    in_flight: usize,
    own: &OwnRequests,
) -> Result<Vec<Instant>, kube::Error> {
    let slots = Arc::new(Semaphore::new(in_flight));
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let mut tasks = Vec::with_capacity(pods.len());
    for pod in pods {
        ticks.tick().await;
        let permit = slots.clone().acquire_owned().await.expect("never closed");
        let (api, own) = (api.clone(), own.clone());
        tasks.push(tokio::spawn(async move {
            let sent = create(&api, &pod, &own).await;
            drop(permit);
            sent
        }));
    }
    let mut sent = Vec::with_capacity(tasks.len());
    for task in tasks {
        sent.push(task.await.expect("a creation task does not panic")?);
    }
    Ok(sent)
}
