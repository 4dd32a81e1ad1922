//! `PriorityClass` objects by name: what a `PodGroup`'s `priorityClassName` means, and the fallback
//! for a pod the API server left without a resolved `spec.priority` (its Priority admission plugin
//! turned off). A class's value is immutable in Kubernetes, so a workload keeps the priority it was
//! submitted with; a class that does not exist (yet) leaves the members' own priority in force.

use std::collections::BTreeMap;

use ahash::AHashSet;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::ResourceExt;

/// One class as the scheduler uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Class {
    value: i32,
    global_default: bool,
    never_preempts: bool,
}

/// The `PriorityClass` objects seen, by name.
#[derive(Default, Debug)]
pub struct PriorityClasses {
    classes: BTreeMap<String, Class>,
}

impl PriorityClasses {
    /// Records an added or changed class; whether anything the scheduler uses changed.
    pub fn apply(&mut self, pc: &PriorityClass) -> bool {
        let class = Class {
            value: pc.value.unwrap_or(0),
            global_default: pc.global_default == Some(true),
            never_preempts: pc.preemption_policy.as_deref() == Some("Never"),
        };
        self.classes.insert(pc.name_any(), class) != Some(class)
    }

    /// Forgets a deleted class.
    pub fn delete(&mut self, name: &str) {
        self.classes.remove(name);
    }

    /// Keeps only the listed classes (after a re-list).
    pub fn retain(&mut self, listed: &AHashSet<String>) {
        self.classes.retain(|n, _| listed.contains(n));
    }

    /// The value of class `name`, if it exists.
    pub fn value(&self, name: &str) -> Option<i32> {
        self.classes.get(name).map(|c| c.value)
    }

    /// Whether class `name` says its pods never preempt.
    pub fn never_preempts(&self, name: &str) -> bool {
        self.classes.get(name).is_some_and(|c| c.never_preempts)
    }

    /// The priority of a pod that names no class: the global default's value — the lowest one
    /// when several claim to be the default, as the API server's admission picks — or 0.
    pub fn default_value(&self) -> i32 {
        self.classes.values().filter(|c| c.global_default).map(|c| c.value).min().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn class(name: &str, value: i32, extra: serde_json::Value) -> PriorityClass {
        let mut v = json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value});
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn classes_resolve_by_name_with_the_lowest_global_default() {
        let mut pcs = PriorityClasses::default();
        assert_eq!(pcs.default_value(), 0);
        assert!(pcs.apply(&class("high", 1000, json!({"preemptionPolicy": "Never"}))));
        assert!(!pcs.apply(&class("high", 1000, json!({"preemptionPolicy": "Never"}))), "nothing changed");
        pcs.apply(&class("batch", 10, json!({"globalDefault": true})));
        pcs.apply(&class("other-default", 20, json!({"globalDefault": true})));
        assert_eq!((pcs.value("high"), pcs.value("missing")), (Some(1000), None));
        assert!(pcs.never_preempts("high") && !pcs.never_preempts("batch"));
        assert_eq!(pcs.default_value(), 10);
        pcs.retain(&["high".to_string()].into_iter().collect());
        assert_eq!(pcs.default_value(), 0);
        pcs.delete("high");
        assert_eq!(pcs.value("high"), None);
    }
}
