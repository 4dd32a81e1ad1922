//! Circuit breaker: stop calling a plugin that keeps failing.
//!
//! Counted in calls rather than wall-clock time, so the simulator stays deterministic.

/// When the breaker opens and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker (0 disables it).
    pub threshold: u32,
    /// Calls answered `CircuitOpen` without calling the plugin before it is tried again. A
    /// failure of that trial call re-opens it at once.
    pub cooldown_calls: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig { threshold: 5, cooldown_calls: 100 }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Breaker {
    consecutive: u32,
    open_remaining: u32,
}

impl Breaker {
    /// Whether the next call may go through; counts down the cool-down.
    pub(crate) fn allow(&mut self) -> bool {
        if self.open_remaining > 0 {
            self.open_remaining -= 1;
            return false;
        }
        true
    }

    /// Closed, with no failure since the last success.
    pub(crate) fn is_clear(&self) -> bool {
        self.consecutive == 0 && self.open_remaining == 0
    }

    pub(crate) fn success(&mut self) {
        self.consecutive = 0;
    }

    /// Records a failure; returns true when this opened the breaker.
    pub(crate) fn failure(&mut self, config: &BreakerConfig) -> bool {
        if config.threshold == 0 {
            return false;
        }
        self.consecutive += 1;
        if self.consecutive >= config.threshold {
            self.open_remaining = config.cooldown_calls;
            // Half-open after the cool-down: one more failure re-opens.
            self.consecutive = config.threshold - 1;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_cools_down_and_reopens_on_trial_failure() {
        let cfg = BreakerConfig { threshold: 3, cooldown_calls: 2 };
        let mut b = Breaker::default();
        assert!(b.is_clear());
        assert!(!b.failure(&cfg));
        assert!(!b.is_clear(), "a failure since the last success");
        assert!(!b.failure(&cfg));
        assert!(b.failure(&cfg));
        assert!(!b.allow());
        assert!(!b.allow());
        assert!(b.allow(), "trial call after cool-down");
        assert!(b.failure(&cfg), "trial failure re-opens at once");
        assert!(!b.allow());
        assert!(!b.allow());
        assert!(b.allow());
        b.success();
        assert!(b.is_clear());
        assert!(!b.failure(&cfg));
    }
}
