//! Which gang each pod of ours belongs to ([`crate::groups`]): the watches of owners and of
//! other APIs' `PodGroup`s, and the one answer the cycle, the take-over and the status writer
//! share.

use crate::crd::not_installed;
use kube::api::DynamicObject;

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
            if let Some(info) = self.objects.groups.get(&key) {
                return gang(info);
            }
            return match (source, self.objects.pod_groups.find(*source, &key)) {
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
        match self.objects.owners.grouping(namespace, f.owner.as_ref(), &f.labels) {
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
        match self.membership(self.ours.get(id)?) {
            Membership::Gang { key, .. } => Some(key),
            _ => None,
        }
    }

    /// An owner of kind `kind` (the owner table's index) changed.
    pub(super) fn owner_event(&mut self, kind: usize, event: watcher::Result<Event<DynamicObject>>) {
        let owners = &mut self.objects.owners;
        let changed = match event {
            Ok(Event::Init) => {
                owners.relist_started(kind);
                false
            }
            Ok(Event::InitApply(o)) | Ok(Event::Apply(o)) => owners.apply(kind, &o),
            Ok(Event::InitDone) => {
                owners.relist_done(kind);
                true
            }
            Ok(Event::Delete(o)) => owners.delete(&o),
            Err(e) => {
                let spec = owners.table().kinds().nth(kind).map(|k| format!("{} ({})", k.kind, k.api_version));
                if owners.watch_failed(kind) {
                    let kind = spec.as_deref().unwrap_or("?");
                    if not_installed(&e) {
                        tracing::info!(%kind, "owner kind not installed in this cluster: its pods are scheduled alone until it is");
                    } else {
                        tracing::warn!(%kind, error = %e,
                            "cannot watch this owner kind (not allowed?): its pods are scheduled alone until it can");
                    }
                } else {
                    tracing::debug!(kind = spec.as_deref().unwrap_or("?"), error = %e, "owner watch failed; retrying");
                }
                false
            }
        };
        self.next.dirty |= changed;
        self.next.regroup |= changed;
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
            let now = self.ours.get(&first.id).map(|f| self.membership(f));
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

    /// A `PodGroup` of another API (`self.objects.pod_groups`' watch `i`) changed.
    pub(super) fn pod_group_event(&mut self, i: usize, event: watcher::Result<Event<DynamicObject>>) {
        let groups = &mut self.objects.pod_groups;
        let changed = match event {
            Ok(Event::Init) => {
                groups.relist_started(i);
                false
            }
            Ok(Event::InitApply(g)) | Ok(Event::Apply(g)) => groups.apply(i, &g),
            Ok(Event::InitDone) => {
                groups.relist_done(i);
                true
            }
            Ok(Event::Delete(g)) => groups.delete(i, &g),
            Err(e) => {
                let api = groups.apis()[i].api_resource().api_version;
                if groups.watch_failed(i) {
                    if not_installed(&e) {
                        tracing::info!(%api, "PodGroups of this API not installed in this cluster; pods naming one wait for it");
                    } else {
                        tracing::warn!(%api, error = %e, "cannot watch PodGroups of this API (not allowed?); pods naming one wait for it");
                    }
                } else {
                    tracing::debug!(%api, error = %e, "PodGroup watch failed; retrying");
                }
                false
            }
        };
        self.next.dirty |= changed;
        self.next.regroup |= changed;
    }
}
