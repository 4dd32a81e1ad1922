//! Call budgets that measure the plugin, not the machine.
//!
//! A wall-clock deadline faults a well-behaved plugin whenever the scheduler's thread is
//! descheduled (a busy node, a noisy neighbour): the call did not use its time, the machine took
//! it. So a call's budget is the CPU time its thread spends, read from the thread's CPU clock,
//! with a wall-clock ceiling (many times the budget) for whatever stalls without using CPU.
//!
//! The epoch ticker still does the interrupting: the engine's epoch deadline is armed at the
//! budget in ticks, and when it fires, [`Budget::check`] reads the thread's CPU clock. Under
//! budget (the thread was waiting for a CPU), the deadline is extended by what is left; over
//! it, or past the ceiling, the call is interrupted. The callback only runs when a call has
//! already taken its whole budget in wall time, so a normal call never reads the CPU clock at all,
//! except for the baseline, which is read at most once per epoch tick per thread
//! ([`thread_cpu_baseline`]): the CPU clock is a system call (~1 µs here), a wall-clock read ~50 ns.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// The running guest call's limits and starting points.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    /// The thread's CPU time at (or up to `slack` before) the call's start.
    cpu_base: Duration,
    /// CPU time the call may use.
    cpu_limit: Duration,
    /// How stale `cpu_base` may be: CPU the thread used before the call may be counted against
    /// it, up to this much, so this much more is allowed.
    slack: Duration,
    started: Instant,
    /// Wall time the call may take, whatever it does.
    wall_limit: Duration,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            cpu_base: Duration::ZERO,
            cpu_limit: Duration::MAX,
            slack: Duration::ZERO,
            started: Instant::now(),
            wall_limit: Duration::MAX,
        }
    }
}

/// What a call had used when it was cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Overrun {
    pub(crate) cpu: Duration,
    pub(crate) cpu_limit: Duration,
    pub(crate) wall: Duration,
    pub(crate) wall_limit: Duration,
}

impl Overrun {
    /// Whether the wall-clock ceiling, rather than the CPU budget, ended the call.
    pub(crate) fn by_ceiling(&self) -> bool {
        self.cpu < self.cpu_limit
    }
}

impl std::fmt::Display for Overrun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.by_ceiling() {
            write!(
                f,
                "wall-clock ceiling of {:?} reached after {:?} (CPU {:?} of its {:?} budget)",
                self.wall_limit, self.wall, self.cpu, self.cpu_limit
            )
        } else {
            write!(f, "used {:?} of CPU, over its {:?} budget, in {:?}", self.cpu, self.cpu_limit, self.wall)
        }
    }
}

/// What the epoch callback decides.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Extend the deadline by this much CPU still allowed.
    Continue(Duration),
    Cut(Overrun),
}

impl Budget {
    /// A budget starting now: `cpu_limit` of CPU, `wall_limit` of wall time. `tick` is the epoch
    /// tick, which bounds how stale the baseline may be.
    pub(crate) fn start(cpu_limit: Duration, wall_limit: Duration, tick: Duration) -> Budget {
        let started = Instant::now();
        Budget { cpu_base: thread_cpu_baseline(started, tick), cpu_limit, slack: tick, started, wall_limit }
    }

    /// Called on the guest's own thread when the epoch deadline fires.
    pub(crate) fn check(&self) -> Verdict {
        self.judge(thread_cpu().saturating_sub(self.cpu_base), self.started.elapsed())
    }

    fn judge(&self, cpu: Duration, wall: Duration) -> Verdict {
        let allowed = self.cpu_limit.saturating_add(self.slack);
        if cpu >= allowed || wall >= self.wall_limit {
            return Verdict::Cut(Overrun { cpu, cpu_limit: self.cpu_limit, wall, wall_limit: self.wall_limit });
        }
        Verdict::Continue(allowed - cpu)
    }
}

/// CPU time the calling thread has used.
pub(crate) fn thread_cpu() -> Duration {
    match rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime) {
        t if t.tv_sec >= 0 => Duration::new(t.tv_sec as u64, t.tv_nsec as u32),
        _ => Duration::ZERO,
    }
}

thread_local! {
    /// The thread's CPU time and when it was read.
    static BASELINE: Cell<Option<(Instant, Duration)>> = const { Cell::new(None) };
}

/// The thread's CPU time as of at most `tick` before `now`: read afresh when the last reading is
/// older, else the last reading. Being stale by at most `tick`, it can make a call look up to
/// `tick` of CPU more expensive than it was, never cheaper.
fn thread_cpu_baseline(now: Instant, tick: Duration) -> Duration {
    BASELINE.with(|b| match b.get() {
        Some((at, cpu)) if now.saturating_duration_since(at) <= tick => cpu,
        _ => {
            let cpu = thread_cpu();
            b.set(Some((Instant::now(), cpu)));
            cpu
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn budget(cpu: u32, wall: u32) -> Budget {
        Budget {
            cpu_base: Duration::ZERO,
            cpu_limit: cpu * MS,
            slack: MS,
            started: Instant::now(),
            wall_limit: wall * MS,
        }
    }

    #[test]
    fn a_descheduled_call_under_its_cpu_budget_goes_on() {
        // 40 ms of wall time, 3 ms of CPU: the thread waited for a CPU.
        assert_eq!(budget(10, 1000).judge(3 * MS, 40 * MS), Verdict::Continue(8 * MS));
    }

    #[test]
    fn a_call_over_its_cpu_budget_is_cut() {
        let Verdict::Cut(o) = budget(10, 1000).judge(11 * MS, 12 * MS) else { panic!("not cut") };
        assert!(!o.by_ceiling());
        assert!(o.to_string().contains("over its 10ms budget"), "{o}");
    }

    #[test]
    fn the_wall_clock_ceiling_cuts_whatever_the_cpu() {
        let Verdict::Cut(o) = budget(10, 200).judge(2 * MS, 200 * MS) else { panic!("not cut") };
        assert!(o.by_ceiling());
        assert!(o.to_string().contains("wall-clock ceiling of 200ms"), "{o}");
    }

    #[test]
    fn the_thread_cpu_clock_counts_work_and_not_sleep() {
        let before = thread_cpu();
        std::thread::sleep(20 * MS);
        let slept = thread_cpu() - before;
        let started = Instant::now();
        let mut x = 1u64;
        while started.elapsed() < 20 * MS {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let worked = thread_cpu() - before - slept;
        assert!(slept < 5 * MS, "sleeping used {slept:?} of CPU");
        // Busy for 20 ms of wall time: at least some of it on a CPU, however loaded the machine.
        assert!(worked > MS, "working used {worked:?} of CPU");
    }
}
