//! Which gang a pod belongs to. Users and their operators say it many ways, and each is honoured
//! so a workload submitted for another scheduler runs unchanged with `schedulerName: wasmsched`:
//!
//! 1. our label `scheduling.wasmsched.io/pod-group` and our `PodGroup`;
//! 2. the upstream Workload API: `spec.schedulingGroup.podGroupName` naming a `scheduling.k8s.io`
//!    `PodGroup` (a gang with `minCount`, or `basic`: independent pods) — [`podgroups`];
//! 3. the coscheduling plugin's label `scheduling.x-k8s.io/pod-group` and its `PodGroup`;
//! 4. Volcano's annotation `scheduling.k8s.io/group-name` and its `PodGroup`;
//! 5. none of these: the pod's topmost owner the owner table knows (a Job, JobSet, training job,
//!    RayCluster, LeaderWorkerSet, …) — [`owners`].
//!
//! The first that a pod carries decides. A group named by 1–4 takes its settings from our
//! `PodGroup` of that name when there is one (an operator's override), else from the object of
//! the API the pod named.

pub mod owners;
pub mod podgroups;

/// Where a pod's group name came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupSource {
    /// Our label.
    Wasmsched,
    /// `spec.schedulingGroup.podGroupName`.
    Upstream,
    /// The coscheduling plugin's label.
    Coscheduling,
    /// Volcano's annotation.
    Volcano,
}

impl GroupSource {
    /// The API group of the `PodGroup` objects this source names.
    pub fn api_group(self) -> &'static str {
        match self {
            GroupSource::Wasmsched => "scheduling.wasmsched.io",
            GroupSource::Upstream => "scheduling.k8s.io",
            GroupSource::Coscheduling => "scheduling.x-k8s.io",
            GroupSource::Volcano => "scheduling.volcano.sh",
        }
    }
}
