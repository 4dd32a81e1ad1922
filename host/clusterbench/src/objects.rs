//! The objects a benchmark run creates, as the API server receives them: fake GPU nodes, the pods
//! of each workload shape, and what those shapes need (priority classes, gangs' PodGroups). Pure
//! functions of the run's settings, so what a run sends is tested without a server.

use serde_json::{Value, json};

/// Every pod and PodGroup of a run carries its run id under this label (the run's watch and its
/// clean-up select on it).
pub const RUN_LABEL: &str = "wasmsched.io/bench-run";
/// `measured` or `filler` (the pods that fill the cluster before a preemption run).
pub const ROLE_LABEL: &str = "wasmsched.io/bench-role";
/// Every fake node carries this label (clean-up deletes by it).
pub const NODE_LABEL: &str = "wasmsched.io/bench-node";
/// Pods of one anti-affinity set share this label's value; no two of a set on one node.
pub const SPREAD_LABEL: &str = "wasmsched.io/bench-spread";
/// wasmsched's gang label (naming a `scheduling.wasmsched.io` PodGroup).
pub const GROUP_LABEL: &str = "scheduling.wasmsched.io/pod-group";
/// The resource the fake nodes have and the pods ask.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The priority class of the pods that fill the cluster in a preemption run.
pub const LOW_PRIORITY: &str = "wasmsched-bench-low";
/// The priority class of the pods that must preempt them.
pub const HIGH_PRIORITY: &str = "wasmsched-bench-high";
/// The DRA driver the fake nodes' ResourceSlices name (no such driver runs: without kubelets,
/// nothing prepares the devices), and the DeviceClass of its GPUs.
pub const DRA_DRIVER: &str = "gpu.bench.wasmsched.io";
/// The GPU model every fake DRA device has, which each claim's selector asks for.
pub const DRA_MODEL: &str = "H100";

/// What the measured pods look like (scheduler_perf's scenarios, for GPUs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Pods of `gpus_per_pod` whole GPUs, nothing else asked.
    Plain,
    /// Gangs of this many pods (wasmsched's PodGroup with `minMember` = the size; a scheduler
    /// without gangs places the pods one by one).
    Gang(u32),
    /// Sets of pods with required anti-affinity to each other on `kubernetes.io/hostname` (a set
    /// is as large as the cluster has nodes).
    AntiAffinity,
    /// The cluster first filled with low-priority pods; each measured pod must preempt.
    Preempt,
    /// Each pod's GPUs through its own ResourceClaim (DRA), a CEL selector on the device's model;
    /// the fake nodes publish their GPUs as ResourceSlices.
    Dra,
}

impl Workload {
    /// Parses `plain`, `gang:N`, `anti-affinity` or `preempt`.
    pub fn parse(text: &str) -> Result<Workload, String> {
        match text {
            "plain" => Ok(Workload::Plain),
            "anti-affinity" => Ok(Workload::AntiAffinity),
            "preempt" => Ok(Workload::Preempt),
            "dra" => Ok(Workload::Dra),
            _ => match text.strip_prefix("gang:").map(str::parse::<u32>) {
                Some(Ok(n)) if n >= 2 => Ok(Workload::Gang(n)),
                Some(_) => Err(format!("{text:?}: a gang has 2 or more pods (gang:8)")),
                None => Err(format!("unknown workload {text:?}: plain, gang:N, anti-affinity, preempt or dra")),
            },
        }
    }

    /// The name `parse` reads.
    pub fn name(self) -> String {
        match self {
            Workload::Plain => "plain".into(),
            Workload::Gang(n) => format!("gang:{n}"),
            Workload::AntiAffinity => "anti-affinity".into(),
            Workload::Preempt => "preempt".into(),
            Workload::Dra => "dra".into(),
        }
    }
}

/// The measured pods' shapes, dealt in rounds: each round has one unit of every workload in the
/// list, in order (a gang's unit is its N pods, the others' one pod), so `plain,gang:8` makes
/// pods 0, 9, 18, … plain and each run of 8 between them a gang. With `preempt` anywhere in the
/// list, the cluster is filled with low-priority pods first and every measured pod outranks them
/// (a gang must preempt too).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mix(Vec<Workload>);

/// What one measured pod is, from its index ([`Mix::member`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its shape.
    pub workload: Workload,
    /// Its unit among the run's units of the same workload in the list (gang `n`, or the `n`th
    /// anti-affinity pod), counted across rounds.
    pub unit: usize,
}

impl Mix {
    /// Parses a comma-separated list of [`Workload::parse`] names.
    pub fn parse(text: &str) -> Result<Mix, String> {
        let list = text.split(',').map(|w| Workload::parse(w.trim())).collect::<Result<Vec<_>, _>>()?;
        if list.is_empty() {
            return Err("name at least one workload".into());
        }
        Ok(Mix(list))
    }

    /// The name `parse` reads.
    pub fn name(&self) -> String {
        self.0.iter().map(|w| w.name()).collect::<Vec<_>>().join(",")
    }

    /// The workloads, in dealing order.
    pub fn workloads(&self) -> &[Workload] {
        &self.0
    }

    /// Pods in one round.
    pub fn round(&self) -> usize {
        self.0.iter().map(|w| w.unit_size()).sum()
    }

    /// Whether the cluster is filled with low-priority pods that the measured pods preempt.
    pub fn preempts(&self) -> bool {
        self.0.contains(&Workload::Preempt)
    }

    /// Whether any pod takes its GPUs through a ResourceClaim.
    pub fn has_dra(&self) -> bool {
        self.0.contains(&Workload::Dra)
    }

    /// Whether any unit is a gang.
    pub fn has_gangs(&self) -> bool {
        self.0.iter().any(|w| matches!(w, Workload::Gang(_)))
    }

    /// What measured pod `i` is.
    pub fn member(&self, i: usize) -> Member {
        let (round, mut offset) = (i / self.round(), i % self.round());
        for (k, &workload) in self.0.iter().enumerate() {
            if offset < workload.unit_size() {
                let same = |w: &Workload| *w == workload;
                let per_round = self.0.iter().filter(|w| same(w)).count();
                let before = self.0[..k].iter().filter(|w| same(w)).count();
                return Member { workload, unit: round * per_round + before };
            }
            offset -= workload.unit_size();
        }
        unreachable!("an offset within a round falls in one of its units")
    }

    /// The gangs of a run of `pods` measured pods: (gang unit, size), each once.
    pub fn gangs(&self, pods: usize) -> Vec<(usize, u32)> {
        let mut gangs = Vec::new();
        let mut i = 0;
        while i < pods {
            let member = self.member(i);
            let size = member.workload.unit_size();
            if let Workload::Gang(n) = member.workload {
                gangs.push((member.unit, n));
            }
            i += size;
        }
        gangs
    }
}

impl From<Workload> for Mix {
    fn from(workload: Workload) -> Mix {
        Mix(vec![workload])
    }
}

impl Workload {
    /// Pods in one unit of this workload.
    pub fn unit_size(self) -> usize {
        match self {
            Workload::Gang(n) => n as usize,
            _ => 1,
        }
    }
}

/// The name of fake node `i`.
pub fn node_name(i: usize) -> String {
    format!("bench-node-{i}")
}

/// A fake node as created (the server ignores `status` on create; see [`node_status`]).
pub fn node(i: usize) -> Value {
    let name = node_name(i);
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            NODE_LABEL: "true",
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.memory": "81559",
        }},
        "spec": {}
    })
}

/// A fake node's status: Ready, `gpus` GPUs and room for many pods. No kubelet keeps it: with a
/// controller manager's node lifecycle controller running, the node turns NotReady after its
/// grace period, so run the benchmark without one.
pub fn node_status(gpus: u32) -> Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let resources = json!({"cpu": "192", "memory": "2048Gi", "pods": "256", GPU_RESOURCE: gpus.to_string()});
    json!({"status": {
        "capacity": resources, "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "fake node of wasmsched cluster-bench", "lastHeartbeatTime": now,
                        "lastTransitionTime": now}],
        "nodeInfo": {"kubeletVersion": "v1.36.0", "containerRuntimeVersion": "fake://0",
                     "architecture": "amd64", "operatingSystem": "linux", "machineID": "", "systemUUID": "",
                     "bootID": "", "kernelVersion": "", "osImage": "", "kubeProxyVersion": ""}
    }})
}

/// The patch that clears the `node.kubernetes.io/not-ready` taint the API server's admission
/// puts on every new node (a kubelet's node lifecycle would clear it once Ready).
pub fn untainted() -> Value {
    json!({"spec": {"taints": null}})
}

/// One pod of a run.
#[derive(Clone, Copy, Debug)]
pub struct PodShape<'a> {
    /// The run id ([`RUN_LABEL`]).
    pub run: &'a str,
    /// `schedulerName`.
    pub scheduler: &'a str,
    /// Whole GPUs asked.
    pub gpus: u32,
    /// The measured pods' shapes.
    pub workload: &'a Mix,
    /// Nodes in the cluster (the size of an anti-affinity set).
    pub nodes: usize,
}

impl PodShape<'_> {
    /// The name of measured pod `i` (fillers: [`PodShape::filler_name`]).
    pub fn name(&self, i: usize) -> String {
        format!("{}-{i}", self.run)
    }

    /// The name of filler pod `i`.
    pub fn filler_name(&self, i: usize) -> String {
        format!("{}-fill-{i}", self.run)
    }

    /// Measured pod `i`.
    pub fn measured(&self, i: usize) -> Value {
        let mut pod = self.base(&self.name(i), "measured");
        let member = self.workload.member(i);
        if self.workload.preempts() {
            pod["spec"]["priorityClassName"] = json!(HIGH_PRIORITY);
        }
        match member.workload {
            Workload::Plain | Workload::Preempt => {}
            Workload::Dra => {
                pod["spec"]["containers"][0]["resources"]["limits"].as_object_mut().map(|l| l.remove(GPU_RESOURCE));
                pod["spec"]["containers"][0]["resources"]["requests"].as_object_mut().map(|l| l.remove(GPU_RESOURCE));
                pod["spec"]["containers"][0]["resources"]["claims"] = json!([{"name": "gpu"}]);
                pod["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimName": self.claim_name(i)}]);
            }
            Workload::Gang(_) => {
                pod["metadata"]["labels"][GROUP_LABEL] = json!(self.group_name(member.unit));
            }
            Workload::AntiAffinity => {
                let set = format!("s-{}", member.unit / self.nodes.max(1));
                pod["metadata"]["labels"][SPREAD_LABEL] = json!(set);
                pod["spec"]["affinity"] = json!({"podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [{
                        "labelSelector": {"matchLabels": {SPREAD_LABEL: set, RUN_LABEL: self.run}},
                        "topologyKey": "kubernetes.io/hostname"
                    }]
                }});
            }
        }
        pod
    }

    /// Filler pod `i` of a preemption run (low priority; evicted by the measured pods).
    pub fn filler(&self, i: usize) -> Value {
        let mut pod = self.base(&self.filler_name(i), "filler");
        pod["spec"]["priorityClassName"] = json!(LOW_PRIORITY);
        pod
    }

    /// The name of measured pod `i`'s ResourceClaim (a DRA pod).
    pub fn claim_name(&self, i: usize) -> String {
        format!("{}-gpu", self.name(i))
    }

    /// Measured pod `i`'s ResourceClaim: its GPUs of the bench's class, of the bench's model.
    pub fn claim(&self, i: usize) -> Value {
        let model = format!("device.attributes[\"{DRA_DRIVER}\"].model == \"{DRA_MODEL}\"");
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": self.claim_name(i), "labels": {RUN_LABEL: self.run}},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRA_DRIVER, "count": self.gpus,
                "selectors": [{"cel": {"expression": model}}]
            }}]}}
        })
    }

    /// The name of gang `g`.
    pub fn group_name(&self, g: usize) -> String {
        format!("{}-g{g}", self.run)
    }

    /// Gang `g`'s PodGroup (wasmsched's CRD).
    pub fn group(&self, g: usize, members: u32) -> Value {
        json!({
            "apiVersion": "scheduling.wasmsched.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": self.group_name(g), "labels": {RUN_LABEL: self.run}},
            "spec": {"minMember": members}
        })
    }

    fn base(&self, name: &str, role: &str) -> Value {
        let mut resources = json!({"cpu": "100m", "memory": "256Mi"});
        if self.gpus > 0 {
            resources[GPU_RESOURCE] = json!(self.gpus.to_string());
        }
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {RUN_LABEL: self.run, ROLE_LABEL: role}},
            "spec": {
                "schedulerName": self.scheduler,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "work", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"requests": resources.clone(), "limits": resources}}]
            }
        })
    }
}

/// The DeviceClass of the fake nodes' DRA GPUs.
pub fn device_class() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": DRA_DRIVER},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRA_DRIVER}\"")}}]}
    })
}

/// Fake node `i`'s GPUs as one ResourceSlice of its own pool.
pub fn resource_slice(i: usize, gpus: u32) -> Value {
    let node = node_name(i);
    let devices: Vec<Value> = (0..gpus)
        .map(|g| {
            json!({"name": format!("gpu-{g}"),
                   "attributes": {"model": {"string": DRA_MODEL}, "index": {"int": g}},
                   "capacity": {"memory": {"value": "80Gi"}}})
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-gpus"), "labels": {NODE_LABEL: "true"}},
        "spec": {"driver": DRA_DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}
    })
}

/// The two priority classes of a preemption run.
pub fn priority_classes() -> [Value; 2] {
    let class = |name: &str, value: i32| {
        json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
               "metadata": {"name": name}, "value": value, "preemptionPolicy": "PreemptLowerPriority",
               "description": "wasmsched cluster-bench"})
    };
    [class(LOW_PRIORITY, 1000), class(HIGH_PRIORITY, 100_000)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(workload: impl Into<Mix>) -> PodShape<'static> {
        let workload = Box::leak(Box::new(workload.into()));
        PodShape { run: "r1", scheduler: "wasmsched", gpus: 2, workload, nodes: 3 }
    }

    #[test]
    fn workloads_parse_back_from_their_names_and_bad_ones_say_what_is_allowed() {
        for w in [Workload::Plain, Workload::Gang(8), Workload::AntiAffinity, Workload::Preempt, Workload::Dra] {
            assert_eq!(Workload::parse(&w.name()), Ok(w));
        }
        assert!(Workload::parse("gang:1").unwrap_err().contains("2 or more"));
        assert!(Workload::parse("gang:x").unwrap_err().contains("2 or more"));
        assert!(Workload::parse("spread").unwrap_err().contains("plain, gang:N"));
    }

    #[test]
    fn a_mix_deals_one_unit_of_each_workload_per_round() {
        let mix = Mix::parse("plain, gang:3,anti-affinity,gang:3").unwrap();
        assert_eq!(mix.name(), "plain,gang:3,anti-affinity,gang:3");
        assert_eq!(mix.round(), 8);
        let kinds: Vec<_> = (0..9).map(|i| mix.member(i)).collect();
        assert_eq!(kinds[0], Member { workload: Workload::Plain, unit: 0 });
        assert_eq!(kinds[1], Member { workload: Workload::Gang(3), unit: 0 });
        assert_eq!(kinds[3], Member { workload: Workload::Gang(3), unit: 0 });
        assert_eq!(kinds[4], Member { workload: Workload::AntiAffinity, unit: 0 });
        assert_eq!(kinds[5], Member { workload: Workload::Gang(3), unit: 1 });
        assert_eq!(kinds[7], Member { workload: Workload::Gang(3), unit: 1 });
        assert_eq!(kinds[8], Member { workload: Workload::Plain, unit: 1 });
        assert_eq!(mix.member(9), Member { workload: Workload::Gang(3), unit: 2 });
        assert_eq!(mix.member(13), Member { workload: Workload::Gang(3), unit: 3 });
        assert_eq!(mix.gangs(16), vec![(0, 3), (1, 3), (2, 3), (3, 3)]);
        assert!(!mix.preempts() && mix.has_gangs());
        assert!(Mix::parse("plain,spread").unwrap_err().contains("unknown workload"));
        assert!(Mix::parse("").is_err());
    }

    #[test]
    fn with_preemption_in_the_mix_every_measured_pod_outranks_the_fillers() {
        let s = shape(Mix::parse("gang:2,preempt").unwrap());
        let group = |i: usize| s.measured(i)["metadata"]["labels"][GROUP_LABEL].clone();
        for i in 0..6 {
            assert_eq!(s.measured(i)["spec"]["priorityClassName"], HIGH_PRIORITY, "pod {i}");
        }
        assert_eq!(
            (group(0), group(1), group(2), group(3)),
            (json!("r1-g0"), json!("r1-g0"), Value::Null, json!("r1-g1"))
        );
        assert!(shape(Workload::Gang(2)).measured(0)["spec"]["priorityClassName"].is_null());
    }

    #[test]
    fn a_pod_asks_its_gpus_of_its_scheduler_under_the_run_s_labels() {
        let pod = shape(Workload::Plain).measured(4);
        assert_eq!(pod["metadata"]["name"], "r1-4");
        assert_eq!(pod["metadata"]["labels"][RUN_LABEL], "r1");
        assert_eq!(pod["metadata"]["labels"][ROLE_LABEL], "measured");
        assert_eq!(pod["spec"]["schedulerName"], "wasmsched");
        assert_eq!(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "2");
        assert!(pod["spec"]["affinity"].is_null());
    }

    #[test]
    fn gang_members_name_their_group_in_runs_of_its_size() {
        let s = shape(Workload::Gang(4));
        let groups: Vec<_> = (0..9).map(|i| s.measured(i)["metadata"]["labels"][GROUP_LABEL].clone()).collect();
        assert_eq!(groups[0], "r1-g0");
        assert_eq!(groups[3], "r1-g0");
        assert_eq!(groups[4], "r1-g1");
        assert_eq!(groups[8], "r1-g2");
        assert_eq!(s.group(1, 4)["spec"]["minMember"], 4);
    }

    #[test]
    fn an_anti_affinity_set_is_as_large_as_the_cluster_has_nodes() {
        let s = shape(Workload::AntiAffinity);
        let set = |i| s.measured(i)["metadata"]["labels"][SPREAD_LABEL].clone();
        assert_eq!((set(0), set(2), set(3)), (json!("s-0"), json!("s-0"), json!("s-1")));
        let term =
            &s.measured(3)["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
        assert_eq!(term["labelSelector"]["matchLabels"][SPREAD_LABEL], "s-1");
        assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    }

    #[test]
    fn preemptors_outrank_the_fillers() {
        let s = shape(Workload::Preempt);
        assert_eq!(s.measured(0)["spec"]["priorityClassName"], HIGH_PRIORITY);
        assert_eq!(s.filler(0)["spec"]["priorityClassName"], LOW_PRIORITY);
        assert_eq!(s.filler(0)["metadata"]["labels"][ROLE_LABEL], "filler");
        let [low, high] = priority_classes();
        assert!(high["value"].as_i64() > low["value"].as_i64());
    }

    #[test]
    fn a_dra_pod_asks_its_gpus_through_its_own_claim_of_the_bench_s_model() {
        let s = shape(Workload::Dra);
        let pod = s.measured(3);
        let resources = &pod["spec"]["containers"][0]["resources"];
        assert!(resources["limits"].get(GPU_RESOURCE).is_none() && resources["requests"].get(GPU_RESOURCE).is_none());
        assert_eq!(resources["claims"][0]["name"], "gpu");
        assert_eq!(pod["spec"]["resourceClaims"][0], json!({"name": "gpu", "resourceClaimName": "r1-3-gpu"}));
        let claim = s.claim(3);
        assert_eq!(claim["metadata"]["name"], "r1-3-gpu");
        let request = &claim["spec"]["devices"]["requests"][0]["exactly"];
        assert_eq!((request["deviceClassName"].clone(), request["count"].clone()), (json!(DRA_DRIVER), json!(2)));
        assert!(request["selectors"][0]["cel"]["expression"].as_str().unwrap().contains("model == \"H100\""));
        let slice = resource_slice(4, 8);
        assert_eq!(slice["spec"]["nodeName"], "bench-node-4");
        assert_eq!(slice["spec"]["devices"].as_array().unwrap().len(), 8);
        assert_eq!(slice["spec"]["devices"][7]["attributes"]["model"]["string"], DRA_MODEL);
        assert_eq!(device_class()["metadata"]["name"], DRA_DRIVER);
    }

    #[test]
    fn a_fake_node_is_ready_with_its_gpus() {
        let s = node_status(8);
        assert_eq!(s["status"]["allocatable"]["nvidia.com/gpu"], "8");
        assert_eq!(s["status"]["conditions"][0]["type"], "Ready");
        assert_eq!(s["status"]["conditions"][0]["status"], "True");
        assert_eq!(node(3)["metadata"]["labels"][NODE_LABEL], "true");
    }
}
