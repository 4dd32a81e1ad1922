//! The node's GPUs served to the kubelet, so that containers get exactly what the scheduler chose.
//!
//! Two extended resources, each a [`wasmsched_deviceplugin::Resource`]:
//!
//! - [`WHOLE_RESOURCE`] (`nvidia.com/gpu`, the name pods already ask for): one device per GPU,
//!   its UUID as the device id and its NUMA node as topology, so the kubelet's Topology Manager
//!   and CPU manager can align CPUs with it. The preferred allocation is the scheduler's GPUs for
//!   the pod being admitted, so the kubelet's own accounting (PodResources) names the GPUs the
//!   annotation names; `Allocate` exposes exactly those ([`Exposure`]).
//! - [`SHARE_RESOURCE`] (`wasmsched.io/gpu-milli`): a share pod asks for its milli-GPUs as this
//!   resource (`limits: {wasmsched.io/gpu-milli: 500}`). Each GPU is 1000 devices, one per
//!   milli-GPU, so the kubelet itself can never admit more than a GPU's 1000 milli on it; the
//!   preferred allocation takes the units on the scheduler's GPU, and `Allocate` refuses units
//!   spread over GPUs, a share no decision names, or one over what the GPU has left beside its
//!   other holders. The share is enforced by NVIDIA MPS ([`share_response`]).
//!
//! Which decision a call is for is [`Decisions`]' job; a call no decision explains is refused.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;
use wasmsched_api::GPU_MILLI;
use wasmsched_deviceplugin::v1beta1::{CdiDevice, Mount, NumaNode, TopologyInfo};
use wasmsched_deviceplugin::{ContainerAllocateResponse, Device, HEALTHY, Refusal, Resource, UNHEALTHY};

use crate::decisions::Decisions;
use crate::mps::MpsDaemons;

/// Whole GPUs: the resource NVIDIA's device plugin serves, so pods need no change.
pub const WHOLE_RESOURCE: &str = "nvidia.com/gpu";
/// Shares of one GPU, in milli-GPUs.
pub const SHARE_RESOURCE: &str = "wasmsched.io/gpu-milli";
/// Where a share container finds the MPS control daemon's pipes.
pub const MPS_PIPE_IN_CONTAINER: &str = "/tmp/nvidia-mps";

/// One GPU as the device plugin serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuDevice {
    /// NVML index, as the scheduler's decisions name it.
    pub index: u32,
    /// The device id given to the kubelet and the runtime: the `GPU-…` UUID (`gpu-<index>` where
    /// the source knows none, e.g. `nvidia-smi topo -m` text).
    pub id: String,
    /// NUMA node.
    pub numa: Option<u32>,
    /// Memory in MiB, when known: a share's memory limit is its part of it.
    pub memory_mib: Option<u64>,
    /// Reported healthy: an unhealthy GPU is offered to nobody.
    pub healthy: bool,
}

/// How `Allocate` exposes GPUs to a container.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Exposure {
    /// `NVIDIA_VISIBLE_DEVICES=<uuid,…>`, which the NVIDIA container toolkit's runtime hook reads
    /// (the GPU Operator's default set-up): works wherever NVIDIA's own device plugin worked.
    #[default]
    Env,
    /// CDI device names (`nvidia.com/gpu=<uuid>`), for runtimes with CDI on and the toolkit's CDI
    /// specs generated (`nvidia-ctk cdi generate`): no environment variable to trust.
    Cdi,
}

/// The node's GPUs and the device lists derived from them.
pub struct NodeGpus {
    table: watch::Sender<Vec<GpuDevice>>,
    whole: watch::Sender<Vec<Device>>,
    units: watch::Sender<Vec<Device>>,
    /// The kubelet's calls answered, by resource, call and outcome (the agent's `/metrics`).
    calls: std::sync::Mutex<BTreeMap<CallKey, u64>>,
}

/// `(resource, call, result)`: `result` is `ok` or `refused`.
pub type CallKey = (&'static str, &'static str, &'static str);

impl Default for NodeGpus {
    fn default() -> Self {
        NodeGpus {
            table: watch::Sender::new(Vec::new()),
            whole: watch::Sender::new(Vec::new()),
            units: watch::Sender::new(Vec::new()),
            // Every call from zero, so the first refusal is an increase an alert sees.
            calls: std::sync::Mutex::new(
                [WHOLE_RESOURCE, SHARE_RESOURCE]
                    .into_iter()
                    .flat_map(|r| ["GetPreferredAllocation", "Allocate"].map(|c| (r, c)))
                    .flat_map(|(r, c)| ["ok", "refused"].map(|o| ((r, c, o), 0)))
                    .collect(),
            ),
        }
    }
}

impl NodeGpus {
    /// The GPUs now (a discovery, or a health change): the kubelet gets new lists when they differ.
    pub fn set(&self, gpus: Vec<GpuDevice>) {
        if *self.table.borrow() == gpus {
            return;
        }
        let topology = |g: &GpuDevice| g.numa.map(|n| TopologyInfo { nodes: vec![NumaNode { id: i64::from(n) }] });
        let health = |g: &GpuDevice| if g.healthy { HEALTHY } else { UNHEALTHY }.to_string();
        let whole =
            gpus.iter().map(|g| Device { id: g.id.clone(), health: health(g), topology: topology(g) }).collect();
        let units = gpus
            .iter()
            .flat_map(|g| {
                (0..GPU_MILLI).map(move |k| Device { id: unit_id(&g.id, k), health: health(g), topology: topology(g) })
            })
            .collect();
        self.table.send_replace(gpus);
        self.whole.send_replace(whole);
        self.units.send_replace(units);
    }

    /// Health changed (an XID): the GPUs in `unhealthy` are offered to nobody from now on.
    pub fn set_health(&self, unhealthy: &std::collections::BTreeSet<u32>) {
        let gpus = self.gpus().into_iter().map(|g| GpuDevice { healthy: !unhealthy.contains(&g.index), ..g });
        self.set(gpus.collect());
    }

    /// The GPUs now.
    pub fn gpus(&self) -> Vec<GpuDevice> {
        self.table.borrow().clone()
    }

    fn by_id(&self, id: &str) -> Option<GpuDevice> {
        self.table.borrow().iter().find(|g| g.id == id).cloned()
    }

    /// The kubelet's calls answered so far, by resource, call and outcome.
    pub fn calls(&self) -> BTreeMap<CallKey, u64> {
        self.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Counts the answer to the kubelet's `call` for `resource`, and passes it on.
    fn counted<T>(&self, resource: &'static str, call: &'static str, answer: Result<T, Refusal>) -> Result<T, Refusal> {
        let result = if answer.is_ok() { "ok" } else { "refused" };
        *self
            .calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry((resource, call, result))
            .or_default() += 1;
        answer
    }
}

fn unit_id(gpu: &str, k: u32) -> String {
    format!("{gpu}::{k}")
}

fn unit_gpu(unit: &str) -> Option<&str> {
    unit.rsplit_once("::").map(|(gpu, _)| gpu)
}

/// [`WHOLE_RESOURCE`].
pub struct WholeGpus {
    /// The node's GPUs.
    pub gpus: Arc<NodeGpus>,
    /// The scheduler's decisions for the node.
    pub decisions: Arc<Decisions>,
    /// How containers get their GPUs.
    pub exposure: Exposure,
}

impl Resource for WholeGpus {
    fn name(&self) -> &str {
        WHOLE_RESOURCE
    }

    fn devices(&self) -> watch::Receiver<Vec<Device>> {
        self.gpus.whole.subscribe()
    }

    fn preferred(&self, available: &[String], must_include: &[String], size: usize) -> Result<Vec<String>, Refusal> {
        self.gpus.counted(WHOLE_RESOURCE, "GetPreferredAllocation", self.prefer(available, must_include, size))
    }

    fn allocate(&self, devices: &[String]) -> Result<ContainerAllocateResponse, Refusal> {
        self.gpus.counted(WHOLE_RESOURCE, "Allocate", self.give(devices))
    }
}

impl WholeGpus {
    fn prefer(&self, available: &[String], must_include: &[String], size: usize) -> Result<Vec<String>, Refusal> {
        let table = self.gpus.gpus();
        let index = |id: &String| table.iter().find(|g| &g.id == id).map(|g| g.index);
        let available: Vec<u32> = available.iter().filter_map(index).collect();
        let must: Vec<u32> = must_include.iter().filter_map(index).collect();
        let pick = self.decisions.prefer_whole(&available, &must, size)?;
        Ok(pick.iter().filter_map(|i| table.iter().find(|g| g.index == *i).map(|g| g.id.clone())).collect())
    }

    fn give(&self, devices: &[String]) -> Result<ContainerAllocateResponse, Refusal> {
        let mut gpus = devices
            .iter()
            .map(|id| self.gpus.by_id(id).ok_or_else(|| Refusal(format!("wasmsched: no GPU {id} on this node"))))
            .collect::<Result<Vec<_>, _>>()?;
        // The kubelet passes them in no particular order; the container sees them by index.
        gpus.sort_by_key(|g| g.index);
        let indexes: Vec<u32> = gpus.iter().map(|g| g.index).collect();
        let pod = self.decisions.give_whole(&indexes)?;
        tracing::info!(pod = %pod.name, gpus = ?indexes, "whole GPUs allocated");
        Ok(whole_response(&gpus, self.exposure))
    }
}

/// What a container with whole GPUs gets.
pub fn whole_response(gpus: &[GpuDevice], exposure: Exposure) -> ContainerAllocateResponse {
    let mut response = ContainerAllocateResponse::default();
    let ids: Vec<&str> = gpus.iter().map(|g| g.id.as_str()).collect();
    let indexes: Vec<String> = gpus.iter().map(|g| g.index.to_string()).collect();
    match exposure {
        Exposure::Env => {
            response.envs.insert("NVIDIA_VISIBLE_DEVICES".into(), ids.join(","));
        }
        Exposure::Cdi => {
            response.cdi_devices = ids.iter().map(|id| CdiDevice { name: format!("nvidia.com/gpu={id}") }).collect();
        }
    }
    response.envs.insert("WASMSCHED_GPU_IDS".into(), indexes.join(","));
    response
}

/// [`SHARE_RESOURCE`].
pub struct GpuShares {
    /// The node's GPUs.
    pub gpus: Arc<NodeGpus>,
    /// The scheduler's decisions for the node.
    pub decisions: Arc<Decisions>,
    /// How containers get their GPU.
    pub exposure: Exposure,
    /// The MPS control daemons that enforce the shares; None: the limits are only in the
    /// environment (no daemon, no mount).
    pub mps: Option<Arc<MpsDaemons>>,
}

impl Resource for GpuShares {
    fn name(&self) -> &str {
        SHARE_RESOURCE
    }

    fn devices(&self) -> watch::Receiver<Vec<Device>> {
        self.gpus.units.subscribe()
    }

    fn preferred(&self, available: &[String], must_include: &[String], size: usize) -> Result<Vec<String>, Refusal> {
        self.gpus.counted(SHARE_RESOURCE, "GetPreferredAllocation", self.prefer(available, must_include, size))
    }

    fn allocate(&self, devices: &[String]) -> Result<ContainerAllocateResponse, Refusal> {
        self.gpus.counted(SHARE_RESOURCE, "Allocate", self.give(devices))
    }
}

impl GpuShares {
    fn prefer(&self, available: &[String], must_include: &[String], size: usize) -> Result<Vec<String>, Refusal> {
        let table = self.gpus.gpus();
        let mut free: BTreeMap<u32, usize> = BTreeMap::new();
        for unit in available {
            if let Some(g) = unit_gpu(unit).and_then(|id| table.iter().find(|g| g.id == id)) {
                *free.entry(g.index).or_default() += 1;
            }
        }
        let milli = u32::try_from(size).unwrap_or(u32::MAX);
        let gpu = self.decisions.prefer_share(&free, milli)?;
        let id = &table.iter().find(|g| g.index == gpu).expect("a GPU of the table").id;
        let on_gpu = |u: &&String| unit_gpu(u) == Some(id.as_str());
        let mut pick: Vec<String> = must_include.iter().filter(on_gpu).cloned().collect();
        pick.extend(
            available.iter().filter(on_gpu).filter(|u| !must_include.contains(u)).take(size - pick.len()).cloned(),
        );
        Ok(pick)
    }

    fn give(&self, devices: &[String]) -> Result<ContainerAllocateResponse, Refusal> {
        let gpus: std::collections::BTreeSet<&str> = devices.iter().filter_map(|u| unit_gpu(u)).collect();
        let [id] = gpus.into_iter().collect::<Vec<_>>()[..] else {
            return Err(Refusal(format!(
                "wasmsched: a share must be units of one GPU; the kubelet chose {} unit(s) over several GPUs",
                devices.len()
            )));
        };
        let gpu = self.gpus.by_id(id).ok_or_else(|| Refusal(format!("wasmsched: no GPU {id} on this node")))?;
        let milli = u32::try_from(devices.len()).unwrap_or(u32::MAX);
        let pod = self.decisions.give_share(gpu.index, milli)?;
        // The daemon runs before the container does, or the share is not enforced: refused then
        // (the pod fails admission and drops out of the decisions), never run unlimited.
        if let Some(mps) = &self.mps {
            mps.ensure(&gpu.id)
                .map_err(|e| Refusal(format!("wasmsched: {pod}'s share is not enforceable: {e}", pod = pod.name)))?;
        }
        tracing::info!(pod = %pod.name, gpu = gpu.index, milli, "GPU share allocated");
        Ok(share_response(&gpu, milli, self.exposure, self.mps.as_deref()))
    }
}

/// What a container with `milli` of `gpu` gets: the GPU, and the MPS limits that hold it to its
/// share — the active-thread percentage (its part of the SMs) and the pinned device-memory limit
/// (its part of the memory; ordinal 0, the one GPU the container sees), read by the CUDA driver
/// when the process connects to the MPS control daemon whose pipes are mounted at
/// [`MPS_PIPE_IN_CONTAINER`] (and whose server's shared memory is the container's `/dev/shm`).
pub fn share_response(
    gpu: &GpuDevice,
    milli: u32,
    exposure: Exposure,
    mps: Option<&MpsDaemons>,
) -> ContainerAllocateResponse {
    let mut response = whole_response(std::slice::from_ref(gpu), exposure);
    response.envs.insert("WASMSCHED_GPU_IDS".into(), format!("{}:{milli}", gpu.index));
    response.envs.insert("WASMSCHED_GPU_MILLI".into(), milli.to_string());
    // At least 1 %: MPS refuses 0.
    let percent = milli.div_ceil(10).max(1);
    response.envs.insert("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), percent.to_string());
    if let Some(total) = gpu.memory_mib {
        let limit = total * u64::from(milli) / u64::from(GPU_MILLI);
        response.envs.insert("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), format!("0={limit}M"));
    }
    if let Some(mps) = mps {
        response.envs.insert("CUDA_MPS_PIPE_DIRECTORY".into(), MPS_PIPE_IN_CONTAINER.into());
        response.mounts.push(Mount {
            container_path: MPS_PIPE_IN_CONTAINER.into(),
            host_path: mps.pipe_dir(&gpu.id).display().to_string(),
            read_only: false,
        });
        response.mounts.push(Mount {
            container_path: "/dev/shm".into(),
            host_path: mps.shm_dir().display().to_string(),
            read_only: false,
        });
    }
    response
}
