//! Resource flavors: which flavors a queue may use, their nodes, and a task as placed in one.

use super::*;

impl SchedulerCore {
    /// The flavors to try for work of `leaf`, in order; `None` is the nodes of no flavor (or,
    /// without flavors, every node).
    pub(super) fn flavor_choices(&self, leaf: usize) -> Vec<Option<usize>> {
        if self.last_cycle.flavor_nodes.is_empty() {
            return vec![None];
        }
        let mut out: Vec<Option<usize>> = self.queues.flavors_for(leaf).iter().map(|&f| Some(f)).collect();
        out.push(None);
        out
    }

    /// The nodes of a flavor choice; `None` for every node when there are no flavors.
    pub(super) fn nodes_of(&self, flavor: Option<usize>) -> Option<&[Slot]> {
        let i = flavor.unwrap_or(self.last_cycle.flavor_nodes.len().checked_sub(1)?);
        self.last_cycle.flavor_nodes.get(i).map(Vec::as_slice)
    }

    pub(super) fn flavor_name(&self, flavor: Option<usize>) -> Option<&str> {
        Some(self.queues.flavors().get(flavor?)?.name.as_str())
    }

    /// Pending demand `d` of `e` as fair share sees it: with resource flavors, wanted in every
    /// flavor its queue may use (placement decides which; each flavor's share is capped by the
    /// queue's quota there, so a queue is never promised more than it may hold).
    pub(super) fn wanted(&self, e: &Entry, d: Resources) -> Resources {
        if self.last_cycle.flavor_nodes.is_empty() {
            return d;
        }
        let mut out = d.clone();
        for &f in self.queues.flavors_for(e.leaf) {
            crate::flavor::add_flavored(&mut out, &self.queues.flavors()[f].name, &d);
        }
        out.extended.retain(|(n, _)| !self.queues.unbounded_flavored(n));
        out
    }

    /// `task` ready to place with `flavor`: with the flavor's tolerations, and its pod
    /// (anti)-affinity resolved into node affinity (the summary goes to `note`).
    pub(super) fn prepare(
        &self,
        task: &wasmsched_api::Task,
        flavor: Option<usize>,
        note: &mut Option<String>,
    ) -> Result<wasmsched_api::Task, String> {
        let task = self.in_flavor(task, flavor);
        Ok(match self.resolve_pod_affinity(&task)? {
            Some((resolved, summary)) => {
                *note = Some(summary);
                resolved
            }
            None => task,
        })
    }

    /// `task` as placed with `flavor`: with the flavor's tolerations.
    pub(super) fn in_flavor(&self, task: &wasmsched_api::Task, flavor: Option<usize>) -> wasmsched_api::Task {
        let mut task = task.clone();
        if let Some(f) = flavor.and_then(|f| self.queues.flavors().get(f)) {
            task.tolerations.extend(f.tolerations.iter().cloned());
        }
        task
    }
}
