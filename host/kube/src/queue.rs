//! Pods waiting for a decision: an active queue ordered by priority then arrival, and a back-off
//! set for pods that could not be placed or bound (1 s doubling to 10 s, as kube-scheduler), so an
//! unplaceable pod neither spins the scheduler nor starves the pods behind it.

use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ahash::{AHashMap, AHashSet};
use wasmsched_api::Task;

/// First back-off after a failed attempt.
pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
/// Longest back-off.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Position {
    Active(u64),
    Backoff(Instant, u64),
    /// Popped: being decided or bound.
    InFlight,
}

struct Entry {
    task: Task,
    uid: String,
    attempts: u32,
    position: Position,
}

/// A pod handed out by [`PendingQueue::pop`].
#[derive(Clone, Debug)]
pub struct Popped {
    /// The task.
    pub task: Task,
    /// The pod's UID (the binding is made for this incarnation of the name only).
    pub uid: String,
    /// Attempts so far.
    pub attempts: u32,
}

/// The pending pods of this scheduler.
#[derive(Default)]
pub struct PendingQueue {
    entries: AHashMap<String, Entry>,
    active: BTreeSet<(Reverse<i32>, u64, String)>,
    backoff: BTreeSet<(Instant, u64, String)>,
    groups: AHashMap<String, AHashSet<String>>,
    seq: u64,
}

/// The key of a group: `namespace/group`.
pub fn group_key(task: &Task) -> Option<String> {
    task.group.as_ref().map(|g| format!("{}/{g}", task.namespace))
}

impl PendingQueue {
    /// An empty queue.
    pub fn new() -> PendingQueue {
        PendingQueue::default()
    }

    /// Adds a pending pod, or refreshes its task if it is already known (where it waits is kept).
    pub fn upsert(&mut self, task: Task, uid: String) {
        if let Some(e) = self.entries.get_mut(&task.id) {
            if e.uid == uid {
                let priority_changed = e.task.priority != task.priority;
                e.task = task;
                if let (true, Position::Active(seq)) = (priority_changed, e.position) {
                    let id = e.task.id.clone();
                    self.active.retain(|(_, s, i)| !(*s == seq && *i == id));
                    self.active.insert((Reverse(e.task.priority), seq, id));
                }
                return;
            }
            // The same name, a new pod: start over.
            let id = task.id.clone();
            self.remove(&id);
        }
        self.seq += 1;
        let id = task.id.clone();
        if let Some(g) = group_key(&task) {
            self.groups.entry(g).or_default().insert(id.clone());
        }
        self.active.insert((Reverse(task.priority), self.seq, id.clone()));
        self.entries.insert(id, Entry { task, uid, attempts: 0, position: Position::Active(self.seq) });
    }

    /// Forgets a pod (bound, deleted, or no longer ours).
    pub fn remove(&mut self, id: &str) {
        let Some(e) = self.entries.remove(id) else { return };
        self.unlink(id, e.position, e.task.priority);
        if let Some(g) = group_key(&e.task)
            && let Some(members) = self.groups.get_mut(&g)
        {
            members.remove(id);
            if members.is_empty() {
                self.groups.remove(&g);
            }
        }
    }

    fn unlink(&mut self, id: &str, position: Position, priority: i32) {
        match position {
            Position::Active(seq) => {
                self.active.remove(&(Reverse(priority), seq, id.to_string()));
            }
            Position::Backoff(at, seq) => {
                self.backoff.remove(&(at, seq, id.to_string()));
            }
            Position::InFlight => {}
        }
    }

    /// Moves pods whose back-off has passed to the active queue.
    pub fn promote(&mut self, now: Instant) {
        while let Some(first) = self.backoff.first().cloned() {
            if first.0 > now {
                break;
            }
            self.backoff.pop_first();
            let (_, seq, id) = first;
            if let Some(e) = self.entries.get_mut(&id) {
                e.position = Position::Active(seq);
                self.active.insert((Reverse(e.task.priority), seq, id));
            }
        }
    }

    /// The next pod to decide, if one is due.
    pub fn pop(&mut self, now: Instant) -> Option<Popped> {
        self.promote(now);
        let (_, _, id) = self.active.pop_first()?;
        let e = self.entries.get_mut(&id).expect("queued ids have entries");
        e.position = Position::InFlight;
        Some(Popped { task: e.task.clone(), uid: e.uid.clone(), attempts: e.attempts })
    }

    /// Takes the other members of `group` that are waiting (active or backing off), for a gang
    /// decision. They are in flight until [`PendingQueue::back_off`] or [`PendingQueue::remove`].
    pub fn take_group(&mut self, group: &str, except: &str) -> Vec<Popped> {
        let ids: Vec<String> = self.groups.get(group).into_iter().flatten().filter(|i| *i != except).cloned().collect();
        let mut out = Vec::new();
        for id in ids {
            let Some(e) = self.entries.get(&id) else { continue };
            if e.position == Position::InFlight {
                continue;
            }
            let (position, priority) = (e.position, e.task.priority);
            self.unlink(&id, position, priority);
            let e = self.entries.get_mut(&id).expect("present");
            e.position = Position::InFlight;
            out.push(Popped { task: e.task.clone(), uid: e.uid.clone(), attempts: e.attempts });
        }
        out.sort_by(|a, b| a.task.id.cmp(&b.task.id));
        out
    }

    /// Puts a pod that could not be placed or bound back, after its back-off.
    pub fn back_off(&mut self, id: &str, now: Instant) -> Option<Duration> {
        let e = self.entries.get_mut(id)?;
        let (position, priority) = (e.position, e.task.priority);
        e.attempts = e.attempts.saturating_add(1);
        let delay = INITIAL_BACKOFF.saturating_mul(1 << e.attempts.saturating_sub(1).min(8)).min(MAX_BACKOFF);
        self.seq += 1;
        let seq = self.seq;
        let at = now + delay;
        let e = self.entries.get_mut(id)?;
        e.position = Position::Backoff(at, seq);
        self.unlink(id, position, priority);
        self.backoff.insert((at, seq, id.to_string()));
        Some(delay)
    }

    /// When the next backing-off pod becomes due.
    pub fn next_due(&self) -> Option<Instant> {
        self.backoff.first().map(|(at, _, _)| *at)
    }

    /// Pods ready to be decided.
    pub fn active_len(&self) -> usize {
        self.active.len()
    }

    /// Pods backing off.
    pub fn backoff_len(&self) -> usize {
        self.backoff.len()
    }

    /// All pods this queue knows.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no pod is pending.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `id` is pending.
    pub fn contains(&self, id: &str) -> bool {
        self.entries.contains_key(id)
    }

    /// Forgets every pod (a re-list rebuilds the queue).
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        let gone: Vec<String> = self.entries.keys().filter(|id| !keep(id)).cloned().collect();
        for id in gone {
            self.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: &str, priority: i32) -> Task {
        Task { id: id.into(), priority, namespace: "ns".into(), ..Default::default() }
    }

    #[test]
    fn priority_then_arrival_and_back_off_doubles_to_the_cap() {
        let mut q = PendingQueue::new();
        q.upsert(task("a", 0), "u1".into());
        q.upsert(task("b", 10), "u2".into());
        q.upsert(task("c", 0), "u3".into());
        let now = Instant::now();
        assert_eq!(q.pop(now).unwrap().task.id, "b");
        assert_eq!(q.pop(now).unwrap().task.id, "a");
        assert_eq!(q.back_off("a", now), Some(Duration::from_secs(1)));
        assert_eq!(q.pop(now).unwrap().task.id, "c");
        assert!(q.pop(now).is_none(), "a is backing off");
        assert_eq!(q.next_due(), Some(now + Duration::from_secs(1)));
        let later = now + Duration::from_secs(1);
        let a = q.pop(later).unwrap();
        assert_eq!((a.task.id.as_str(), a.attempts), ("a", 1));
        let delays: Vec<u64> = (0..6).map(|_| q.back_off("a", later).unwrap().as_secs()).collect();
        assert_eq!(delays, [2, 4, 8, 10, 10, 10]);
        assert_eq!(q.backoff_len(), 1);
        q.remove("a");
        assert_eq!((q.backoff_len(), q.len()), (0, 2));
    }

    #[test]
    fn a_recreated_pod_starts_over_and_groups_are_taken_together() {
        let mut q = PendingQueue::new();
        let m = |id: &str| Task { group: Some("g".into()), ..task(id, 0) };
        q.upsert(m("m1"), "u1".into());
        q.upsert(m("m2"), "u2".into());
        q.upsert(m("m3"), "u3".into());
        let now = Instant::now();
        let first = q.pop(now).unwrap();
        q.back_off("m2", now);
        let rest = q.take_group("ns/g", &first.task.id);
        assert_eq!(rest.iter().map(|p| p.task.id.as_str()).collect::<Vec<_>>(), ["m2", "m3"]);
        assert_eq!((q.active_len(), q.backoff_len()), (0, 0));
        q.upsert(m("m3"), "u3-new".into());
        assert_eq!(q.pop(now).unwrap().uid, "u3-new");
    }
}
