//! What `emit` hands the outbox: a ready [`Payload`], or a placement packed for the hot path.
//!
//! A `task-scheduled` payload owns six strings and a vector: built on the scheduling thread, that
//! was six or seven allocations per decision, each freed later by the drainer on another CPU (a
//! cross-thread free the allocator settles back on the scheduling thread). The packed form copies
//! the same facts into inline fields (its strings too, up to 96 bytes together, else into one
//! allocation), and the drainer unpacks it into the very payload the slow path would have built,
//! so the wire form cannot differ. `cargo bench -p wasmsched-events --features decisions --bench
//! emit` compares the two.

use crate::schema::Payload;
#[cfg(feature = "decisions")]
pub(crate) use packed::{PackedScheduled, ScheduledView, TaskView};

/// One emitted event's payload as held in the outbox. Boxed when not packed, so that an outbox
/// slot stays the packed form's size (most events are placements).
#[derive(Debug)]
// The large variant is the common one; boxing it would bring back the allocation it saves.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Record {
    Payload(Box<Payload>),
    #[cfg(feature = "decisions")]
    Scheduled(PackedScheduled),
}

impl Record {
    /// The payload to encode (on the drainer's thread).
    pub(crate) fn into_payload(self) -> Payload {
        match self {
            Record::Payload(p) => *p,
            #[cfg(feature = "decisions")]
            Record::Scheduled(s) => Payload::TaskScheduled(s.unpack()),
        }
    }
}

#[cfg(all(test, feature = "decisions"))]
#[test]
fn an_outbox_slot_is_no_larger_than_the_largest_payload() {
    // The outbox holds up to `max_events` slots (100,000 by default): inline text must not make
    // them larger than the payloads they replace.
    assert!(std::mem::size_of::<Record>() <= std::mem::size_of::<Payload>(), "{}", std::mem::size_of::<Record>());
}

#[cfg(feature = "decisions")]
mod packed {
    use crate::schema::{GpuShare, PolicySetRef, ScoreSummary, TaskRef, TaskScheduled};

    /// GPUs kept inline; nodes have at most 8 GPUs in every trace we replay, larger sets spill to a
    /// vector.
    const INLINE_GPUS: usize = 8;

    /// How an event names a task, borrowed from the scheduler's own task.
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct TaskView<'a> {
        pub id: &'a str,
        pub namespace: &'a str,
        pub queue: &'a str,
        pub group: Option<&'a str>,
        pub priority: i32,
    }

    /// A `task-scheduled` event, borrowed; its GPUs are passed beside it as an iterator.
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct ScheduledView<'a> {
        pub task: TaskView<'a>,
        pub node: &'a str,
        pub score: ScoreSummary,
        pub policy: &'a PolicySetRef,
        pub attempt: u32,
    }

    /// Text bytes kept inline: ids, namespace, queue, node and policy name of a typical event
    /// fit, so packing allocates nothing.
    const INLINE_TEXT: usize = 96;

    #[derive(Debug)]
    enum Text {
        Inline { len: u8, bytes: [u8; INLINE_TEXT] },
        Heap(Box<str>),
    }

    impl Text {
        fn as_str(&self) -> &str {
            match self {
                Text::Inline { len, bytes } => std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default(),
                Text::Heap(s) => s,
            }
        }
    }

    #[derive(Debug)]
    enum Gpus {
        Inline { len: u8, shares: [GpuShare; INLINE_GPUS] },
        Heap(Vec<GpuShare>),
    }

    /// A `task-scheduled` event without allocating (or in one allocation when its strings are
    /// long): the task's id, namespace, queue and group, the node and the policy set's name back to
    /// back in `text`, `ends` marking where each stops.
    #[derive(Debug)]
    pub(crate) struct PackedScheduled {
        text: Text,
        ends: [u32; 6],
        has_group: bool,
        priority: i32,
        gpus: Gpus,
        score: ScoreSummary,
        policy_version: u64,
        attempt: u32,
    }

    impl PackedScheduled {
        #[inline]
        pub(crate) fn pack(v: ScheduledView<'_>, gpus: impl ExactSizeIterator<Item = GpuShare>) -> Self {
            let parts = [v.task.id, v.task.namespace, v.task.queue, v.task.group.unwrap_or(""), v.node, &v.policy.name];
            let total: usize = parts.iter().map(|p| p.len()).sum();
            let mut ends = [0u32; 6];
            let text = if total <= INLINE_TEXT {
                let mut bytes = [0u8; INLINE_TEXT];
                let mut at = 0;
                for (end, part) in ends.iter_mut().zip(parts) {
                    bytes[at..at + part.len()].copy_from_slice(part.as_bytes());
                    at += part.len();
                    *end = at as u32;
                }
                Text::Inline { len: at as u8, bytes }
            } else {
                let mut text = String::with_capacity(total);
                for (end, part) in ends.iter_mut().zip(parts) {
                    text.push_str(part);
                    // Names are bounded far below 4 GiB (Kubernetes: 253 bytes); saturate
                    // regardless, so a pathological input cuts a name short instead of mis-slicing.
                    *end = u32::try_from(text.len()).unwrap_or(u32::MAX);
                }
                Text::Heap(text.into_boxed_str())
            };
            let gpus = if gpus.len() <= INLINE_GPUS {
                let mut shares = [GpuShare::default(); INLINE_GPUS];
                let mut len = 0u8;
                for (slot, share) in shares.iter_mut().zip(gpus) {
                    *slot = share;
                    len += 1;
                }
                Gpus::Inline { len, shares }
            } else {
                Gpus::Heap(gpus.collect())
            };
            PackedScheduled {
                text,
                ends,
                has_group: v.task.group.is_some(),
                priority: v.task.priority,
                gpus,
                score: v.score,
                policy_version: v.policy.version,
                attempt: v.attempt,
            }
        }

        /// The payload the facts describe.
        pub(crate) fn unpack(self) -> TaskScheduled {
            let part = |i: usize| -> String {
                let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
                self.text.as_str().get(start..self.ends[i] as usize).unwrap_or_default().to_owned()
            };
            TaskScheduled {
                task: TaskRef {
                    id: part(0),
                    namespace: part(1),
                    queue: part(2),
                    group: self.has_group.then(|| part(3)),
                    priority: self.priority,
                },
                node: part(4),
                gpus: match self.gpus {
                    Gpus::Inline { len, shares } => shares[..usize::from(len)].to_vec(),
                    Gpus::Heap(v) => v,
                },
                score: self.score,
                policy_set: PolicySetRef { name: part(5), version: self.policy_version },
                attempt: self.attempt,
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn view<'a>(group: Option<&'a str>, policy: &'a PolicySetRef) -> ScheduledView<'a> {
            ScheduledView {
                task: TaskView { id: "trainer-0", namespace: "ml-ñ", queue: "research", group, priority: -3 },
                node: "gpu-node-17",
                score: ScoreSummary { total: 87, feasible: 12, evaluated: 500 },
                policy,
                attempt: 2,
            }
        }

        #[test]
        fn unpacking_gives_the_payload_the_facts_describe() {
            let policy = PolicySetRef { name: "fit+pack".into(), version: 41 };
            for group in [None, Some(""), Some("gang-a")] {
                for n in [0u32, 1, 8, 9, 16] {
                    let shares: Vec<GpuShare> = (0..n).map(|g| GpuShare { gpu: g, milli: 1000 - g }).collect();
                    let v = view(group, &policy);
                    let got = PackedScheduled::pack(v, shares.iter().copied()).unpack();
                    let want = TaskScheduled {
                        task: TaskRef {
                            id: v.task.id.into(),
                            namespace: v.task.namespace.into(),
                            queue: v.task.queue.into(),
                            group: group.map(Into::into),
                            priority: -3,
                        },
                        node: v.node.into(),
                        gpus: shares.clone(),
                        score: v.score,
                        policy_set: policy.clone(),
                        attempt: 2,
                    };
                    assert_eq!(got, want, "group {group:?}, {n} GPUs");
                }
            }
        }

        #[test]
        fn long_names_go_to_the_heap_and_come_back_whole() {
            let policy = PolicySetRef { name: "p".repeat(40), version: 1 };
            let id = "pod-".repeat(60);
            let v =
                ScheduledView { task: TaskView { id: &id, ..view(Some("g"), &policy).task }, ..view(None, &policy) };
            let packed = PackedScheduled::pack(v, std::iter::empty());
            assert!(matches!(packed.text, Text::Heap(_)));
            let got = packed.unpack();
            assert_eq!((got.task.id, got.task.group, got.policy_set.name), (id, Some("g".into()), policy.name.clone()));
            let short = PackedScheduled::pack(view(None, &policy), std::iter::empty());
            assert!(matches!(short.text, Text::Inline { .. }), "a typical event allocates nothing");
        }

        #[test]
        fn empty_strings_stay_empty_and_distinct_from_their_neighbours() {
            let policy = PolicySetRef { name: String::new(), version: 0 };
            let v = ScheduledView {
                task: TaskView { id: "", namespace: "", queue: "q", group: None, priority: 0 },
                node: "",
                score: ScoreSummary::default(),
                policy: &policy,
                attempt: 1,
            };
            let got = PackedScheduled::pack(v, std::iter::empty()).unpack();
            assert_eq!((got.task.id.as_str(), got.task.namespace.as_str(), got.task.queue.as_str()), ("", "", "q"));
            assert_eq!((got.node.as_str(), got.policy_set.name.as_str(), got.task.group), ("", "", None));
        }
    }
}
