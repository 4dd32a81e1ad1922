//! `PodGroup` objects of other APIs, read as gangs: the upstream Workload API's
//! (`scheduling.k8s.io`, which the Job controller creates for an Indexed Job since Kubernetes
//! 1.36), the coscheduling plugin's (`scheduling.x-k8s.io`) and Volcano's
//! (`scheduling.volcano.sh`). Watched through kube's dynamic API: the upstream API moves between
//! versions (`v1alpha2` in 1.36, `v1beta1` in 1.37) and the other two are CRDs that many clusters
//! do not have, so only the fields read here are relied on.

use ahash::AHashMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{ApiResource, DynamicObject};
use serde_json::Value;

use super::GroupSource;
use super::owners::WatchState;
use crate::workloads::GroupInfo;

/// The upstream API's versions this scheduler reads, newest first.
pub const UPSTREAM_VERSIONS: [&str; 2] = ["v1beta1", "v1alpha2"];

/// One `PodGroup` API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodGroupApi {
    /// `scheduling.k8s.io/<version>`.
    Upstream {
        /// The version the cluster serves.
        version: String,
    },
    /// `scheduling.x-k8s.io/v1alpha1`.
    Coscheduling,
    /// `scheduling.volcano.sh/v1beta1`.
    Volcano,
}

impl PodGroupApi {
    /// The pods' source this API's groups serve.
    pub fn source(&self) -> GroupSource {
        match self {
            PodGroupApi::Upstream { .. } => GroupSource::Upstream,
            PodGroupApi::Coscheduling => GroupSource::Coscheduling,
            PodGroupApi::Volcano => GroupSource::Volcano,
        }
    }

    /// What kube's dynamic API needs to watch it.
    pub fn api_resource(&self) -> ApiResource {
        let (group, version) = match self {
            PodGroupApi::Upstream { version } => ("scheduling.k8s.io", version.as_str()),
            PodGroupApi::Coscheduling => ("scheduling.x-k8s.io", "v1alpha1"),
            PodGroupApi::Volcano => ("scheduling.volcano.sh", "v1beta1"),
        };
        ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: format!("{group}/{version}"),
            kind: "PodGroup".into(),
            plural: "podgroups".into(),
        }
    }

    /// The status condition kube-scheduler sets once a gang is placed (the upstream API only):
    /// `PodGroupScheduled` in `v1alpha2`, `PodGroupInitiallyScheduled` since `v1beta1`.
    pub fn scheduled_condition(&self) -> Option<&'static str> {
        match self {
            PodGroupApi::Upstream { version } if version == "v1alpha2" => Some("PodGroupScheduled"),
            PodGroupApi::Upstream { .. } => Some("PodGroupInitiallyScheduled"),
            _ => None,
        }
    }

    /// `object` as a group, or why it cannot be read.
    pub fn read(&self, object: &DynamicObject) -> Result<ForeignGroup, String> {
        let spec = &object.data["spec"];
        let int = |v: &Value| v.as_i64().map(|n| n.clamp(1, 100_000) as usize);
        let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(String::from);
        let conditions: Vec<Condition> = object.data["status"]["conditions"]
            .as_array()
            .map(|c| c.iter().filter_map(|c| serde_json::from_value(c.clone()).ok()).collect())
            .unwrap_or_default();
        let info = |min_member: usize| GroupInfo {
            min_member,
            topology_key: None,
            queue: None,
            priority: None,
            priority_class: None,
            timeout_seconds: None,
        };
        let policy = match self {
            PodGroupApi::Upstream { .. } => {
                let policy = &spec["schedulingPolicy"];
                if policy.get("gang").is_some_and(|g| !g.is_null()) {
                    let min =
                        int(&policy["gang"]["minCount"]).ok_or("spec.schedulingPolicy.gang.minCount is missing")?;
                    let mut info = info(min);
                    info.topology_key = spec["schedulingConstraints"]["topology"]
                        .as_array()
                        .and_then(|t| t.first())
                        .and_then(|t| text(&t["key"]));
                    info.priority = spec["priority"].as_i64().and_then(|p| i32::try_from(p).ok());
                    info.priority_class = text(&spec["priorityClassName"]);
                    Policy::Gang(info)
                } else {
                    Policy::Basic
                }
            }
            PodGroupApi::Coscheduling => {
                let mut info = info(int(&spec["minMember"]).unwrap_or(1));
                info.timeout_seconds = spec["scheduleTimeoutSeconds"].as_u64().filter(|s| *s > 0);
                Policy::Gang(info)
            }
            PodGroupApi::Volcano => {
                let mut info = info(int(&spec["minMember"]).unwrap_or(1));
                info.queue = text(&spec["queue"]);
                info.priority_class = text(&spec["priorityClassName"]);
                Policy::Gang(info)
            }
        };
        Ok(ForeignGroup { policy, conditions, generation: object.metadata.generation })
    }
}

/// How a group's pods are placed.
#[derive(Clone, Debug, PartialEq)]
pub enum Policy {
    /// Independently, like pods without a group (the upstream API's `basic`).
    Basic,
    /// All or nothing, with these settings.
    Gang(GroupInfo),
}

/// What is kept of one `PodGroup` of another API.
#[derive(Clone, Debug, PartialEq)]
pub struct ForeignGroup {
    /// How its pods are placed.
    pub policy: Policy,
    /// Its status conditions, as last seen (kept when the scheduler writes its own).
    pub conditions: Vec<Condition>,
    /// `metadata.generation`, for the conditions' `observedGeneration`.
    pub generation: Option<i64>,
}

/// What a lookup found.
#[derive(Debug, PartialEq)]
pub enum Found<'a> {
    /// The group.
    Group(&'a ForeignGroup),
    /// Not (yet) seen.
    Missing,
    /// The API is not watched (the cluster does not serve it).
    NotWatched,
}

/// The watched `PodGroup` APIs and their objects.
#[derive(Default)]
pub struct PodGroups {
    apis: Vec<PodGroupApi>,
    groups: Vec<AHashMap<String, ForeignGroup>>,
    watches: Vec<WatchState>,
    relist: Vec<Option<ahash::AHashSet<String>>>,
}

impl PodGroups {
    /// Empty, for `apis` (a watch index is a position in it).
    pub fn new(apis: Vec<PodGroupApi>) -> PodGroups {
        let n = apis.len();
        PodGroups {
            apis,
            groups: vec![AHashMap::new(); n],
            watches: vec![WatchState::Starting; n],
            relist: vec![None; n],
        }
    }

    /// The APIs, in watch order.
    pub fn apis(&self) -> &[PodGroupApi] {
        &self.apis
    }

    /// Every watch has listed or given up.
    pub fn settled(&self) -> bool {
        self.watches.iter().all(|w| *w != WatchState::Starting)
    }

    /// Watch `i` failed; whether this is news (the first failure before any list).
    pub fn watch_failed(&mut self, i: usize) -> bool {
        if self.watches[i] == WatchState::Starting {
            self.watches[i] = WatchState::Unavailable;
            return true;
        }
        false
    }

    /// A re-list of watch `i` starts.
    pub fn relist_started(&mut self, i: usize) {
        self.relist[i] = Some(ahash::AHashSet::new());
    }

    /// A re-list of watch `i` is done: groups it did not list are gone. Whether any was.
    pub fn relist_done(&mut self, i: usize) -> bool {
        self.watches[i] = WatchState::Synced;
        let Some(listed) = self.relist[i].take() else { return false };
        let before = self.groups[i].len();
        self.groups[i].retain(|k, _| listed.contains(k));
        before != self.groups[i].len()
    }

    /// `object` of watch `i` was added or changed; whether what scheduling reads of it changed
    /// (a status write of ours changes only its conditions).
    pub fn apply(&mut self, i: usize, object: &DynamicObject) -> bool {
        let key = format!(
            "{}/{}",
            object.metadata.namespace.as_deref().unwrap_or_default(),
            object.metadata.name.as_deref().unwrap_or_default()
        );
        if let Some(listed) = self.relist[i].as_mut() {
            listed.insert(key.clone());
        }
        match self.apis[i].read(object) {
            Ok(group) => {
                let changed = self.groups[i].get(&key).is_none_or(|g| g.policy != group.policy);
                self.groups[i].insert(key, group);
                changed
            }
            Err(e) => {
                tracing::warn!(group = %key, api = %self.apis[i].api_resource().api_version, error = %e, "ignoring a PodGroup that does not read");
                self.groups[i].remove(&key).is_some()
            }
        }
    }

    /// `object` of watch `i` was deleted.
    pub fn delete(&mut self, i: usize, object: &DynamicObject) -> bool {
        let key = format!(
            "{}/{}",
            object.metadata.namespace.as_deref().unwrap_or_default(),
            object.metadata.name.as_deref().unwrap_or_default()
        );
        self.groups[i].remove(&key).is_some()
    }

    /// The group `key` (`namespace/name`) of `source`'s API.
    pub fn find(&self, source: GroupSource, key: &str) -> Found<'_> {
        match self.apis.iter().position(|a| a.source() == source) {
            None => Found::NotWatched,
            Some(i) => self.groups[i].get(key).map_or(Found::Missing, Found::Group),
        }
    }

    /// The upstream API's groups that are gangs, with the API (for status writes).
    pub fn upstream_gangs(&self) -> impl Iterator<Item = (&PodGroupApi, &String, &ForeignGroup)> {
        self.apis
            .iter()
            .zip(&self.groups)
            .filter(|(a, _)| a.source() == GroupSource::Upstream)
            .flat_map(|(a, groups)| groups.iter().map(move |(k, g)| (a, k, g)))
            .filter(|(_, _, g)| matches!(g.policy, Policy::Gang(_)))
    }
}

/// The upstream `PodGroup` version the cluster serves (newest this scheduler reads), or `None`
/// when it serves none (the Workload API is alpha or beta and off by default).
pub async fn discover_upstream(client: &kube::Client) -> Option<String> {
    for version in UPSTREAM_VERSIONS {
        match client.list_api_group_resources(&format!("scheduling.k8s.io/{version}")).await {
            Ok(list) if list.resources.iter().any(|r| r.name == "podgroups") => return Some(version.to_string()),
            Ok(_) => {}
            Err(e) => tracing::debug!(version, error = %e, "scheduling.k8s.io version not served"),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(v: Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn each_api_reads_as_the_gang_its_controllers_mean() {
        // As the 1.36 Job controller creates it for an Indexed Job of parallelism 4.
        let v1alpha2 = PodGroupApi::Upstream { version: "v1alpha2".into() };
        let pg = object(json!({"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
            "metadata": {"name": "train-x-train-pgt-0-y", "namespace": "ml", "generation": 1},
            "spec": {"podGroupTemplateRef": {"workload": {"workloadName": "train-x", "podGroupTemplateName": "train-pgt-0"}},
                     "schedulingPolicy": {"gang": {"minCount": 4}},
                     "schedulingConstraints": {"topology": [{"key": "topology.kubernetes.io/rack"}]}},
            "status": {"conditions": [{"type": "DisruptionTarget", "status": "False", "reason": "x", "message": "",
                                        "lastTransitionTime": "2026-11-26T00:00:00Z"}]}}));
        let g = v1alpha2.read(&pg).unwrap();
        let Policy::Gang(info) = &g.policy else { panic!("{g:?}") };
        assert_eq!((info.min_member, info.topology_key.as_deref()), (4, Some("topology.kubernetes.io/rack")));
        assert_eq!((g.conditions.len(), g.generation), (1, Some(1)));
        assert_eq!(v1alpha2.scheduled_condition(), Some("PodGroupScheduled"));
        let v1beta1 = PodGroupApi::Upstream { version: "v1beta1".into() };
        assert_eq!(v1beta1.scheduled_condition(), Some("PodGroupInitiallyScheduled"));
        let basic =
            object(json!({"metadata": {"name": "b", "namespace": "ml"}, "spec": {"schedulingPolicy": {"basic": {}}}}));
        assert_eq!(v1beta1.read(&basic).unwrap().policy, Policy::Basic);
        let broken =
            object(json!({"metadata": {"name": "b", "namespace": "ml"}, "spec": {"schedulingPolicy": {"gang": {}}}}));
        assert!(v1beta1.read(&broken).unwrap_err().contains("minCount"));

        let cosched = object(json!({"metadata": {"name": "c", "namespace": "ml"},
            "spec": {"minMember": 3, "scheduleTimeoutSeconds": 60, "minResources": {"cpu": "3"}}}));
        let Policy::Gang(info) = PodGroupApi::Coscheduling.read(&cosched).unwrap().policy else { panic!() };
        assert_eq!((info.min_member, info.timeout_seconds), (3, Some(60)));
        let volcano = object(json!({"metadata": {"name": "v", "namespace": "ml"},
            "spec": {"minMember": 5, "queue": "research", "priorityClassName": "high"}}));
        let Policy::Gang(info) = PodGroupApi::Volcano.read(&volcano).unwrap().policy else { panic!() };
        assert_eq!(
            (info.min_member, info.queue.as_deref(), info.priority_class.as_deref()),
            (5, Some("research"), Some("high"))
        );
    }

    #[test]
    fn a_status_write_is_no_change_and_a_relist_forgets_what_it_did_not_list() {
        let mut groups =
            PodGroups::new(vec![PodGroupApi::Upstream { version: "v1beta1".into() }, PodGroupApi::Volcano]);
        let pg = |status: Value| {
            object(
                json!({"metadata": {"name": "g", "namespace": "ml"}, "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}, "status": status}),
            )
        };
        assert!(!groups.settled());
        assert!(groups.apply(0, &pg(json!({}))));
        let scheduled = json!({"conditions": [{"type": "PodGroupInitiallyScheduled", "status": "True", "reason": "Scheduled",
            "message": "", "lastTransitionTime": "2026-11-26T00:00:00Z"}]});
        assert!(!groups.apply(0, &pg(scheduled)));
        let Found::Group(g) = groups.find(GroupSource::Upstream, "ml/g") else { panic!() };
        assert_eq!(g.conditions.len(), 1, "the conditions seen are kept");
        assert_eq!(groups.find(GroupSource::Volcano, "ml/g"), Found::Missing);
        assert_eq!(groups.find(GroupSource::Coscheduling, "ml/g"), Found::NotWatched);
        assert_eq!(groups.upstream_gangs().count(), 1);
        assert!(groups.watch_failed(1) && !groups.watch_failed(1));
        groups.relist_started(0);
        assert!(groups.relist_done(0));
        assert!(groups.settled());
        assert_eq!(groups.find(GroupSource::Upstream, "ml/g"), Found::Missing);
    }
}
