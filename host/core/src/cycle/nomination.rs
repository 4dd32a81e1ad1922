//! A preemptor waiting nominated: room kept for it (holds) as its victims checkpoint and terminate,
//! and what it is told while it waits.

use super::*;

impl SchedulerCore {
    /// Keep what an evicted victim freed bound for its preemptor while that one still waits.
    pub(super) fn hold(&mut self, preemptor: &str, m: &Member, task: wasmsched_api::Task) {
        self.hold_for(preemptor, Hold { node: m.node.clone(), task, devices: m.devices.clone() });
    }

    pub(super) fn hold_for(&mut self, preemptor: &str, hold: Hold) {
        if self.entries.get(preemptor).is_none_or(|p| p.phase != Phase::Preempting) {
            return;
        }
        let Some(slot) = self.nodes.slot_of(&hold.node) else { return };
        if matches!(self.nodes.update_usage(slot, |n| bind(n, &hold.task, &hold.devices)), Some(Ok(()))) {
            self.entries.get_mut(preemptor).expect("checked").holds.push(hold);
            self.holders.insert(preemptor.to_string());
        }
    }

    /// An evicted member keeps its room bound until the driver reports it gone.
    pub(super) fn leave_terminating(&mut self, m: &Member, task: wasmsched_api::Task, preemptor: Option<&str>) {
        self.nodes.update_usage(m.slot, |n| bind_fact(n, &task, &m.devices));
        let preemptor = preemptor
            .filter(|p| self.entries.get(*p).is_some_and(|e| e.phase == Phase::Preempting))
            .map(str::to_string);
        let hold = Hold { node: m.node.clone(), task, devices: m.devices.clone() };
        self.terminating.push(Terminating { hold, preemptor });
    }

    /// An evicted task is gone from its node (its pod deleted, or its eviction given up): its room
    /// is free, or kept for the preemptor that still waits for it. `false` when it was not
    /// terminating (evicted without [`CoreConfig::await_termination`], or reported already).
    pub fn terminated(&mut self, task: &str) -> bool {
        let Some(i) = self.terminating.iter().position(|t| t.hold.task.id == task) else { return false };
        let Terminating { hold, preemptor } = self.terminating.remove(i);
        if let Some(slot) = self.nodes.slot_of(&hold.node) {
            self.nodes.update_usage(slot, |n| release(n, &hold.task, &hold.devices));
        }
        if let Some(p) = preemptor {
            self.hold_for(&p, hold);
        }
        self.unpark_all();
        true
    }

    /// For a workload waiting nominated (its victims checkpointing or terminating), the nodes
    /// where room is made or kept for it; `None` when it is not waiting.
    pub fn nomination(&self, workload: &str) -> Option<Vec<String>> {
        let e = self.entries.get(workload).filter(|e| e.phase == Phase::Preempting)?;
        let leaving = e.waiting_for.iter().filter_map(|(w, i)| self.entries.get(w)?.members.get(*i)?.as_ref());
        let terminating = self.terminating.iter().filter(|t| t.preemptor.as_deref() == Some(workload));
        let mut nodes: Vec<String> = leaving
            .map(|m| m.node.clone())
            .chain(terminating.map(|t| t.hold.node.clone()))
            .chain(e.holds.iter().map(|h| h.node.clone()))
            .collect();
        nodes.sort();
        nodes.dedup();
        Some(nodes)
    }

    /// Tasks evicted and still terminating, with the node each holds room on.
    pub fn terminating(&self) -> impl Iterator<Item = (&str, &str)> {
        self.terminating.iter().map(|t| (t.hold.task.id.as_str(), t.hold.node.as_str()))
    }

    /// Whether every victim of nominated workload `e` has left: none still checkpointing, none
    /// still terminating.
    pub(super) fn victims_gone(&self, e: &Entry) -> bool {
        let name = e.spec.name.as_str();
        e.waiting_for.iter().all(|(w, i)| {
            self.entries.get(w).and_then(|v| v.members.get(*i)?.as_ref()).is_none_or(|m| m.leaving.is_none())
        }) && !self.terminating.iter().any(|t| t.preemptor.as_deref() == Some(name))
    }

    /// Why nominated workload `name` still waits: its victims checkpointing and terminating.
    pub(super) fn waiting_message(&self, name: &str) -> String {
        let Some(e) = self.entries.get(name) else { return String::new() };
        let checkpointing = e
            .waiting_for
            .iter()
            .filter(|(w, i)| {
                self.entries.get(w).and_then(|v| v.members.get(*i)?.as_ref()).is_some_and(|m| m.leaving.is_some())
            })
            .count();
        let terminating: Vec<&Terminating> =
            self.terminating.iter().filter(|t| t.preemptor.as_deref() == Some(name)).collect();
        let mut parts = Vec::new();
        if checkpointing > 0 {
            parts.push(format!("{checkpointing} to checkpoint"));
        }
        if !terminating.is_empty() {
            let mut nodes: Vec<&str> = terminating.iter().map(|t| t.hold.node.as_str()).collect();
            nodes.sort_unstable();
            nodes.dedup();
            parts.push(format!("{} to terminate on {}", terminating.len(), nodes.join(", ")));
        }
        format!("nominated: waiting for its victims ({})", parts.join(", "))
    }

    /// `name` no longer waits for room: victims still terminating free it for everyone.
    pub(super) fn forget_nomination(&mut self, name: &str) {
        for t in &mut self.terminating {
            if t.preemptor.as_deref() == Some(name) {
                t.preemptor = None;
            }
        }
    }

    pub(super) fn release_holds(&mut self, holds: &[Hold]) {
        for h in holds {
            if let Some(slot) = self.nodes.slot_of(&h.node) {
                self.nodes.update_usage(slot, |n| release(n, &h.task, &h.devices));
            }
        }
    }
}
