//! `wasmsched-agent`: runs on every GPU node.

// A CLI prints its results; libraries log through `tracing`.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::mpsc::{RecvTimeoutError, channel};
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use wasmsched_agent::decisions::Decisions;
use wasmsched_agent::device_plugin::{Exposure, GpuShares, NodeGpus, WholeGpus};
use wasmsched_agent::mps::MpsDaemons;
use wasmsched_agent::{Agent, Source};
use wasmsched_events::cli::{Sink, finish};
use wasmsched_nvml::XidWatcher;
use wasmsched_topology::annotation;

/// wasmsched node agent: discovers GPUs and their topology, writes them for the scheduler, and
/// publishes inventory and health changes.
#[derive(Parser)]
#[command(name = "wasmsched-agent", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Discover once and print what would be written on the node.
    Discover {
        /// Read `nvidia-smi topo -m` output from this file instead of asking NVML.
        #[arg(long, value_name = "FILE")]
        smi: Option<PathBuf>,
        #[command(flatten)]
        vendor: VendorArgs,
        /// Print the raw NVML inventory (NVML only).
        #[arg(long, conflicts_with_all = ["smi", "amd_smi", "amd_smi_text", "neuron_ls", "neuron_ls_text", "npu_smi", "npu_smi_text"])]
        inventory: bool,
    },
    /// Keep the node's report current.
    Run(Box<RunArgs>),
}

#[derive(clap::Args)]
struct RunArgs {
    /// This node's name (Kubernetes: the downward API's `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    node: String,
    /// Read `nvidia-smi topo -m` output from this file instead of asking NVML.
    #[arg(long, value_name = "FILE")]
    smi: Option<PathBuf>,
    #[command(flatten)]
    vendor: VendorArgs,
    /// Read a recorded NVML inventory (`discover --inventory`) instead of asking NVML: stand-in
    /// devices on a machine without GPUs (tests, trying the device plugin with a real kubelet).
    #[arg(long, value_name = "FILE", conflicts_with = "smi")]
    inventory: Option<PathBuf>,
    /// Serve the GPUs to the kubelet as its device plugin (`nvidia.com/gpu` and
    /// `wasmsched.io/gpu-milli`), giving each pod exactly the GPUs the scheduler chose: watches
    /// this node's pods (needs `list` and `watch` on pods). Replaces NVIDIA's device plugin.
    #[arg(long, conflicts_with_all = ["amd_smi", "amd_smi_text", "neuron_ls", "neuron_ls_text", "npu_smi", "npu_smi_text"])]
    device_plugin: bool,
    /// The kubelet's device-plugin directory (its `kubelet.sock`).
    #[arg(long, value_name = "DIR", default_value = wasmsched_deviceplugin::DEFAULT_DIR)]
    device_plugin_dir: PathBuf,
    /// Serve the device plugin's `/metrics` here (GPUs by health, the kubelet's calls by
    /// outcome), e.g. `0.0.0.0:10261`.
    #[arg(long, value_name = "ADDR", requires = "device_plugin")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// How containers get their GPUs: `env` (NVIDIA_VISIBLE_DEVICES, for the NVIDIA container
    /// toolkit's hook) or `cdi` (CDI device names).
    #[arg(long, value_enum, default_value_t = Exposure::Env)]
    exposure: Exposure,
    /// Run an NVIDIA MPS control daemon for each GPU that holds shares, with its pipes in
    /// `DIR/<uuid>` (mounted into the GPU's share containers) so their limits are enforced.
    /// Without it a share's limits are only in its environment.
    #[arg(long, value_name = "DIR")]
    mps_dir: Option<PathBuf>,
    /// The MPS control program.
    #[arg(long, value_name = "PROGRAM", default_value = "nvidia-cuda-mps-control", requires = "mps_dir")]
    mps_control: PathBuf,
    /// The host directory that is this agent's `/dev/shm`, where the MPS servers keep their
    /// shared memory; mounted as share containers' `/dev/shm` (the chart mounts `<mpsDir>/shm`).
    #[arg(long, value_name = "DIR", default_value = "/dev/shm", requires = "mps_dir")]
    mps_shm: PathBuf,
    /// Seconds between discoveries.
    #[arg(long, default_value_t = 60)]
    interval: u64,
    /// Write `annotations.json` and `labels.json` here whenever they change.
    #[arg(long, value_name = "DIR")]
    write: Option<PathBuf>,
    /// Write the report on this node's Kubernetes Node object (kubeconfig or in-cluster
    /// credentials; needs `get` and `patch` on nodes).
    #[arg(long)]
    patch_node: bool,
    /// Discover and publish once, then exit.
    #[arg(long)]
    once: bool,
    #[command(flatten)]
    sink: Sink,
}

fn main() -> ExitCode {
    wasmsched_events::cli::end_on_panic();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("WASMSCHED_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // Colours only on a terminal: log files and `kubectl logs` get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match Cli::parse().command {
        Command::Discover { smi, vendor, inventory } => discover(smi, &vendor, inventory),
        Command::Run(args) => run(*args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", wasmsched_events::cli::error_line(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// A node of another vendor's devices: its topology from the vendor's tool instead of NVML
/// (health and the device plugin are the vendor's operator's there).
#[derive(clap::Args)]
#[group(multiple = false)]
struct VendorArgs {
    /// AMD GPUs: ask this program (`amd-smi`) for the node's `topology` on every discovery.
    #[arg(long, value_name = "PROGRAM", conflicts_with = "smi")]
    amd_smi: Option<PathBuf>,
    /// AMD GPUs: read `rocm-smi --showtopo` or `amd-smi topology` output from this file.
    #[arg(long, value_name = "FILE", conflicts_with = "smi")]
    amd_smi_text: Option<PathBuf>,
    /// AWS Inferentia or Trainium: ask this program (`neuron-ls`) for the devices and their
    /// NeuronLinks on every discovery.
    #[arg(long, value_name = "PROGRAM", conflicts_with = "smi")]
    neuron_ls: Option<PathBuf>,
    /// AWS Inferentia or Trainium: read `neuron-ls` output from this file.
    #[arg(long, value_name = "FILE", conflicts_with = "smi")]
    neuron_ls_text: Option<PathBuf>,
    /// Huawei Ascend: ask this program (`npu-smi`) for `info -t topo` on every discovery.
    #[arg(long, value_name = "PROGRAM", conflicts_with = "smi")]
    npu_smi: Option<PathBuf>,
    /// Huawei Ascend: read `npu-smi info -t topo` output from this file.
    #[arg(long, value_name = "FILE", conflicts_with = "smi")]
    npu_smi_text: Option<PathBuf>,
}

fn source(smi: Option<PathBuf>, vendor: &VendorArgs) -> Source {
    use wasmsched_agent::VendorTool::{AmdSmi, NeuronLs, NpuSmi};
    if let Some(path) = smi {
        return Source::Smi(path);
    }
    let programs = [(AmdSmi, &vendor.amd_smi), (NeuronLs, &vendor.neuron_ls), (NpuSmi, &vendor.npu_smi)];
    let texts = [(AmdSmi, &vendor.amd_smi_text), (NeuronLs, &vendor.neuron_ls_text), (NpuSmi, &vendor.npu_smi_text)];
    if let Some((tool, Some(program))) = programs.into_iter().find(|(_, p)| p.is_some()) {
        return Source::VendorProgram(tool, program.clone());
    }
    if let Some((tool, Some(path))) = texts.into_iter().find(|(_, p)| p.is_some()) {
        return Source::VendorText(tool, path.clone());
    }
    Source::Nvml
}

/// What wakes the agent between discoveries.
enum Wake {
    /// An XID event from NVML.
    Xid(wasmsched_nvml::XidEvent),
    /// A device plugin stopped for good (e.g. the kubelet refused its registration): the agent
    /// ends with an error, so the DaemonSet shows it instead of a node silently without GPUs.
    PluginFailed(anyhow::Error),
}

/// The device plugin's side of the agent: both resources served on their own runtime, the watch
/// of this node's pods that feeds the decisions, and the MPS daemons' upkeep.
struct DevicePlugin {
    runtime: tokio::runtime::Runtime,
    gpus: Arc<NodeGpus>,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl DevicePlugin {
    fn start(args: &RunArgs, wake: std::sync::mpsc::Sender<Wake>) -> anyhow::Result<DevicePlugin> {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        let client = runtime
            .block_on(kube::Client::try_default())
            .context("connecting to the Kubernetes API (the device plugin watches this node's pods)")?;
        let gpus = Arc::new(NodeGpus::default());
        let decisions = Arc::new(Decisions::new(&args.node));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let whole: Arc<dyn wasmsched_deviceplugin::Resource> =
            Arc::new(WholeGpus { gpus: gpus.clone(), decisions: decisions.clone(), exposure: args.exposure });
        let mps = args.mps_dir.as_ref().map(|dir| Arc::new(MpsDaemons::new(&args.mps_control, dir, &args.mps_shm)));
        let shares: Arc<dyn wasmsched_deviceplugin::Resource> = Arc::new(GpuShares {
            gpus: gpus.clone(),
            decisions: decisions.clone(),
            exposure: args.exposure,
            mps: mps.clone(),
        });
        let mut tasks = Vec::new();
        for resource in [whole, shares] {
            let dir = args.device_plugin_dir.clone();
            let stopped = stopped.clone();
            let wake = wake.clone();
            tasks.push(runtime.spawn(async move {
                let name = resource.name().to_string();
                let served = wasmsched_deviceplugin::Served::new();
                if let Err(e) = wasmsched_deviceplugin::serve(resource, dir, stopped, served).await {
                    let _ = wake
                        .send(Wake::PluginFailed(anyhow::Error::new(e).context(format!("device plugin for {name}"))));
                }
            }));
        }
        if let Some(mps) = mps {
            tasks.push(runtime.spawn(wasmsched_agent::mps::keep(
                mps,
                gpus.clone(),
                decisions.clone(),
                Duration::from_secs(5),
                stopped.clone(),
            )));
        }
        tasks.push(runtime.spawn(watch_pods(client, args.node.clone(), decisions, stopped)));
        if let Some(addr) = args.metrics_addr {
            let listener = runtime
                .block_on(tokio::net::TcpListener::bind(addr))
                .with_context(|| format!("listening on {addr} for /metrics"))?;
            // Not joined at stop: it ends with the runtime.
            runtime.spawn(wasmsched_agent::metrics::serve(listener, gpus.clone()));
        }
        Ok(DevicePlugin { runtime, gpus, stop, tasks })
    }

    fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = self.runtime.block_on(task);
        }
    }
}

/// Follows this node's pods into `decisions` until `stop`.
async fn watch_pods(
    client: kube::Client,
    node: String,
    decisions: Arc<Decisions>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    use futures_util::StreamExt;
    use kube::runtime::watcher::{self, Event};
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut events = std::pin::pin!(watcher::watcher(pods, config));
    let mut listed = std::collections::BTreeSet::new();
    loop {
        let event = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            event = events.next() => event,
        };
        match event {
            Some(Ok(Event::Apply(pod))) => decisions.apply(&pod),
            Some(Ok(Event::Delete(pod))) => decisions.delete(pod.metadata.uid.as_deref().unwrap_or_default()),
            Some(Ok(Event::Init)) => listed.clear(),
            Some(Ok(Event::InitApply(pod))) => {
                listed.extend(pod.metadata.uid.clone());
                decisions.apply(&pod);
            }
            Some(Ok(Event::InitDone)) => decisions.retain(&std::mem::take(&mut listed)),
            // The watcher retries by itself; say why it had to.
            Some(Err(e)) => {
                tracing::warn!(error = %e, "watching this node's pods");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            None => return,
        }
    }
}

fn discover(smi: Option<PathBuf>, vendor: &VendorArgs, inventory: bool) -> anyhow::Result<()> {
    let found = source(smi, vendor).discover().context("discovery")?;
    if inventory {
        let inventory = found.inventory.context("no NVML inventory")?;
        println!("{}", serde_json::to_string_pretty(&inventory)?);
        return Ok(());
    }
    let doc = serde_json::json!({
        "driver": found.driver,
        "annotations": {annotation::TOPOLOGY_ANNOTATION: serde_json::from_str::<serde_json::Value>(&annotation::to_annotation(&found.topology))?},
        "labels": annotation::labels(&found.topology),
    });
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let source = match &args.inventory {
        Some(path) => Source::Recorded(path.clone()),
        None => source(args.smi.clone(), &args.vendor),
    };
    let uses_nvml = matches!(source, Source::Nvml);
    // Kept here too, so the channel never closes: waiting on it is the wait between discoveries.
    let (wake_tx, wake_rx) = channel();
    let device_plugin =
        if args.device_plugin && !args.once { Some(DevicePlugin::start(&args, wake_tx.clone())?) } else { None };
    let sink = args.sink.open("agent")?;
    let grace = args.sink.grace();
    let mut agent = Agent::new(&args.node, sink);
    // Health needs NVML; without it the agent still reports the topology.
    let _watcher = if uses_nvml && !args.once {
        let (xid_tx, xid_rx) = channel();
        let wake = wake_tx.clone();
        std::thread::spawn(move || {
            for event in xid_rx {
                if wake.send(Wake::Xid(event)).is_err() {
                    return;
                }
            }
        });
        XidWatcher::spawn(xid_tx).map_err(|e| tracing::warn!(error = %e, "no XID health watching")).ok()
    } else {
        None
    };
    let mut failed = None;
    let interval = Duration::from_secs(args.interval.max(1));
    let mut node_object = if args.patch_node { Some(NodeObject::connect()?) } else { None };
    loop {
        // A report the API server did not take yet is retried every round.
        if let Some(o) = node_object.as_mut() {
            o.flush(&args.node);
        }
        match source.discover() {
            Ok(found) => {
                if let Some(plugin) = &device_plugin {
                    plugin.gpus.set(found.gpu_devices(&agent.unhealthy()));
                }
                if let Some(report) = agent.observe(found) {
                    tracing::info!(node = %args.node, labels = report.labels.len(), "inventory changed");
                    deliver(report, &args, node_object.as_mut())?;
                }
            }
            // A failing discovery keeps the last good report: the node did not lose its GPUs
            // because one NVML call failed.
            Err(e) if !args.once => {
                tracing::error!(error = %format!("{e:#}"), "discovery failed; keeping the last report")
            }
            Err(e) => return Err(anyhow::Error::new(e).context("discovery")),
        }
        // GPUs an operator took out of service (or put back) since the last round.
        if let Some(gpus) = node_object.as_ref().and_then(|o| o.out_of_service(&args.node))
            && let Some(report) = agent.set_out_of_service(gpus)
        {
            tracing::info!(node = %args.node, unhealthy = ?agent.unhealthy(), "GPUs out of service changed");
            if let Some(plugin) = &device_plugin {
                plugin.gpus.set_health(&agent.unhealthy());
            }
            deliver(report, &args, node_object.as_mut())?;
        }
        if args.once {
            break;
        }
        match wake_rx.recv_timeout(interval) {
            Ok(Wake::PluginFailed(e)) => {
                failed = Some(e);
                break;
            }
            Ok(Wake::Xid(event)) => {
                let changed = agent.on_xid(&event);
                if let Some(plugin) = &device_plugin {
                    plugin.gpus.set_health(&agent.unhealthy());
                }
                if let Some(report) = changed {
                    deliver(report, &args, node_object.as_mut())?;
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            // The agent holds a sender itself.
            Err(RecvTimeoutError::Disconnected) => unreachable!("the agent holds a sender"),
        }
    }
    if let Some(plugin) = device_plugin {
        plugin.stop();
    }
    let stats = finish(agent.into_sink(), grace);
    if let Some(stats) = &stats {
        tracing::info!(delivered = stats.delivered, dropped = stats.dropped, "events closed");
    }
    if let Some(e) = failed {
        return Err(e);
    }
    Ok(wasmsched_events::cli::delivered(stats.as_ref())?)
}

/// Writes a changed report where the agent was told to: `--write DIR` and the Node object.
fn deliver(
    report: wasmsched_agent::NodeReport,
    args: &RunArgs,
    node_object: Option<&mut NodeObject>,
) -> anyhow::Result<()> {
    if let Some(dir) = &args.write {
        report.write(dir)?;
    }
    if let Some(o) = node_object {
        o.pending = Some(report);
        o.flush(&args.node);
    }
    Ok(())
}

/// The Kubernetes Node object the agent writes its report on.
struct NodeObject {
    runtime: tokio::runtime::Runtime,
    client: kube::Client,
    pending: Option<wasmsched_agent::NodeReport>,
}

impl NodeObject {
    fn connect() -> anyhow::Result<NodeObject> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let client = runtime
            .block_on(kube::Client::try_default())
            .context("connecting to the Kubernetes API (kubeconfig or in-cluster)")?;
        Ok(NodeObject { runtime, client, pending: None })
    }

    /// The node's out-of-service GPUs now; None when they could not be read (said in the log:
    /// the agent keeps what it had).
    fn out_of_service(&self, node: &str) -> Option<std::collections::BTreeSet<u32>> {
        match self.runtime.block_on(wasmsched_agent::node_object::out_of_service(&self.client, node)) {
            Ok(gpus) => Some(gpus),
            Err(e) => {
                tracing::warn!(node, error = %format!("{e:#}"), "could not read the GPUs out of service; keeping the last");
                None
            }
        }
    }

    fn flush(&mut self, node: &str) {
        let Some(report) = &self.pending else { return };
        match self.runtime.block_on(wasmsched_agent::node_object::write(&self.client, node, report)) {
            Ok(changed) => {
                tracing::info!(node, changed, "node object up to date");
                self.pending = None;
            }
            Err(e) => tracing::warn!(node, error = %format!("{e:#}"), "could not write the node object; will retry"),
        }
    }
}
