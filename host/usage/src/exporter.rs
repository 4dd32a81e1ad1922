//! The usage meter on `/metrics`: the figures `wasmsched usage` computes from the event stream,
//! exported at scrape time by the process that makes the decisions (its [`Meter`] follows them as
//! a [`wasmsched_events::Observer`]).

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use wasmsched_events::Timestamp;

use crate::Meter;

type NoLabels = Vec<(String, String)>;

/// Exports the usage meter at scrape time: what each queue, namespace and GPU model held (runs
/// going on counted up to the scrape), lost to evictions, and how long pods queued — the figures
/// `wasmsched usage` computes from the event stream, under Prometheus' names for totals.
pub struct UsageCollector(Arc<Meter>);

impl UsageCollector {
    /// Exports `meter`.
    pub fn new(meter: Arc<Meter>) -> UsageCollector {
        UsageCollector(meter)
    }
}

/// A new meter and the collector that exports it: the scheduler takes the one as an observer of
/// its decisions, its metrics registry the other.
pub fn metered() -> (Arc<Meter>, Box<UsageCollector>) {
    let meter = Arc::new(Meter::new());
    (meter.clone(), Box::new(UsageCollector(meter)))
}

impl std::fmt::Debug for UsageCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UsageCollector")
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UsageLabels {
    queue: String,
    namespace: String,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DelayLabels {
    queue: String,
}

impl Collector for UsageCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::MetricType;
        let totals = self.0.totals(Timestamp::now());
        type Pick = fn(&crate::MeterTotals) -> f64;
        let counters: [(&str, &str, Pick); 5] = [
            (
                "wasmsched_allocated_gpu_seconds",
                "GPU-seconds held by pods placed by this scheduler (whole GPUs and shares, as allocated), by queue, namespace and GPU model.",
                |t| t.gpu_seconds,
            ),
            (
                "wasmsched_lost_gpu_seconds",
                "GPU-seconds of work thrown away: whole runs preempted or evicted without keeping their work (no checkpoint), counted when they end.",
                |t| t.lost_gpu_seconds,
            ),
            ("wasmsched_allocated_cpu_core_seconds", "CPU core-seconds requested by running pods.", |t| t.cpu_seconds),
            ("wasmsched_allocated_memory_byte_seconds", "Memory byte-seconds requested by running pods.", |t| {
                t.memory_byte_seconds
            }),
            ("wasmsched_runs_ended", "Runs of pods that ended (completed, failed, deleted, evicted).", |t| {
                t.runs_ended as f64
            }),
        ];
        for (name, help, pick) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (key, t) in &totals {
                let labels = UsageLabels {
                    queue: key.queue.clone(),
                    namespace: key.namespace.clone(),
                    model: key.model.clone(),
                };
                family.encode_family(&labels)?.encode_counter::<NoLabels, f64, f64>(&pick(t), None)?;
            }
        }
        let mut delays = encoder.encode_descriptor(
            "wasmsched_queueing_delay_seconds",
            "Time from a pod's creation to its placement, by queue.",
            None,
            MetricType::Histogram,
        )?;
        for (queue, h) in self.0.delays() {
            let mut buckets: Vec<(f64, u64)> =
                crate::DELAY_BUCKETS.iter().copied().zip(h.counts.iter().copied()).collect();
            buckets.push((f64::INFINITY, h.counts[crate::DELAY_BUCKETS.len()]));
            let count = h.counts.iter().sum();
            delays.encode_family(&DelayLabels { queue })?.encode_histogram::<NoLabels>(h.sum, count, &buckets, None)?;
        }
        Ok(())
    }
}
