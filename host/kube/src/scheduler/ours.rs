//! The scheduler's own pods, and how many of them have each shape.
//!
//! The dashboard measures fragmentation against the shapes of the pods the scheduler has (FGD's
//! target workload). Counting them as pods come and go costs a map update per change; counting
//! them for each view cost a pass over every pod on the scheduling loop, once a second (about a
//! millisecond at 10,000 pods).

use std::collections::BTreeMap;

use ahash::AHashMap;
use wasmsched_api::fragmentation::Spec;

use crate::workloads::PodFacts;

/// Our pods (pending and bound), by `namespace/name`; read as the map, changed through
/// [`OurPods::insert`] and [`OurPods::remove`] so the shape counts stay true.
#[derive(Default)]
pub(super) struct OurPods {
    pods: AHashMap<String, PodFacts>,
    shapes: BTreeMap<Spec, u64>,
}

impl OurPods {
    pub fn insert(&mut self, id: String, facts: PodFacts) {
        self.count(&facts, true);
        if let Some(old) = self.pods.insert(id, facts) {
            self.count(&old, false);
        }
    }

    pub fn remove(&mut self, id: &str) -> Option<PodFacts> {
        let old = self.pods.remove(id)?;
        self.count(&old, false);
        Some(old)
    }

    /// How many of the pods have each shape.
    pub fn shapes(&self) -> &BTreeMap<Spec, u64> {
        &self.shapes
    }

    fn count(&mut self, facts: &PodFacts, add: bool) {
        let shape = Spec::of(&facts.task);
        if add {
            *self.shapes.entry(shape).or_default() += 1;
        } else if let Some(n) = self.shapes.get_mut(&shape) {
            *n -= 1;
            if *n == 0 {
                self.shapes.remove(&shape);
            }
        }
    }
}

impl std::ops::Deref for OurPods {
    type Target = AHashMap<String, PodFacts>;
    fn deref(&self) -> &Self::Target {
        &self.pods
    }
}

impl<'a> IntoIterator for &'a OurPods {
    type Item = (&'a String, &'a PodFacts);
    type IntoIter = std::collections::hash_map::Iter<'a, String, PodFacts>;
    fn into_iter(self) -> Self::IntoIter {
        self.pods.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use wasmsched_api::{GpuRequest, Task};

    fn facts(gpus: u32) -> PodFacts {
        let gpu = GpuRequest { count: gpus, milli_per_gpu: 1000, ..Default::default() };
        PodFacts::new(&Pod::default(), Task { gpu, ..Default::default() })
    }

    #[test]
    fn shape_counts_follow_pods_replaced_and_removed() {
        let mut ours = OurPods::default();
        ours.insert("a".into(), facts(1));
        ours.insert("b".into(), facts(1));
        ours.insert("c".into(), facts(8));
        // `b` seen again with another shape (its spec changed): counted once, as its new shape.
        ours.insert("b".into(), facts(8));
        let counts = |o: &OurPods| o.shapes().values().copied().collect::<Vec<u64>>();
        assert_eq!((ours.len(), counts(&ours)), (3, vec![1, 2]));
        assert!(ours.remove("c").is_some() && ours.remove("c").is_none());
        ours.remove("a");
        assert_eq!(counts(&ours), vec![1], "a shape with no pod left is gone");
        assert_eq!(ours.shapes().keys().next().map(|s| s.count), Some(8));
    }
}
