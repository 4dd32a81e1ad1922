//! The stage traits plugin authors implement. Every stage is optional; a plugin implements
//! [`Plugin`] plus the stages it needs.

use std::borrow::Cow;

use crate::model::*;

/// The highest score a plugin may give a node; the lowest is 0 (kube-scheduler's range).
pub const MAX_SCORE: u32 = 100;

/// A plugin's identity and configuration.
pub trait Plugin: Sized + 'static {
    /// Name used in logs, metrics and errors.
    const NAME: &'static str;

    /// Build the plugin from its configuration text (JSON by convention; empty when none was
    /// given). An error rejects the configuration: the plugin is not loaded.
    fn new(config: &str) -> Result<Self, String>;
}

/// A filter's answer for one node. Verdicts are data: a node that does not fit is not an error.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
///
/// Reasons are `Cow<'static, str>`: the usual fixed reason (`"insufficient cpu"`) costs no heap
/// allocation per rejected node, which matters when a filter rejects thousands of nodes per task
/// (inside a component, each allocation is a call into the guest's allocator).
pub enum Verdict {
    /// The node can run the task.
    Fit,
    /// It cannot; preemption on this node may help.
    Unfit(Cow<'static, str>),
    /// It cannot, and preemption cannot help (kube-scheduler's UnschedulableAndUnresolvable).
    Unresolvable(Cow<'static, str>),
}

impl Verdict {
    /// A rejection that preemption may resolve.
    pub fn unfit(reason: impl Into<Cow<'static, str>>) -> Self {
        Verdict::Unfit(reason.into())
    }

    /// A rejection that preemption cannot resolve.
    pub fn unresolvable(reason: impl Into<Cow<'static, str>>) -> Self {
        Verdict::Unresolvable(reason.into())
    }

    /// Whether the node fits.
    pub fn fits(&self) -> bool {
        matches!(self, Verdict::Fit)
    }

    /// The rejection, if any.
    pub fn rejection(&self) -> Option<Rejection> {
        match self {
            Verdict::Fit => None,
            Verdict::Unfit(r) => Some(Rejection { reason: r.to_string(), unresolvable: false }),
            Verdict::Unresolvable(r) => Some(Rejection { reason: r.to_string(), unresolvable: true }),
        }
    }
}

/// Filter stage: which nodes can run a task.
pub trait Filter {
    /// The verdict for one node.
    fn filter(&mut self, task: &Task, node: &Node) -> Verdict;
}

/// Score stage: rank feasible nodes.
pub trait Score {
    /// The raw score of one node.
    fn score(&mut self, task: &Task, node: &Node) -> u32;

    /// Map the raw scores of one batch into `0..=`[`MAX_SCORE`]. The default keeps them as they
    /// are, so `score` must already be in range; the host rejects out-of-range results as a fault.
    fn normalize(&mut self, _task: &Task, _scores: &mut [u32]) {}
}

/// Device selection: which GPUs the task gets on its chosen node.
pub trait SelectDevices {
    /// The GPUs (and share of each) for `task` on `node`, or why none fit.
    fn select_devices(&mut self, task: &Task, node: &Node) -> Result<Vec<DeviceShare>, Rejection>;
}

/// A typed DRA attribute value, as a ResourceSlice publishes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttributeValue {
    /// `bool`.
    Bool(bool),
    /// `int`.
    Int(i64),
    /// `string`.
    String(String),
    /// `version` (semantic version, as text).
    Version(String),
}

/// A DRA device a claim request may get: one a ResourceSlice publishes on the node, accepted by
/// the class's and the request's selectors, tolerated, and free.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimDevice {
    /// `driver/pool/device`.
    pub id: String,
    /// Attributes by qualified name (`gpu.nvidia.com/index`, `resource.kubernetes.io/pcieRoot`).
    pub attributes: Vec<(String, AttributeValue)>,
    /// Capacities by qualified name, as quantities (`80Gi`).
    pub capacity: Vec<(String, String)>,
}

impl ClaimDevice {
    /// The attribute `name` (qualified), if the device has it.
    pub fn attribute(&self, name: &str) -> Option<&AttributeValue> {
        self.attributes.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }
}

/// One request of a DRA claim, on the node its pod was placed on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The request's name (`request/subrequest` for a `firstAvailable` alternative).
    pub name: String,
    /// How many devices it takes.
    pub count: u32,
    /// The devices it may get, in the order the host would try them.
    pub candidates: Vec<ClaimDevice>,
}

/// Device selection for DRA claims: which of a request's candidate devices the task should get.
/// The answer is an order of preference (indexes into `request.candidates`, most wanted first);
/// the host tries those first, keeps the claim's constraints, and falls back to its own order
/// (the topology ranking) for the rest. An empty answer leaves the host's order.
pub trait RankClaimDevices {
    /// Candidate indexes, most wanted first.
    fn rank_claim_devices(&mut self, task: &Task, node: &Node, request: &ClaimRequest) -> Vec<u32>;
}

/// Preemption: which running tasks to evict so that `preemptor` fits.
pub trait Preempt {
    /// Choose one candidate and its victims; `None` when preemption cannot help. `nodes[i]` is the
    /// node of `candidates[i]`.
    fn select_victims(
        &mut self,
        preemptor: &Task,
        candidates: &[PreemptCandidate],
        nodes: &[&Node],
    ) -> Option<Preemption>;
}

/// Fair share: deserved shares of a queue tree and serving order.
pub trait FairShare {
    /// Compute shares for `queues` on a cluster of capacity `cluster`.
    fn compute(&mut self, queues: &[QueueState], cluster: &Resources) -> Result<ShareDecision, String>;
}

/// The stages a plugin type offers, as trait objects. Implemented by the SDK's `export_plugin!`
/// macro (and by hand for native use); every accessor defaults to "not implemented".
pub trait Stages {
    /// The filter stage.
    fn as_filter(&mut self) -> Option<&mut dyn Filter> {
        None
    }
    /// The score stage.
    fn as_score(&mut self) -> Option<&mut dyn Score> {
        None
    }
    /// The device-selection stage.
    fn as_select_devices(&mut self) -> Option<&mut dyn SelectDevices> {
        None
    }
    /// Ranking DRA claim devices (part of the device-selection stage).
    fn as_rank_claim_devices(&mut self) -> Option<&mut dyn RankClaimDevices> {
        None
    }
    /// The preempt stage.
    fn as_preempt(&mut self) -> Option<&mut dyn Preempt> {
        None
    }
    /// The fair-share stage.
    fn as_fair_share(&mut self) -> Option<&mut dyn FairShare> {
        None
    }

    /// [`crate::batch::filter_batch_until`] over `nodes` with this type's own `filter` called
    /// statically (inlinable), or `None` without a filter stage. `declare_stages!` implements it.
    fn filter_nodes(&mut self, task: &Task, nodes: &[&Node], enough: usize) -> Option<crate::batch::FilterBatch> {
        let _ = (task, nodes, enough);
        None
    }

    /// [`crate::batch::score_batch`] the same way, or `None` without a score stage.
    fn score_nodes(&mut self, task: &Task, nodes: &[&Node]) -> Option<Vec<u32>> {
        let _ = (task, nodes);
        None
    }

    /// The stages this type implements.
    fn stages(&mut self) -> Vec<Stage> {
        let mut out = Vec::new();
        if self.as_filter().is_some() {
            out.push(Stage::Filter);
        }
        if self.as_score().is_some() {
            out.push(Stage::Score);
        }
        if self.as_select_devices().is_some() {
            out.push(Stage::SelectDevices);
        }
        if self.as_preempt().is_some() {
            out.push(Stage::Preempt);
        }
        if self.as_fair_share().is_some() {
            out.push(Stage::FairShare);
        }
        out
    }
}

/// Declare which stages a plugin type implements, generating its [`Stages`] impl:
/// `declare_stages!(MyPolicy: filter, score);`. The SDK's `export_plugin!` calls this; use it
/// directly only for plugins that are never compiled to Wasm.
#[macro_export]
macro_rules! declare_stages {
    ($ty:ty : $($stage:ident),+ $(,)?) => {
        impl $crate::Stages for $ty {
            $( $crate::__stage_accessor!($stage); )+
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __stage_accessor {
    (filter) => {
        fn as_filter(&mut self) -> Option<&mut dyn $crate::Filter> {
            Some(self)
        }
        fn filter_nodes(
            &mut self,
            task: &$crate::Task,
            nodes: &[&$crate::Node],
            enough: usize,
        ) -> Option<$crate::batch::FilterBatch> {
            Some($crate::batch::filter_batch_until(self, task, nodes.iter().copied(), enough))
        }
    };
    (score) => {
        fn as_score(&mut self) -> Option<&mut dyn $crate::Score> {
            Some(self)
        }
        fn score_nodes(&mut self, task: &$crate::Task, nodes: &[&$crate::Node]) -> Option<Vec<u32>> {
            Some($crate::batch::score_batch(self, task, nodes.iter().copied()))
        }
    };
    (select_devices) => {
        fn as_select_devices(&mut self) -> Option<&mut dyn $crate::SelectDevices> {
            Some(self)
        }
    };
    (rank_claim_devices) => {
        fn as_rank_claim_devices(&mut self) -> Option<&mut dyn $crate::RankClaimDevices> {
            Some(self)
        }
    };
    (preempt) => {
        fn as_preempt(&mut self) -> Option<&mut dyn $crate::Preempt> {
            Some(self)
        }
    };
    (fair_share) => {
        fn as_fair_share(&mut self) -> Option<&mut dyn $crate::FairShare> {
            Some(self)
        }
    };
}
