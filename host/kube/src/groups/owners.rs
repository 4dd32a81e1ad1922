//! Gangs from pods' owners: users submit Jobs, JobSets, training jobs, RayClusters and
//! LeaderWorkerSets, not PodGroups. A pod without a group of its own belongs to its topmost owner
//! that the [`OwnerTable`] knows, and that owner's entry says, in CEL over the owner object, how
//! many members start together and in which queue.
//!
//! The table is data, not code: the built-in entries (`owner_kinds.yaml`) can be extended or
//! replaced by an operator without a new release. Owners are watched (one watch per kind); what is
//! kept of each is a handful of fields, never the object.

use std::sync::Arc;

use ahash::AHashMap;
use cel::objects::{Key, Map, Value};
use cel::{Context, ExecutionError, Program};
use kube::api::{ApiResource, DynamicObject};
use serde::{Deserialize, Serialize};

/// The built-in table, as documented in the chart.
const BUILTIN: &str = include_str!("owner_kinds.yaml");

/// One kind of owner and how to read a gang off it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OwnerKind {
    /// `group/version` (`v1` for the core group).
    pub api_version: String,
    /// The kind, as in `ownerReferences`.
    pub kind: String,
    /// Its plural resource name, for the watch.
    pub resource: String,
    /// CEL over `object`: the members placed together (≤ 1: pods are scheduled alone).
    pub min_member: String,
    /// CEL over `object`: the gang's queue (empty: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Pod labels whose values split one owner's pods into separate gangs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub group_by: Vec<String>,
    /// A pod label naming the owner directly (in the pod's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_label: Option<String>,
    /// Leaves a built-in kind out (its pods are scheduled alone).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
}

impl OwnerKind {
    /// The API group (empty for the core group).
    pub fn group(&self) -> &str {
        self.api_version.rsplit_once('/').map_or("", |(g, _)| g)
    }

    /// What kube's dynamic API needs to watch it.
    pub fn api_resource(&self) -> ApiResource {
        let version = self.api_version.rsplit_once('/').map_or(self.api_version.as_str(), |(_, v)| v);
        ApiResource {
            group: self.group().to_string(),
            version: version.to_string(),
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            plural: self.resource.clone(),
        }
    }
}

/// Why a table cannot be used: the scheduler refuses to start with one.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// Not YAML of the table's shape.
    #[error("owner kinds: {0}")]
    Parse(String),
    /// An entry that is incomplete or repeats another.
    #[error("owner kind {kind}: {reason}")]
    Entry {
        /// `group/Kind`.
        kind: String,
        /// What is wrong.
        reason: String,
    },
    /// An expression that does not compile.
    #[error("owner kind {kind}: {field} {expression:?} does not compile: {message}")]
    Compile {
        /// `group/Kind`.
        kind: String,
        /// `minMember` or `queue`.
        field: &'static str,
        /// The expression.
        expression: String,
        /// The parser's message.
        message: String,
    },
}

/// The built-in entries.
pub fn builtin() -> Vec<OwnerKind> {
    parse(BUILTIN).expect("the built-in owner table parses")
}

/// Entries from YAML (a list of [`OwnerKind`]).
pub fn parse(yaml: &str) -> Result<Vec<OwnerKind>, TableError> {
    serde_yaml_ng::from_str(yaml).map_err(|e| TableError::Parse(e.to_string()))
}

/// `base` with `extra` applied: an entry of the same group and kind replaces the base's (or, with
/// `disabled`, removes it); others are added.
pub fn merged(mut base: Vec<OwnerKind>, extra: Vec<OwnerKind>) -> Vec<OwnerKind> {
    for e in extra {
        base.retain(|b| !(b.group() == e.group() && b.kind == e.kind));
        if !e.disabled {
            base.push(e);
        }
    }
    base
}

/// An entry ready to evaluate.
struct Compiled {
    spec: OwnerKind,
    min_member: Program,
    queue: Option<Program>,
}

/// The owner kinds the scheduler groups by, compiled.
pub struct OwnerTable {
    kinds: Vec<Compiled>,
}

impl std::fmt::Debug for OwnerTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.kinds.iter().map(|k| &k.spec)).finish()
    }
}

impl OwnerTable {
    /// Checks and compiles `kinds`.
    pub fn new(kinds: Vec<OwnerKind>) -> Result<OwnerTable, TableError> {
        let mut out: Vec<Compiled> = Vec::new();
        for spec in kinds.into_iter().filter(|k| !k.disabled) {
            let name = format!("{}/{}", spec.group(), spec.kind);
            let bad = |reason: &str| TableError::Entry { kind: name.clone(), reason: reason.into() };
            if spec.kind.is_empty() || spec.resource.is_empty() || spec.api_version.is_empty() {
                return Err(bad("apiVersion, kind and resource are required"));
            }
            if out.iter().any(|c| c.spec.group() == spec.group() && c.spec.kind == spec.kind) {
                return Err(bad("listed twice"));
            }
            let compile = |field: &'static str, expression: &str| {
                Program::compile(expression).map_err(|e| TableError::Compile {
                    kind: name.clone(),
                    field,
                    expression: expression.into(),
                    message: e.to_string(),
                })
            };
            let min_member = compile("minMember", &spec.min_member)?;
            let queue =
                spec.queue.as_deref().filter(|q| !q.trim().is_empty()).map(|q| compile("queue", q)).transpose()?;
            out.push(Compiled { spec, min_member, queue });
        }
        Ok(OwnerTable { kinds: out })
    }

    /// The entries, in order: an owner's kind is its index here.
    pub fn kinds(&self) -> impl Iterator<Item = &OwnerKind> {
        self.kinds.iter().map(|k| &k.spec)
    }

    /// The entry for an owner reference's `apiVersion` and `kind` (any version of the group).
    pub fn index_of(&self, api_version: &str, kind: &str) -> Option<usize> {
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        self.kinds.iter().position(|k| k.spec.kind == kind && k.spec.group() == group)
    }

    /// What the scheduler keeps of `object`, an owner of kind `index`.
    pub fn facts(&self, index: usize, object: &DynamicObject) -> OwnerFacts {
        let kind = &self.kinds[index];
        let json = serde_json::to_value(object).unwrap_or_default();
        let value = cel_value(&json);
        let mut context = Context::default();
        context.add_function("sum", sum);
        context.add_variable_from_value("object", value);
        let min_member = match kind.min_member.execute(&context) {
            Ok(Value::Int(n)) => Ok(n.clamp(0, i64::from(u32::MAX)) as u32),
            Ok(Value::UInt(n)) => Ok(n.min(u64::from(u32::MAX)) as u32),
            Ok(other) => Err(format!("minMember gave {other:?}, not an integer")),
            Err(e) => Err(format!("minMember: {e}")),
        };
        let queue = match kind.queue.as_ref().map(|q| q.execute(&context)) {
            None => Ok(None),
            Some(Ok(Value::String(s))) if s.is_empty() => Ok(None),
            Some(Ok(Value::String(s))) => Ok(Some(s.to_string())),
            Some(Ok(Value::Null)) => Ok(None),
            Some(Ok(other)) => Err(format!("queue gave {other:?}, not a string")),
            Some(Err(e)) => Err(format!("queue: {e}")),
        };
        let error = match (&min_member, &queue) {
            (Err(e), _) | (_, Err(e)) => Some(e.clone()),
            _ => None,
        };
        let controller =
            object.metadata.owner_references.iter().flatten().find(|r| r.controller == Some(true)).map(|r| OwnerRef {
                api_version: r.api_version.clone(),
                kind: r.kind.clone(),
                name: r.name.clone(),
                uid: r.uid.clone(),
            });
        OwnerFacts {
            kind: index,
            namespace: object.metadata.namespace.clone().unwrap_or_default(),
            name: object.metadata.name.clone().unwrap_or_default(),
            controller,
            min_member: min_member.unwrap_or(1),
            queue: queue.unwrap_or(None),
            error,
            seen: Seen::default(),
        }
    }
}

/// An owner reference: enough to find the owner in [`Owners`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerRef {
    /// Its `apiVersion`.
    pub api_version: String,
    /// Its kind.
    pub kind: String,
    /// Its name (in the namespace of what it owns).
    pub name: String,
    /// Its UID.
    pub uid: String,
}

impl OwnerRef {
    /// The controller reference of `meta`, if any.
    pub fn controller_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<OwnerRef> {
        meta.owner_references.iter().flatten().find(|r| r.controller == Some(true)).map(|r| OwnerRef {
            api_version: r.api_version.clone(),
            kind: r.kind.clone(),
            name: r.name.clone(),
            uid: r.uid.clone(),
        })
    }
}

/// What was read of an owner's metadata when its facts were: the same again means the same facts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// `metadata.generation` (bumped by every spec change).
    generation: Option<i64>,
    /// A hash of its labels, annotations and owner references.
    meta: u64,
}

impl Seen {
    fn of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Seen {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        meta.labels.hash(&mut h);
        meta.annotations.hash(&mut h);
        for r in meta.owner_references.iter().flatten() {
            (&r.api_version, &r.kind, &r.name, &r.uid, r.controller).hash(&mut h);
        }
        Seen { generation: meta.generation, meta: h.finish() }
    }
}

/// What is kept of one owner object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerFacts {
    /// Its entry in the table.
    pub kind: usize,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its own controller, for the walk to the topmost owner.
    pub controller: Option<OwnerRef>,
    /// Members placed together (1 when an expression failed).
    pub min_member: u32,
    /// Its queue, when the table's expression names one.
    pub queue: Option<String>,
    /// Why an expression failed on it (its pods are then scheduled alone).
    pub error: Option<String>,
    /// What these facts were read from.
    pub seen: Seen,
}

impl OwnerFacts {
    /// Whether `other` groups pods as these facts do.
    fn same_grouping(&self, other: &OwnerFacts) -> bool {
        (self.kind, &self.name, &self.controller, self.min_member, &self.queue, &self.error)
            == (other.kind, &other.name, &other.controller, other.min_member, &other.queue, &other.error)
    }
}

/// How a pod is grouped by its owners.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Grouping {
    /// No owner the table knows, or one whose gang has one member: scheduled alone (in the
    /// owner's queue, when it names one).
    Alone {
        /// The owner's queue.
        queue: Option<String>,
    },
    /// A member of its owner's gang.
    Gang {
        /// The gang's name within the pod's namespace: `kind/owner[/label values]`.
        name: String,
        /// Members placed together.
        min_member: usize,
        /// The owner's queue.
        queue: Option<String>,
    },
    /// Its owner is of a kind the table knows but has not been seen yet: it waits rather than be
    /// placed alone and break its gang.
    Waiting(String),
}

/// How far one kind's watch has got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WatchState {
    /// Not listed yet.
    #[default]
    Starting,
    /// Listed: an owner not in the cache does not exist (yet).
    Synced,
    /// The list failed before it ever succeeded (the kind is not served, or RBAC forbids it):
    /// pods of such owners are scheduled alone.
    Unavailable,
}

/// The owners of every kind in the table, as the watches last showed them.
pub struct Owners {
    table: Arc<OwnerTable>,
    by_uid: AHashMap<String, OwnerFacts>,
    /// `(kind, namespace, name)` → UID, for owners pods name by label.
    by_name: AHashMap<(usize, String, String), String>,
    watches: Vec<WatchState>,
    /// Listed UIDs of a re-list in progress, per kind.
    relist: Vec<Option<Vec<String>>>,
}

impl Default for Owners {
    fn default() -> Owners {
        Owners::new(Arc::new(OwnerTable { kinds: Vec::new() }))
    }
}

impl Owners {
    /// An empty cache for `table`.
    pub fn new(table: Arc<OwnerTable>) -> Owners {
        let n = table.kinds.len();
        Owners {
            table,
            by_uid: AHashMap::new(),
            by_name: AHashMap::new(),
            watches: vec![WatchState::Starting; n],
            relist: vec![None; n],
        }
    }

    /// The table.
    pub fn table(&self) -> &Arc<OwnerTable> {
        &self.table
    }

    /// Owners cached.
    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    /// No owner cached.
    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }

    /// Every kind's watch has listed or given up: grouping is as good as it will get.
    pub fn settled(&self) -> bool {
        self.watches.iter().all(|w| *w != WatchState::Starting)
    }

    /// Kind `kind`'s watch state.
    pub fn watch_state(&self, kind: usize) -> WatchState {
        self.watches[kind]
    }

    /// Kind `kind`'s watch failed: until it lists, its owners are unknown. Returns whether this
    /// is news (the first failure before any list).
    pub fn watch_failed(&mut self, kind: usize) -> bool {
        if self.watches[kind] == WatchState::Starting {
            self.watches[kind] = WatchState::Unavailable;
            return true;
        }
        false
    }

    /// A re-list of kind `kind` starts.
    pub fn relist_started(&mut self, kind: usize) {
        self.relist[kind] = Some(Vec::new());
    }

    /// A re-list of kind `kind` is done: owners it did not list are gone.
    pub fn relist_done(&mut self, kind: usize) {
        if let Some(listed) = self.relist[kind].take() {
            let listed: ahash::AHashSet<String> = listed.into_iter().collect();
            let gone: Vec<String> = self
                .by_uid
                .iter()
                .filter(|(uid, f)| f.kind == kind && !listed.contains(*uid))
                .map(|(u, _)| u.clone())
                .collect();
            for uid in gone {
                self.remove_uid(&uid);
            }
        }
        self.watches[kind] = WatchState::Synced;
    }

    /// An owner of kind `kind` was added or changed; returns whether what grouping reads of it
    /// changed.
    pub fn apply(&mut self, kind: usize, object: &DynamicObject) -> bool {
        let Some(uid) = object.metadata.uid.clone() else { return false };
        if let Some(listed) = self.relist[kind].as_mut() {
            listed.push(uid.clone());
        }
        // A Job's status changes with every pod it runs; what the table reads does not: the
        // expressions are evaluated again only when the spec (its generation), the labels, the
        // annotations or the owner references change.
        let seen = Seen::of(&object.metadata);
        if seen.generation.is_some() && self.by_uid.get(&uid).is_some_and(|f| f.seen == seen) {
            return false;
        }
        let mut facts = self.table.facts(kind, object);
        facts.seen = seen;
        if let Some(e) = &facts.error
            && self.by_uid.get(&uid).is_none_or(|f| f.error.as_ref() != Some(e))
        {
            let kind_name = &self.table.kinds[kind].spec.kind;
            tracing::warn!(owner = %facts.name, kind = %kind_name, error = %e, "owner kind's expression failed: its pods are scheduled alone");
        }
        self.by_name.insert((kind, facts.namespace.clone(), facts.name.clone()), uid.clone());
        self.by_uid.insert(uid, facts.clone()).is_none_or(|before| !before.same_grouping(&facts))
    }

    /// An owner was deleted.
    pub fn delete(&mut self, object: &DynamicObject) -> bool {
        object.metadata.uid.as_deref().is_some_and(|uid| self.remove_uid(uid))
    }

    fn remove_uid(&mut self, uid: &str) -> bool {
        let Some(f) = self.by_uid.remove(uid) else { return false };
        let key = (f.kind, f.namespace, f.name);
        if self.by_name.get(&key).is_some_and(|u| u == uid) {
            self.by_name.remove(&key);
        }
        true
    }

    /// How a pod in `namespace` with controller `controller` and `labels` is grouped: by its
    /// topmost owner the table knows.
    pub fn grouping(
        &self,
        namespace: &str,
        controller: Option<&OwnerRef>,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Grouping {
        // Owners a pod names by label (their chain passes objects not watched).
        let by_label = self.table.kinds.iter().enumerate().find_map(|(i, k)| {
            let name = labels.get(k.spec.pod_label.as_deref()?)?;
            Some((i, name))
        });
        let mut top: Option<&OwnerFacts> = None;
        let mut next: Option<(usize, String, String)> = None; // (kind, uid, name)
        match by_label {
            Some((kind, name)) => match self.by_name.get(&(kind, namespace.to_string(), name.clone())) {
                Some(uid) => next = Some((kind, uid.clone(), name.clone())),
                None => return self.unseen(kind, name),
            },
            None => {
                if let Some(r) = controller
                    && let Some(kind) = self.table.index_of(&r.api_version, &r.kind)
                {
                    next = Some((kind, r.uid.clone(), r.name.clone()));
                }
            }
        }
        // Walk up: each owner's own controller, while the table knows its kind. Bounded, as an
        // owner cycle (impossible through the API server's garbage collector) must not hang.
        let mut hops = 0;
        while let Some((kind, uid, name)) = next.take() {
            hops += 1;
            if self.watches[kind] == WatchState::Unavailable || hops > 16 {
                break;
            }
            let Some(facts) = self.by_uid.get(&uid) else {
                return self.unseen(kind, &name);
            };
            top = Some(facts);
            if let Some(r) = &facts.controller
                && let Some(k) = self.table.index_of(&r.api_version, &r.kind)
            {
                next = Some((k, r.uid.clone(), r.name.clone()));
            }
        }
        let Some(owner) = top else { return Grouping::Alone { queue: None } };
        if owner.min_member <= 1 {
            return Grouping::Alone { queue: owner.queue.clone() };
        }
        let spec = &self.table.kinds[owner.kind].spec;
        let mut name = format!("{}/{}", spec.kind.to_ascii_lowercase(), owner.name);
        for label in &spec.group_by {
            if let Some(v) = labels.get(label) {
                name.push('/');
                name.push_str(v);
            }
        }
        Grouping::Gang { name, min_member: owner.min_member as usize, queue: owner.queue.clone() }
    }

    fn unseen(&self, kind: usize, name: &str) -> Grouping {
        let spec = &self.table.kinds[kind].spec;
        match self.watches[kind] {
            WatchState::Unavailable => Grouping::Alone { queue: None },
            WatchState::Starting => {
                Grouping::Waiting(format!("waiting for the scheduler to list {} objects", spec.kind))
            }
            WatchState::Synced => Grouping::Waiting(format!("waiting for its owner {} {name} to be seen", spec.kind)),
        }
    }
}

/// CEL's `sum(list)`: the total of a list of integers.
fn sum(cel::extractors::Arguments(args): cel::extractors::Arguments) -> Result<Value, ExecutionError> {
    let Some(Value::List(list)) = args.first() else {
        return Err(ExecutionError::function_error("sum", "expects one list"));
    };
    let mut total: i64 = 0;
    for v in list.iter() {
        let n = match v {
            Value::Int(n) => *n,
            Value::UInt(n) => i64::try_from(*n).map_err(|_| ExecutionError::function_error("sum", "overflow"))?,
            other => return Err(ExecutionError::function_error("sum", format!("{other:?} is not an integer"))),
        };
        total = total.checked_add(n).ok_or_else(|| ExecutionError::function_error("sum", "overflow"))?;
    }
    Ok(Value::Int(total))
}

/// JSON as CEL values, integers as CEL `int` (as Kubernetes' CEL reads them), so expressions can
/// mix fields with literals.
fn cel_value(json: &serde_json::Value) -> Value {
    match json {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Float(n.as_f64().unwrap_or_default()),
        },
        serde_json::Value::String(s) => Value::String(Arc::new(s.clone())),
        serde_json::Value::Array(a) => Value::List(Arc::new(a.iter().map(cel_value).collect())),
        serde_json::Value::Object(o) => {
            let map: std::collections::HashMap<Key, Value> =
                o.iter().map(|(k, v)| (Key::String(Arc::new(k.clone())), cel_value(v))).collect();
            Value::Map(Map { map: Arc::new(map) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(v: serde_json::Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    fn table() -> OwnerTable {
        OwnerTable::new(builtin()).unwrap()
    }

    fn facts_of(kind: &str, v: serde_json::Value) -> OwnerFacts {
        let t = table();
        let i = t.kinds.iter().position(|k| k.spec.kind == kind).unwrap();
        t.facts(i, &object(v))
    }

    #[test]
    fn the_builtin_table_reads_each_kind_as_its_controller_runs_it() {
        let job = |mode: &str, parallelism: i64, completions: i64| {
            facts_of(
                "Job",
                json!({"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": "j", "namespace": "ml", "uid": "u", "labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
                "spec": {"completionMode": mode, "parallelism": parallelism, "completions": completions, "template": {}}}),
            )
        };
        let indexed = job("Indexed", 8, 8);
        assert_eq!((indexed.min_member, indexed.queue.as_deref(), indexed.error), (8, Some("team-a"), None));
        assert_eq!(job("Indexed", 8, 100).min_member, 1, "a work queue of indexes is not a gang");
        assert_eq!(job("NonIndexed", 8, 8).min_member, 1);

        let jobset = facts_of(
            "JobSet",
            json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "js", "namespace": "ml", "uid": "u"},
            "spec": {"replicatedJobs": [
                {"name": "driver", "template": {"spec": {"template": {}}}},
                {"name": "workers", "replicas": 4, "template": {"spec": {"parallelism": 2, "completions": 2, "template": {}}}}]}}),
        );
        assert_eq!((jobset.min_member, jobset.queue.clone(), jobset.error.clone()), (9, None, None));
        let in_order = facts_of(
            "JobSet",
            json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "js", "uid": "u"},
            "spec": {"startupPolicy": {"startupPolicyOrder": "InOrder"},
                     "replicatedJobs": [{"name": "w", "replicas": 4, "template": {"spec": {"template": {}}}}]}}),
        );
        assert_eq!(in_order.min_member, 1);

        let pytorch = |extra: serde_json::Value| {
            let mut spec = json!({"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 15}}});
            spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            facts_of(
                "PyTorchJob",
                json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                "metadata": {"name": "pt", "uid": "u"}, "spec": spec}),
            )
        };
        assert_eq!(pytorch(json!({})).min_member, 16);
        let p = pytorch(json!({"runPolicy": {"schedulingPolicy": {"minAvailable": 4, "queue": "research"}}}));
        assert_eq!((p.min_member, p.queue.as_deref()), (4, Some("research")));
        assert_eq!(pytorch(json!({"elasticPolicy": {"minReplicas": 3, "maxReplicas": 15}})).min_member, 4);

        let mpi = |policy: &str| {
            facts_of(
                "MPIJob",
                json!({"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
                "metadata": {"name": "mpi", "uid": "u"},
                "spec": {"launcherCreationPolicy": policy,
                         "mpiReplicaSpecs": {"Launcher": {"replicas": 1}, "Worker": {"replicas": 8}}}}),
            )
        };
        assert_eq!(mpi("AtStartup").min_member, 9);
        assert_eq!(mpi("WaitForWorkersReady").min_member, 8, "the launcher comes after the workers run");

        let ray = facts_of(
            "RayCluster",
            json!({"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "rc", "uid": "u"},
            "spec": {"headGroupSpec": {}, "workerGroupSpecs": [
                {"groupName": "gpu", "replicas": 6, "minReplicas": 2, "maxReplicas": 10},
                {"groupName": "tpu", "replicas": 1, "numOfHosts": 4}]}}),
        );
        assert_eq!(ray.min_member, 1 + 2 + 4);

        let lws = facts_of(
            "LeaderWorkerSet",
            json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "llm", "uid": "u"}, "spec": {"replicas": 3, "leaderWorkerTemplate": {"size": 4}}}),
        );
        assert_eq!(lws.min_member, 4);
    }

    #[test]
    fn an_expression_that_fails_on_an_object_leaves_its_pods_alone_with_the_reason() {
        let broken = facts_of(
            "JobSet",
            json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "js", "uid": "u"}, "spec": {"replicatedJobs": "not a list"}}),
        );
        assert_eq!(broken.min_member, 1);
        assert!(broken.error.as_deref().is_some_and(|e| e.contains("minMember")), "{broken:?}");
    }

    #[test]
    fn operators_extend_replace_and_disable_kinds_and_bad_entries_are_refused() {
        let extra = parse(
            "- {apiVersion: batch/v1, kind: Job, resource: jobs, minMember: 'object.spec.parallelism'}\n\
             - {apiVersion: ray.io/v1, kind: RayCluster, resource: rayclusters, minMember: '1', disabled: true}\n\
             - {apiVersion: example.com/v1, kind: Trainer, resource: trainers, minMember: 'object.spec.nodes'}\n",
        )
        .unwrap();
        let kinds = merged(builtin(), extra);
        let t = OwnerTable::new(kinds).unwrap();
        assert!(t.index_of("ray.io/v1", "RayCluster").is_none());
        assert!(t.index_of("example.com/v1beta3", "Trainer").is_some(), "any version of the group");
        let job = t.index_of("batch/v1", "Job").unwrap();
        let f = t.facts(
            job,
            &object(json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "uid": "u"},
            "spec": {"parallelism": 3}})),
        );
        assert_eq!(f.min_member, 3, "the operator's expression replaced the built-in one");

        let bad =
            OwnerTable::new(parse("- {apiVersion: a/v1, kind: K, resource: ks, minMember: 'object.spec.('}").unwrap());
        assert!(matches!(bad, Err(TableError::Compile { field: "minMember", .. })), "{bad:?}");
        let twice = parse("- {apiVersion: a/v1, kind: K, resource: ks, minMember: '1'}\n- {apiVersion: a/v2, kind: K, resource: ks, minMember: '2'}").unwrap();
        assert!(OwnerTable::new(twice).unwrap_err().to_string().contains("listed twice"));
        assert!(
            parse("- {apiVersion: a/v1, kind: K, resource: ks, minMember: '1', minmember: '2'}").is_err(),
            "unknown fields are refused"
        );
    }

    #[test]
    fn the_documented_example_table_parses_and_compiles() {
        let doc = include_str!("../../../../docs/kubernetes.md");
        let start = doc.find("  ownerKinds:\n").expect("docs/kubernetes.md shows scheduler.ownerKinds")
            + "  ownerKinds:\n".len();
        let block: String =
            doc[start..].lines().take_while(|l| l.starts_with("    ")).map(|l| format!("{}\n", &l[4..])).collect();
        let extra = parse(&block).unwrap();
        assert_eq!(extra.len(), 2, "{block}");
        let table = OwnerTable::new(merged(builtin(), extra)).unwrap();
        assert!(table.index_of("trainer.example.com/v1", "Trainer").is_some());
        assert!(table.index_of("ray.io/v1", "RayCluster").is_none());
    }

    fn owner(
        api_version: &str,
        kind: &str,
        name: &str,
        uid: &str,
        controller: Option<(&str, &str, &str, &str)>,
        spec: serde_json::Value,
    ) -> DynamicObject {
        let refs: Vec<serde_json::Value> = controller
            .into_iter()
            .map(|(v, k, n, u)| json!({"apiVersion": v, "kind": k, "name": n, "uid": u, "controller": true}))
            .collect();
        object(json!({"apiVersion": api_version, "kind": kind,
            "metadata": {"name": name, "namespace": "ml", "uid": uid, "ownerReferences": refs}, "spec": spec}))
    }

    #[test]
    fn pods_group_by_their_topmost_known_owner_and_wait_for_one_not_seen_yet() {
        let table = Arc::new(table());
        let mut owners = Owners::new(table.clone());
        let job_ref = OwnerRef {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            name: "js-workers-0".into(),
            uid: "job-1".into(),
        };
        let labels = |attempt: &str| {
            [("jobset.sigs.k8s.io/restart-attempt".to_string(), attempt.to_string())].into_iter().collect()
        };
        let job_index = table.index_of("batch/v1", "Job").unwrap();
        let jobset_index = table.index_of("jobset.x-k8s.io/v1alpha2", "JobSet").unwrap();
        // Nothing listed yet: wait.
        assert!(matches!(owners.grouping("ml", Some(&job_ref), &labels("0")), Grouping::Waiting(_)));
        owners.relist_done(job_index);
        let job = owner(
            "batch/v1",
            "Job",
            "js-workers-0",
            "job-1",
            Some(("jobset.x-k8s.io/v1alpha2", "JobSet", "js", "js-1")),
            json!({"parallelism": 2, "completions": 2, "completionMode": "Indexed"}),
        );
        assert!(owners.apply(job_index, &job));
        assert!(!owners.apply(job_index, &job), "the same facts again change nothing");
        // A status update (same generation and metadata) is not read again; a new spec is.
        let mut scaled = job.clone();
        scaled.metadata.generation = Some(1);
        assert!(!owners.apply(job_index, &scaled), "no generation before: read, same facts");
        scaled.data["spec"]["parallelism"] = json!(3);
        assert!(!owners.apply(job_index, &scaled), "same generation: not read again");
        scaled.metadata.generation = Some(2);
        assert!(owners.apply(job_index, &scaled), "a new generation is read: parallelism 3 ≠ completions, min 1");
        // The Job is known, its JobSet is not: wait for it.
        let w = owners.grouping("ml", Some(&job_ref), &labels("0"));
        assert!(matches!(&w, Grouping::Waiting(m) if m.contains("JobSet")), "{w:?}");
        owners.relist_done(jobset_index);
        let w = owners.grouping("ml", Some(&job_ref), &labels("0"));
        assert!(matches!(&w, Grouping::Waiting(m) if m.contains("owner JobSet js")), "{w:?}");
        owners.apply(jobset_index, &owner("jobset.x-k8s.io/v1alpha2", "JobSet", "js", "js-1", None,
            json!({"replicatedJobs": [{"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 2}}}]})));
        assert_eq!(
            owners.grouping("ml", Some(&job_ref), &labels("1")),
            Grouping::Gang { name: "jobset/js/1".into(), min_member: 4, queue: None }
        );
        // A ReplicaSet's pod is nobody's gang; a Deployment is not in the table.
        let rs =
            OwnerRef { api_version: "apps/v1".into(), kind: "ReplicaSet".into(), name: "web".into(), uid: "rs".into() };
        assert_eq!(owners.grouping("ml", Some(&rs), &Default::default()), Grouping::Alone { queue: None });
        // A kind that cannot be listed: its pods are not held back forever.
        let ray = table.index_of("ray.io/v1", "RayCluster").unwrap();
        assert!(owners.watch_failed(ray));
        assert!(!owners.watch_failed(ray), "said once");
        let rc = OwnerRef {
            api_version: "ray.io/v1".into(),
            kind: "RayCluster".into(),
            name: "rc".into(),
            uid: "rc-1".into(),
        };
        assert_eq!(owners.grouping("ml", Some(&rc), &Default::default()), Grouping::Alone { queue: None });
        // A re-list that no longer has the JobSet forgets it.
        owners.relist_started(jobset_index);
        owners.relist_done(jobset_index);
        assert!(matches!(owners.grouping("ml", Some(&job_ref), &labels("1")), Grouping::Waiting(_)));
    }

    #[test]
    fn leader_worker_set_pods_find_their_owner_by_label_one_gang_per_group() {
        let table = Arc::new(table());
        let mut owners = Owners::new(table.clone());
        let lws = table.index_of("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet").unwrap();
        owners.relist_done(lws);
        owners.apply(
            lws,
            &owner(
                "leaderworkerset.x-k8s.io/v1",
                "LeaderWorkerSet",
                "llm",
                "lws-1",
                None,
                json!({"replicas": 2, "leaderWorkerTemplate": {"size": 4}}),
            ),
        );
        // A worker pod's controller is its group's StatefulSet (owned by the leader pod).
        let sts = OwnerRef {
            api_version: "apps/v1".into(),
            kind: "StatefulSet".into(),
            name: "llm-1".into(),
            uid: "sts".into(),
        };
        let labels: std::collections::BTreeMap<String, String> = [
            ("leaderworkerset.sigs.k8s.io/name".to_string(), "llm".to_string()),
            ("leaderworkerset.sigs.k8s.io/group-index".to_string(), "1".to_string()),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            owners.grouping("ml", Some(&sts), &labels),
            Grouping::Gang { name: "leaderworkerset/llm/1".into(), min_member: 4, queue: None }
        );
        assert!(matches!(owners.grouping("other", Some(&sts), &labels), Grouping::Waiting(_)), "namespaced");
    }
}
