//! Which gang each pod of ours belongs to ([`crate::groups`]): the watches of owners and of
//! other APIs' `PodGroup`s, and the one answer the cycle, the take-over and the status writer
//! share.

use super::*;
use crate::groups::GroupSource;
use crate::groups::owners::Grouping;
use crate::groups::podgroups::{Found, Policy};

/// How one pod of ours is placed.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Membership {
    /// Alone; in `queue` when the pod names none itself.
    Alone { queue: Option<String> },
    /// A member of gang `key` (`namespace/name`; `name` is the tasks' group).
    Gang { key: String, name: String, info: GroupInfo },
    /// Not yet placeable: why (said on the pod).
    Waiting(String),
}

/// The pods of one gang gathered for a submission or a take-over.
pub(super) struct Gathered {
    /// The tasks' group name.
    pub(super) name: String,
    /// Its settings.
    pub(super) info: GroupInfo,
    /// Its pods.
    pub(super) ids: Vec<String>,
}

impl Gathered {
    pub(super) fn new(name: String, info: GroupInfo) -> Gathered {
        Gathered { name, info, ids: Vec::new() }
    }
}

impl Scheduler {
    /// How pod `f` is placed, from the group it names or else its owners.
    pub(super) fn membership(&self, f: &PodFacts) -> Membership {
        let namespace = &f.task.namespace;
        if let Some((source, name)) = &f.group {
            let key = format!("{namespace}/{name}");
            let gang = |info: &GroupInfo| Membership::Gang { key: key.clone(), name: name.clone(), info: info.clone() };
            // Our PodGroup of that name overrides whatever another API says.
            if let Some(info) = self.view.objects.groups.get(&key) {
                return gang(info);
            }
            return match (source, self.view.objects.pod_groups.find(*source, &key)) {
                (GroupSource::Wasmsched, _) => Membership::Waiting(format!("waiting for PodGroup {key}")),
                (_, Found::Group(g)) => match &g.policy {
                    Policy::Basic => Membership::Alone { queue: None },
                    Policy::Gang(info) => gang(info),
                },
                // The cluster does not serve the upstream API (said once at start): the field is
                // the API server's, so no PodGroup of it can ever appear.
                (GroupSource::Upstream, Found::NotWatched) => Membership::Alone { queue: None },
                (source, _) => Membership::Waiting(format!("waiting for PodGroup {key} ({})", source.api_group())),
            };
        }
        match self.view.objects.owners.grouping(namespace, f.owner.as_ref(), &f.labels) {
            Grouping::Alone { queue } => Membership::Alone { queue },
            Grouping::Gang { name, min_member, queue } => Membership::Gang {
                key: format!("{namespace}/{name}"),
                name,
                info: GroupInfo::of_min(min_member, queue),
            },
            Grouping::Waiting(reason) => Membership::Waiting(reason),
        }
    }

    /// The gang key of pod `id`, if it is a gang member now.
    pub(super) fn gang_of(&self, id: &str) -> Option<String> {
        if let Some(owner) = self.core.owner_of(id) {
            return Some(owner.to_string());
        }
        match self.membership(self.view.ours.get(id)?) {
            Membership::Gang { key, .. } => Some(key),
            _ => None,
        }
    }

    /// Gangs still wholly pending whose group or owner now asks for another min-member (an owner
    /// scaled, a PodGroup edited) are withdrawn, to be submitted again as they are now.
    pub(super) fn regroup(&mut self) {
        if !std::mem::take(&mut self.next.regroup) {
            return;
        }
        self.next.gang_min.retain(|key, _| self.core.status(key).is_some());
        let mut stale = Vec::new();
        for (key, min) in &self.next.gang_min {
            let Some(mut members) = self.core.members_of(key) else { continue };
            let Some((first, placed)) = members.next() else { continue };
            if placed || members.any(|(_, placed)| placed) {
                continue;
            }
            let now = self.view.ours.get(&first.id).map(|f| self.membership(f));
            let differs = match now {
                Some(Membership::Gang { key: k, info, .. }) => k != *key || info.min_member != *min,
                Some(_) => true,
                None => false,
            };
            if differs {
                stale.push(key.clone());
            }
        }
        for key in stale {
            tracing::info!(gang = %key, "its group or owner changed while it waited: submitted again");
            let _ = self.core.finish(&key);
            self.next.gang_min.remove(&key);
        }
    }
}
