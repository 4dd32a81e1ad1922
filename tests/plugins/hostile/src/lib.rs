//! A plugin that misbehaves on purpose. Its configuration names the misbehaviour; it only
//! misbehaves for tasks whose id starts with `evil`, so tests can watch the host recover.
//!
//! Modes: `ok`, `probe` (reports what of the outside world it can see), `loop`, `memory`, `recurse`, `panic`, `huge-reason`, `score-out-of-range`,
//! `guest-error`, `log-spam`, `init-panic`, and for the preempt stage `bad-victims` (indexes out of
//! range) and `useless-victims` (a plan that frees nothing). Anything else is a rejected
//! configuration.
//!
//! Ways to wait, through WASI itself rather than the SDK: `sleep` (std's sleep, 2 s),
//! `sleep-forever` (sleeps of an hour in a loop), `wait-instant` (a pollable for the end of time,
//! blocked on), `poll-many` (`poll` over a far-off clock and stdin), `stdin` (a blocking read),
//! `socket` (a TCP socket's pollable), `handles` (pollables that are never dropped),
//! `random-huge` (a terabyte of random bytes in one call), `exit`
//! (`std::process::exit(3)`); in `init`: `init-sleep` (sleeps forever), `init-loop`, `init-memory`.
//! `burn` spins for as many iterations as the task id says after `evil-` (`evil-200000`), for
//! measuring budgets.

use wasmsched_sdk::prelude::*;

/// The hostile plugin.
pub struct Hostile {
    mode: String,
}

impl Plugin for Hostile {
    const NAME: &'static str = "hostile";

    fn new(config: &str) -> Result<Self, String> {
        let mode = config.trim().to_string();
        match mode.as_str() {
            "ok" | "probe" | "loop" | "memory" | "recurse" | "panic" | "huge-reason" | "score-out-of-range"
            | "log-spam" | "guest-error" | "bad-victims" | "useless-victims" | "sleep" | "sleep-forever"
            | "wait-instant" | "poll-many" | "stdin" | "socket" | "handles" | "exit" | "burn" | "random-huge" => {
                Ok(Hostile { mode })
            }
            "init-panic" => panic!("hostile plugin panics during init"),
            "init-sleep" => loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            },
            "init-loop" => {
                spin(u64::MAX);
                Err("unreachable".into())
            }
            "init-memory" => {
                let hoard = vec![7u8; 256 << 20];
                Err(format!("unreachable {}", std::hint::black_box(&hoard).len()))
            }
            other => Err(format!("unknown hostile mode {other:?}")),
        }
    }
}

/// Spin for `iterations` rounds of a generator the optimiser cannot see through.
fn spin(iterations: u64) -> u64 {
    let mut x: u64 = 1;
    for _ in 0..iterations {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
    x
}

/// Natively there is no WASI to wait on.
#[cfg(not(target_family = "wasm"))]
fn wait(_mode: &str) -> Option<Verdict> {
    None
}

/// Wait in one of the ways WASI offers; `None` if the wait returned.
#[cfg(target_family = "wasm")]
fn wait(mode: &str) -> Option<Verdict> {
    use wasip2::clocks::monotonic_clock;
    match mode {
        "sleep" => std::thread::sleep(std::time::Duration::from_secs(2)),
        "sleep-forever" => loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        },
        "wait-instant" => monotonic_clock::subscribe_instant(u64::MAX).block(),
        "poll-many" => {
            let far = monotonic_clock::subscribe_duration(u64::MAX / 2);
            let stdin = wasip2::cli::stdin::get_stdin();
            let readable = stdin.subscribe();
            let ready = wasip2::io::poll::poll(&[&far, &readable]);
            return Some(Verdict::unfit(format!("poll answered {ready:?}")));
        }
        "stdin" => {
            let read = wasip2::cli::stdin::get_stdin().blocking_read(1);
            return Some(Verdict::unfit(format!("stdin answered {}", read.is_ok())));
        }
        "socket" => {
            use wasip2::sockets::{network::IpAddressFamily, tcp_create_socket::create_tcp_socket};
            if let Ok(socket) = create_tcp_socket(IpAddressFamily::Ipv4) {
                socket.subscribe().block();
            }
        }
        "random-huge" => {
            let bytes = wasip2::random::random::get_random_bytes(1 << 40);
            return Some(Verdict::unfit(format!("got {} random bytes", bytes.len())));
        }
        "handles" => {
            let mut held = Vec::new();
            loop {
                held.push(monotonic_clock::subscribe_duration(1));
                std::hint::black_box(&held);
            }
        }
        _ => {}
    }
    None
}

#[inline(never)]
#[allow(unconditional_recursion)]
fn recurse(depth: u64) -> u64 {
    // The frame array and the opaque call result keep LLVM from turning this into a loop.
    let frame = std::hint::black_box([depth; 32]);
    let below = std::hint::black_box(recurse(depth + 1));
    below ^ frame[(depth % 32) as usize]
}

impl Hostile {
    fn misbehave(&self, task: &Task) -> Option<Verdict> {
        if !task.id.starts_with("evil") {
            return None;
        }
        match self.mode.as_str() {
            "loop" => {
                spin(u64::MAX);
                None
            }
            "burn" => {
                let iterations = task.id.trim_start_matches("evil-").parse().unwrap_or(0);
                Some(Verdict::unfit(format!("burnt {}", spin(iterations) & 1)))
            }
            "exit" => std::process::exit(3),
            "sleep" | "sleep-forever" | "wait-instant" | "poll-many" | "stdin" | "socket" | "handles"
            | "random-huge" => {
                Some(wait(&self.mode).unwrap_or_else(|| Verdict::unfit(format!("{} returned", self.mode))))
            }
            "memory" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "recurse" => {
                let r = recurse(0);
                Some(Verdict::unfit(format!("{r}")))
            }
            "probe" => {
                let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                Some(Verdict::unfit(format!(
                    "env={} args={} file={} dir={} clock={}s tcp={}",
                    std::env::vars().count(),
                    std::env::args().count(),
                    std::fs::read("/etc/passwd").is_ok(),
                    std::fs::read_dir("/").is_ok(),
                    clock.as_secs(),
                    std::net::TcpStream::connect("127.0.0.1:4222").is_ok(),
                )))
            }
            "panic" => panic!("hostile plugin panics on {}", task.id),
            "huge-reason" => Some(Verdict::unfit("x".repeat(8 << 20))),
            "log-spam" => {
                for i in 0..1_000 {
                    wasmsched_sdk::log(wasmsched_sdk::LogLevel::Info, &format!("spam {i} {}", "y".repeat(4096)));
                }
                Some(Verdict::Fit)
            }
            _ => None,
        }
    }
}

impl Filter for Hostile {
    fn filter(&mut self, task: &Task, _node: &Node) -> Verdict {
        self.misbehave(task).unwrap_or(Verdict::Fit)
    }
}

impl Score for Hostile {
    fn score(&mut self, task: &Task, _node: &Node) -> u32 {
        if task.id.starts_with("evil") && self.mode == "score-out-of-range" {
            return 1000;
        }
        if let Some(Verdict::Unfit(_)) = self.misbehave(task) {
            return 0;
        }
        50
    }
}

impl FairShare for Hostile {
    fn compute(&mut self, queues: &[QueueState], _cluster: &Resources) -> Result<ShareDecision, String> {
        if self.mode == "guest-error" {
            return Err("hostile plugin refuses to compute shares".into());
        }
        Ok(ShareDecision {
            deserved: queues.iter().map(|q| q.guarantee.clone()).collect(),
            order: (0..queues.len() as u32).collect(),
        })
    }
}

impl Preempt for Hostile {
    fn select_victims(
        &mut self,
        preemptor: &Task,
        candidates: &[PreemptCandidate],
        _nodes: &[&Node],
    ) -> Option<Preemption> {
        if !preemptor.id.starts_with("evil") {
            return None;
        }
        match self.mode.as_str() {
            "bad-victims" => Some(Preemption { candidate: candidates.len() as u32 + 7, victims: vec![0, 0] }),
            "useless-victims" => Some(Preemption { candidate: 0, victims: Vec::new() }),
            _ => {
                self.misbehave(preemptor);
                None
            }
        }
    }
}

wasmsched_sdk::export_plugin!(Hostile: filter, score, preempt, fair_share);
