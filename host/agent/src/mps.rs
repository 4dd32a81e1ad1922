//! The NVIDIA MPS control daemons that hold share pods to their shares.
//!
//! A share container's limits (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`,
//! `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`) are read by the CUDA driver when the process connects to an
//! MPS control daemon; without one they are only words in the environment. So the agent runs one
//! control daemon per GPU that holds shares — started before the first share's container starts
//! (in `Allocate`), kept while a pod holds or waits for a share of that GPU and quit after
//! ([`MpsDaemons::reconcile`]) so a GPU given whole afterwards is not behind MPS.
//!
//! Each daemon sees only its GPU (`CUDA_VISIBLE_DEVICES=<uuid>`, so ordinal 0 in the share's
//! memory limit is that GPU) and has its own pipe directory `<dir>/<uuid>`, which share containers
//! get mounted; its logs go to `<dir>/log/<uuid>`, which they do not. The daemon's MPS server
//! keeps its shared memory in the agent's `/dev/shm`; share containers get the host directory
//! behind it (`--mps-shm`) as theirs, so client and server meet.
//!
//! The daemon forks into the background (`-d`) and writes its pid in its pipe directory, so an
//! agent that restarts finds the daemons it started still running (same container) or gone
//! (container restarted: the reconcile starts them again for GPUs with shares).

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::decisions::Decisions;
use crate::device_plugin::NodeGpus;

/// The control daemon's pid file in its pipe directory.
const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// How long a daemon gets to write its pid file, or to go after `quit`.
const SETTLE: Duration = Duration::from_secs(5);

/// Why a daemon could not be started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    /// The control program could not be run.
    #[error("cannot run {program} (NVIDIA's MPS control, from the driver's compute utilities): {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// It ran and failed, or never wrote its pid.
    #[error("the MPS control daemon for {gpu} {what}")]
    Daemon {
        /// The GPU's UUID.
        gpu: String,
        /// What went wrong, with the program's own words.
        what: String,
    },
    /// Its directories could not be made.
    #[error("creating {path}: {source}")]
    Dir {
        /// The directory.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

/// The control daemons of one node.
#[derive(Debug)]
pub struct MpsDaemons {
    control: PathBuf,
    dir: PathBuf,
    shm: PathBuf,
    /// Starts and stops one at a time: `Allocate` starting a GPU's daemon and the upkeep quitting
    /// it must not cross (a second daemon on one pipe directory, or a quit after a start).
    changing: std::sync::Mutex<()>,
}

impl MpsDaemons {
    /// Daemons run with the control program `control` (`nvidia-cuda-mps-control`), one pipe
    /// directory per GPU under `dir`; `shm` is the host directory that is the daemons' `/dev/shm`.
    pub fn new(control: impl Into<PathBuf>, dir: impl Into<PathBuf>, shm: impl Into<PathBuf>) -> MpsDaemons {
        MpsDaemons { control: control.into(), dir: dir.into(), shm: shm.into(), changing: Default::default() }
    }

    /// The pipe directory of `gpu`'s daemon, as the host sees it.
    pub fn pipe_dir(&self, gpu: &str) -> PathBuf {
        self.dir.join(gpu)
    }

    /// The host directory that is the daemons' `/dev/shm`.
    pub fn shm_dir(&self) -> &Path {
        &self.shm
    }

    /// The pid of `gpu`'s daemon, if it runs.
    pub fn running(&self, gpu: &str) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.pipe_dir(gpu).join(PID_FILE)).ok()?.trim().parse().ok()?;
        alive(pid).then_some(pid)
    }

    /// Starts `gpu`'s daemon unless it runs; returns once it has written its pid.
    pub fn ensure(&self, gpu: &str) -> Result<u32, MpsError> {
        let _one_at_a_time = self.changing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.start(gpu)
    }

    fn start(&self, gpu: &str) -> Result<u32, MpsError> {
        if let Some(pid) = self.running(gpu) {
            return Ok(pid);
        }
        let pipes = self.pipe_dir(gpu);
        let logs = self.dir.join("log").join(gpu);
        for dir in [&pipes, &logs] {
            std::fs::create_dir_all(dir).map_err(|source| MpsError::Dir { path: dir.display().to_string(), source })?;
        }
        // A pid file left by a daemon that died with its container names nobody now.
        let _ = std::fs::remove_file(pipes.join(PID_FILE));
        let out = Command::new(&self.control)
            .arg("-d")
            .env("CUDA_VISIBLE_DEVICES", gpu)
            .env("CUDA_MPS_PIPE_DIRECTORY", &pipes)
            .env("CUDA_MPS_LOG_DIRECTORY", &logs)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| self.spawn_error(source))?;
        if !out.status.success() {
            return Err(MpsError::Daemon {
                gpu: gpu.into(),
                what: format!("did not start ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim()),
            });
        }
        let Some(pid) = settled(|| self.running(gpu)) else {
            let what = format!("wrote no pid in {} within {SETTLE:?} (its log: {})", pipes.display(), logs.display());
            return Err(MpsError::Daemon { gpu: gpu.into(), what });
        };
        tracing::info!(gpu, pid, pipes = %pipes.display(), "MPS control daemon started");
        Ok(pid)
    }

    fn spawn_error(&self, source: std::io::Error) -> MpsError {
        MpsError::Spawn { program: self.control.display().to_string(), source }
    }

    /// Asks `gpu`'s daemon to quit (its servers end with it) and waits until it is gone.
    pub fn quit(&self, gpu: &str) -> Result<(), MpsError> {
        let _one_at_a_time = self.changing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.stop(gpu)
    }

    fn stop(&self, gpu: &str) -> Result<(), MpsError> {
        if self.running(gpu).is_none() {
            // Gone already; its pid file, if left, names nobody.
            let _ = std::fs::remove_file(self.pipe_dir(gpu).join(PID_FILE));
            return Ok(());
        }
        let mut child = Command::new(&self.control)
            .env("CUDA_MPS_PIPE_DIRECTORY", self.pipe_dir(gpu))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| self.spawn_error(source))?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(b"quit\n");
        }
        let out = child.wait_with_output().map_err(|source| self.spawn_error(source))?;
        if settled(|| self.running(gpu).is_none().then_some(())).is_none() {
            let why = String::from_utf8_lossy(&out.stderr);
            let what = format!("is still running {SETTLE:?} after quit ({}): {}", out.status, why.trim());
            return Err(MpsError::Daemon { gpu: gpu.into(), what });
        }
        tracing::info!(gpu, "MPS control daemon quit: no share of its GPU is left");
        Ok(())
    }

    /// Daemons for exactly the GPUs in `wanted`: one is started for each that has none (a GPU
    /// whose share pods run without their server — the daemon died, or ended with the agent's
    /// container — gets it back), and the others (found by the pid files in their pipe
    /// directories) are quit.
    ///
    /// `wanted` is asked once the daemons are held still, so a share decided meanwhile (whose
    /// `Allocate` may have found its daemon running) is counted and its daemon kept.
    pub fn reconcile(&self, wanted: impl FnOnce() -> BTreeSet<String>) {
        let _one_at_a_time = self.changing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let wanted = &wanted();
        let mut running = BTreeSet::new();
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for entry in entries.flatten() {
                if let Some(gpu) = entry.file_name().to_str()
                    && entry.path().join(PID_FILE).exists()
                {
                    running.insert(gpu.to_string());
                }
            }
        }
        for gpu in running.union(wanted) {
            let result = if !wanted.contains(gpu) {
                self.stop(gpu)
            } else if self.running(gpu).is_none() {
                tracing::warn!(gpu, "no MPS control daemon for a GPU with shares; starting it");
                self.start(gpu).map(drop)
            } else {
                Ok(())
            };
            if let Err(e) = result {
                tracing::error!(gpu, error = %e, "MPS control daemon");
            }
        }
    }
}

/// `f`'s answer once it has one, asked every 20 ms for [`SETTLE`] at most.
fn settled<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let started = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if started.elapsed() > SETTLE {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid` exists and has not ended. A daemon that quit stays a zombie until its
/// parent reaps it — in a container the agent is that parent (PID 1, the daemon's `-d` fork is
/// reparented to it) — so a zombie counts as gone.
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // `pid (comm) state …`; comm may hold spaces and parentheses, so the state follows the last `)`.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, None | Some('Z' | 'X'))
}

/// Every `every` until `stop`: daemons for exactly the GPUs with shares decided or held (a GPU
/// whose last share ended leaves MPS, so it can be given whole; a daemon that died comes back).
/// Nothing is quit before the pod watch has listed the node's pods: an agent that just restarted
/// knows no pod yet, and would otherwise end the daemons its running share pods use.
pub async fn keep(
    mps: Arc<MpsDaemons>,
    gpus: Arc<NodeGpus>,
    decisions: Arc<Decisions>,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        if decisions.listed() {
            let (mps, gpus, decisions) = (mps.clone(), gpus.clone(), decisions.clone());
            let wanted = move || {
                let by_index = decisions.share_gpus();
                gpus.gpus().into_iter().filter(|g| by_index.contains(&g.index)).map(|g| g.id).collect()
            };
            let _ = tokio::task::spawn_blocking(move || mps.reconcile(wanted)).await;
        }
        let pause = if decisions.listed() { every } else { every.min(Duration::from_millis(250)) };
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}
