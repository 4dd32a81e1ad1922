//! The scheduler a run measures: one already running (found by its `schedulerName`), one the run
//! starts itself from a command line (so a batch can be waiting before it starts, and its process
//! is measured), or the trivial binder.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use kube::Client;

use crate::binder::{Binder, BinderConfig};
use crate::{Config, Error};

/// Who binds the run's pods.
#[derive(Clone, Debug)]
pub enum UnderTest {
    /// A scheduler already running; its process (for CPU and memory) when on this machine.
    Running {
        /// Its PID.
        pid: Option<u32>,
    },
    /// A scheduler this run starts with `sh -c 'exec LINE'` and kills at its end.
    Command {
        /// The command line.
        line: String,
        /// Where its standard output and error go (none: discarded).
        log: Option<PathBuf>,
    },
    /// The trivial binder, in this process.
    Binder(BinderConfig),
}

impl UnderTest {
    /// Whether the run decides when it starts (a batch can then be created before).
    pub fn started_by_the_run(&self) -> bool {
        !matches!(self, UnderTest::Running { .. })
    }
}

/// The scheduler while the run measures it.
pub struct Started {
    child: Option<Child>,
    binder: Option<Binder>,
    pid: Option<u32>,
}

impl Started {
    /// Starts what `config.under_test` names (nothing for one already running).
    pub fn start(client: &Client, config: &Config) -> Result<Started, Error> {
        match &config.under_test {
            UnderTest::Running { pid } => Ok(Started { child: None, binder: None, pid: *pid }),
            UnderTest::Binder(b) => {
                Ok(Started { child: None, binder: Some(Binder::start(client.clone(), config, *b)), pid: None })
            }
            UnderTest::Command { line, log } => {
                let (out, err) = match log {
                    Some(path) => {
                        let file = std::fs::File::create(path)
                            .map_err(|source| Error::Start { line: line.clone(), source })?;
                        let copy = file.try_clone().map_err(|source| Error::Start { line: line.clone(), source })?;
                        (Stdio::from(file), Stdio::from(copy))
                    }
                    None => (Stdio::null(), Stdio::null()),
                };
                let child = Command::new("sh")
                    .arg("-c")
                    .arg(format!("exec {line}"))
                    .stdin(Stdio::null())
                    .stdout(out)
                    .stderr(err)
                    .spawn()
                    .map_err(|source| Error::Start { line: line.clone(), source })?;
                let pid = Some(child.id());
                tracing::info!(%line, pid = child.id(), "scheduler started");
                Ok(Started { child: Some(child), binder: None, pid })
            }
        }
    }

    /// The scheduler's process, when known.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// A scheduler the run started that has already exited (a wrong command line): its status.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// Stops what the run started.
    pub fn stop(mut self) {
        if let Some(b) = self.binder.take() {
            b.stop();
        }
        if let Some(mut child) = self.child.take() {
            terminate(&mut child);
        }
    }
}

/// SIGTERM first, as Kubernetes stops a pod (a scheduler drains its events, a profiler writes its
/// data), then SIGKILL after [`GRACE`]. The signal goes through `kill(1)`: no unsafe code here.
fn terminate(child: &mut Child) {
    let asked = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let deadline = std::time::Instant::now() + GRACE;
    while asked && std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// How long a started scheduler gets to exit after SIGTERM.
const GRACE: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(test)]
mod stop_tests {
    use super::*;

    #[test]
    fn a_started_scheduler_gets_sigterm_before_sigkill() {
        // A shell that reports SIGTERM by exiting 7: so `terminate` asked before it forced.
        let mut child =
            Command::new("sh").arg("-c").arg("trap 'exit 7' TERM; while :; do sleep 0.05; done").spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        terminate(&mut child);
        assert_eq!(child.try_wait().unwrap().and_then(|s| s.code()), Some(7));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Arrival, Workload};

    fn config(line: &str) -> Config {
        Config {
            scheduler_name: "s".into(),
            under_test: UnderTest::Command { line: line.into(), log: None },
            namespace: "n".into(),
            nodes: 1,
            gpus_per_node: 1,
            pods: 1,
            gpus_per_pod: 1,
            arrival: Arrival::Batch,
            workload: Workload::Plain.into(),
            create_in_flight: 1,
            warm_up: std::time::Duration::ZERO,
            timeout: std::time::Duration::ZERO,
            settle: std::time::Duration::ZERO,
            delete_nodes: false,
            lifetime: None,
            sample_every: None,
        }
    }

    fn client() -> Client {
        // Never used by a command: any client will do.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        Client::try_from(config).unwrap()
    }

    #[tokio::test]
    async fn a_started_command_is_the_measured_process_itself_and_is_stopped_at_the_end() {
        let mut started = Started::start(&client(), &config("sleep 30")).unwrap();
        let pid = started.pid().unwrap();
        let comm = || std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap().trim().to_string();
        for _ in 0..50 {
            if comm() != "sh" {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(comm(), "sleep", "exec: the PID is the scheduler's, not a shell's");
        assert!(started.exited().is_none());
        started.stop();
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists() || {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                stat.contains(") Z")
            }
        );
    }

    #[tokio::test]
    async fn a_command_that_exits_says_so() {
        let mut started = Started::start(&client(), &config("sh -c 'exit 3'")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(started.exited().and_then(|s| s.code()), Some(3));
        started.stop();
    }
}
