//! Usage accounting for pooled GPUs, from the event stream alone: who held what, for how long.
//!
//! Every placement (`task-scheduled`) and every end of a run (`task-ended`) is an event with its
//! task, queue, namespace, GPUs (whole or shared, as allocated), CPU and memory, GPU model and node
//! pool. A [`Ledger`] reads them — from a JSONL file, a NATS JetStream durable consumer through a
//! local journal ([`journal`]), or the scheduler's own sink ([`Meter`]) — and a [`Query`] turns it
//! into a [`Report`]: GPU-, CPU- and memory-hours per group and window, GPU-hours lost to evictions
//! without a checkpoint, queueing-delay percentiles, and each queue's use beside its fair share.
//!
//! Exact and restart-safe by construction: every event is read once (by id: each publisher numbers
//! its events), nothing is summed until the report, so order does not matter, and the numbering
//! shows the events that never arrived — a report over a window with such a hole says so and is
//! not `complete`, rather than billing less in silence.

pub mod exporter;
mod facts;
pub mod journal;
mod ledger;
mod meter;
mod report;
mod sequence;

pub use ledger::{Dropped, Intake, Ledger};
pub use meter::{DELAY_BUCKETS, DelayHistogram, Meter, MeterKey, MeterTotals};
pub use report::{Delay, Missing, Query, Report, Row, Share};
pub use sequence::Gap;

/// What report rows are grouped by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dimension {
    /// The task's queue.
    Queue,
    /// Its Kubernetes namespace.
    Namespace,
    /// The model of its GPUs (`-`: none).
    Model,
    /// The accelerator kind of its GPUs (`nvidia`, `amd`, …; `-`: none).
    Kind,
    /// The node pool (`-`: none).
    Pool,
}

impl Dimension {
    /// Every dimension.
    pub const ALL: [Dimension; 5] =
        [Dimension::Queue, Dimension::Namespace, Dimension::Model, Dimension::Kind, Dimension::Pool];

    /// Its name in `--by` and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Dimension::Queue => "queue",
            Dimension::Namespace => "namespace",
            Dimension::Model => "model",
            Dimension::Kind => "kind",
            Dimension::Pool => "pool",
        }
    }
}

impl std::str::FromStr for Dimension {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Dimension::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown dimension `{s}` (expected one of: queue, namespace, model, kind, pool)"))
    }
}

/// Errors of reading events for usage.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The event stream could not be read.
    #[error(transparent)]
    Events(#[from] wasmsched_events::Error),
}
