//! Cluster samples for preparing versions off the loop, and catching a prepared version up with
//! the nodes the loop decides on.

use super::*;

impl Registry {
    /// With warm-up: let the staged version catch up with `nodes` a step, and make it live when
    /// it has. Call from the scheduling loop before [`Registry::current`]; without a staged
    /// version this is an atomic load.
    pub fn warm(&self, nodes: &NodeTable) {
        let Some(max_changes) = self.warm_up else { return };
        if !self.staged.load(Ordering::Acquire) {
            return;
        }
        let Some(staged) = self.lock().staged.as_ref().map(|(v, _)| v.clone()) else { return };
        if !staged.set.catch_up(nodes, max_changes) {
            return;
        }
        let mut inner = self.lock();
        // Replaced by a newer one meanwhile: that one warms next time.
        if let Some((v, how)) = inner.staged.take_if(|(v, _)| Arc::ptr_eq(v, &staged)) {
            self.staged.store(false, Ordering::Release);
            let previous = self.go_live(&mut inner, v, &how);
            inner.retired.push(previous);
        }
    }

    /// Whether the scheduling loop should hand over a cluster sample ([`Registry::offer_sample`]):
    /// one was asked for, or the last one is stale. An atomic load.
    pub fn wants_sample(&self) -> bool {
        self.sample_wanted.load(Ordering::Relaxed)
    }

    /// Keep a snapshot of the live cluster for smoke tests.
    pub fn offer_sample(&self, nodes: &NodeTable) {
        self.sample_wanted.store(false, Ordering::Relaxed);
        // A snapshot keeps the live table's identity: a version smoke-tested on it starts with
        // mirrors that need only the live table's later deltas.
        let snapshot = Arc::new(nodes.snapshot());
        let mut inner = self.lock();
        let tasks = inner.recent_tasks.iter().cloned().collect();
        inner.sample = Some((Sample { nodes: snapshot, tasks }, Instant::now()));
    }

    /// The sample a smoke test uses now: the last one offered (with the most recent tasks), else
    /// the synthetic one.
    pub fn sample(&self) -> Sample {
        self.sample_taken().0
    }

    /// [`Registry::sample`], and when the loop took it (`None`: the synthetic one).
    pub(super) fn sample_taken(&self) -> (Sample, Option<Instant>) {
        let inner = self.lock();
        let taken = inner.sample.as_ref().map(|(_, at)| *at);
        let sample = match &inner.sample {
            Some((sample, at)) => {
                if at.elapsed() > SAMPLE_MAX_AGE {
                    self.sample_wanted.store(true, Ordering::Relaxed);
                }
                let mut sample = sample.clone();
                if !inner.recent_tasks.is_empty() {
                    sample.tasks = inner.recent_tasks.iter().rev().cloned().collect();
                }
                if sample.tasks.is_empty() {
                    sample.tasks = Sample::synthetic().tasks;
                }
                sample
            }
            None => Sample::synthetic(),
        };
        (sample, taken)
    }

    /// Bring a prepared version's plugin mirrors up to the live cluster here, off the scheduling
    /// loop: they are synced to the sample it was smoke-tested on, as old as its preparation, and
    /// its first decisions would otherwise replay every change since. Only while the loop is
    /// deciding (decisions were recorded since the preparation began): a fresh sample is awaited
    /// ([`Registry::fresh_sample`]), else any sample newer than the one the preparation used
    /// (`taken`; `None`: the synthetic one) serves; an idle loop has no latency to protect.
    pub(super) fn catch_up_to_live(&self, version: &PolicyVersion, taken: Option<Instant>, busy_before: u64) {
        if self.decisions.load(Ordering::Relaxed) == busy_before {
            return;
        }
        if let Some(nodes) = self.fresh_sample(taken) {
            version.set.catch_up_apart_from(&self.current().set, &nodes, usize::MAX);
        }
    }

    /// The same for a version prepared or used earlier (installed, promoted, rolled back to): its
    /// mirrors are as old as its last use, and its first live decision would replay every change
    /// since (or resend every node, once that is more than the table's log keeps). Plugins already
    /// at or past the sample's state skip it (no step back).
    pub(super) fn catch_up_earlier_version(&self, version: &PolicyVersion) {
        if let Some(nodes) = self.fresh_sample(None) {
            version.set.catch_up_apart_from(&self.current().set, &nodes, usize::MAX);
        }
    }

    /// A sample the loop hands over from now on, awaited while it is deciding, at most
    /// [`FRESH_SAMPLE_WAIT`]; a loop that decides nothing within [`IDLE_LOOP_WAIT`] offers none
    /// and is not waited for. Failing that, the newest sample taken after `fallback_after` (`None`:
    /// any).
    pub(super) fn fresh_sample(&self, fallback_after: Option<Instant>) -> Option<Arc<NodeTable>> {
        let busy_before = self.decisions.load(Ordering::Relaxed);
        let asked = Instant::now();
        self.sample_wanted.store(true, Ordering::Relaxed);
        let newer_than = |t: Option<Instant>| {
            let inner = self.lock();
            inner.sample.as_ref().filter(|(_, at)| t.is_none_or(|t| *at > t)).map(|(s, _)| s.nodes.clone())
        };
        loop {
            if let Some(nodes) = newer_than(Some(asked)) {
                return Some(nodes);
            }
            let waited = asked.elapsed();
            let idle = waited >= IDLE_LOOP_WAIT && self.decisions.load(Ordering::Relaxed) == busy_before;
            if idle || waited >= FRESH_SAMPLE_WAIT {
                return newer_than(fallback_after);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}
