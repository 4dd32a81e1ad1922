//! What `emit` hands the outbox: a ready [`Payload`], or a placement packed for the hot path.
//!
//! A `task-scheduled` payload owns six strings and a vector: built on the scheduling thread, that
//! was six or seven allocations per decision, each freed later by the drainer on another CPU (a
//! cross-thread free the allocator settles back on the scheduling thread). The packed form copies
//! the same facts into inline fields (its strings too, up to 48 bytes together, else into one
//! allocation), and the drainer unpacks it into the very payload the slow path would have built,
//! so the wire form cannot differ. `cargo bench -p wasmsched-events --features decisions --bench
//! emit` compares the two.

use crate::schema::Payload;
#[cfg(feature = "decisions")]
pub(crate) use packed::{HeldView, PackedScheduled, ScheduledView, TaskView};

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
    use crate::Timestamp;
    use crate::schema::{GpuShare, PolicySetRef, Quantity, ScoreSummary, TaskRef, TaskScheduled};

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
        /// What the run holds, for usage accounting.
        pub held: HeldView<'a>,
    }

    /// What a placed task holds, and where (see `TaskScheduled`).
    #[derive(Clone, Copy, Debug, Default)]
    pub(crate) struct HeldView<'a> {
        pub cpu_milli: u64,
        pub memory_bytes: u64,
        pub gpu_model: Option<&'a str>,
        /// None for NVIDIA's kind.
        pub gpu_kind: Option<&'a str>,
        pub node_pool: Option<&'a str>,
        pub submitted: Option<Timestamp>,
    }

    /// Text bytes kept inline: the task's id, namespace, queue and group, the node, the policy
    /// set's name, the GPU model and the node pool of a typical event (50 bytes in the openb
    /// simulation) fit, so packing allocates nothing; longer ones take one allocation.
    const INLINE_TEXT: usize = 64;

    /// Names packed back to back.
    const PARTS: usize = 9;

    /// The names back to back; part `i` ends at `ends[i]`.
    #[derive(Debug)]
    enum Text {
        Inline { ends: [u8; PARTS], bytes: [u8; INLINE_TEXT] },
        Heap { ends: [u32; PARTS], text: Box<str> },
    }

    impl Text {
        fn part(&self, i: usize) -> &str {
            let (text, ends): (&[u8], [usize; PARTS]) = match self {
                Text::Inline { ends, bytes } => (bytes, ends.map(usize::from)),
                Text::Heap { ends, text } => (text.as_bytes(), ends.map(|e| e as usize)),
            };
            let start = if i == 0 { 0 } else { ends[i - 1] };
            text.get(start..ends[i]).and_then(|b| std::str::from_utf8(b).ok()).unwrap_or_default()
        }
    }

    /// GPUs kept inline, each share as `gpu << MILLI_BITS | milli` in a `u16`: device indices
    /// below 64 and shares up to a whole GPU (1,000 milli) fit, which is every node and share we
    /// schedule; anything else goes to the heap.
    const INLINE_GPUS: usize = 8;
    const MILLI_BITS: u32 = 10;

    #[derive(Debug)]
    enum Gpus {
        Inline { len: u8, shares: [u16; INLINE_GPUS] },
        Heap(Box<[GpuShare]>),
    }

    impl Gpus {
        #[inline]
        fn pack(gpus: impl ExactSizeIterator<Item = GpuShare> + Clone) -> Gpus {
            if gpus.len() <= INLINE_GPUS {
                let mut shares = [0u16; INLINE_GPUS];
                let mut len = 0u8;
                let mut fits = true;
                for (slot, share) in shares.iter_mut().zip(gpus.clone()) {
                    fits &= share.gpu < 1 << (16 - MILLI_BITS) && share.milli < 1 << MILLI_BITS;
                    *slot = ((share.gpu << MILLI_BITS) | share.milli) as u16;
                    len += 1;
                }
                if fits {
                    return Gpus::Inline { len, shares };
                }
            }
            Gpus::Heap(gpus.collect())
        }

        fn unpack(self) -> Vec<GpuShare> {
            match self {
                Gpus::Inline { len, shares } => shares[..usize::from(len)]
                    .iter()
                    .map(|&s| GpuShare {
                        gpu: u32::from(s) >> MILLI_BITS,
                        milli: u32::from(s) & ((1 << MILLI_BITS) - 1),
                    })
                    .collect(),
                Gpus::Heap(v) => v.into_vec(),
            }
        }
    }

    /// A `task-scheduled` event in at most three cache lines with its time (the stores `emit`
    /// makes per placement), without allocating for typical names and GPU sets.
    #[derive(Debug)]
    pub(crate) struct PackedScheduled {
        text: Text,
        gpus: Gpus,
        score: ScoreSummary,
        policy_version: u64,
        cpu_milli: u64,
        memory_bytes: u64,
        submitted: Option<Timestamp>,
        priority: i32,
        attempt: u32,
        has_group: bool,
        has_model: bool,
        has_pool: bool,
    }

    impl PackedScheduled {
        #[inline]
        pub(crate) fn pack(v: ScheduledView<'_>, gpus: impl ExactSizeIterator<Item = GpuShare> + Clone) -> Self {
            let held = v.held;
            let parts = [
                v.task.id,
                v.task.namespace,
                v.task.queue,
                v.task.group.unwrap_or(""),
                v.node,
                &v.policy.name,
                held.gpu_model.unwrap_or(""),
                held.node_pool.unwrap_or(""),
                held.gpu_kind.unwrap_or(""),
            ];
            let total: usize = parts.iter().map(|p| p.len()).sum();
            let text = if total <= INLINE_TEXT {
                let (mut ends, mut bytes) = ([0u8; PARTS], [0u8; INLINE_TEXT]);
                let mut at = 0;
                for (end, part) in ends.iter_mut().zip(parts) {
                    bytes[at..at + part.len()].copy_from_slice(part.as_bytes());
                    at += part.len();
                    *end = at as u8;
                }
                Text::Inline { ends, bytes }
            } else {
                let mut ends = [0u32; PARTS];
                let mut text = String::with_capacity(total);
                for (end, part) in ends.iter_mut().zip(parts) {
                    text.push_str(part);
                    // Names are bounded far below 4 GiB (Kubernetes: 253 bytes); saturate
                    // regardless, so a pathological input cuts a name short instead of mis-slicing.
                    *end = u32::try_from(text.len()).unwrap_or(u32::MAX);
                }
                Text::Heap { ends, text: text.into_boxed_str() }
            };
            PackedScheduled {
                text,
                gpus: Gpus::pack(gpus),
                score: v.score,
                policy_version: v.policy.version,
                priority: v.task.priority,
                attempt: v.attempt,
                cpu_milli: held.cpu_milli,
                memory_bytes: held.memory_bytes,
                submitted: held.submitted,
                has_group: v.task.group.is_some(),
                has_model: held.gpu_model.is_some(),
                has_pool: held.node_pool.is_some(),
            }
        }

        /// The payload the facts describe.
        pub(crate) fn unpack(self) -> TaskScheduled {
            let part = |i: usize| self.text.part(i).to_owned();
            TaskScheduled {
                task: TaskRef {
                    id: part(0),
                    namespace: part(1),
                    queue: part(2),
                    group: self.has_group.then(|| part(3)),
                    priority: self.priority,
                },
                node: part(4),
                score: self.score,
                policy_set: PolicySetRef { name: part(5), version: self.policy_version },
                attempt: self.attempt,
                gpu_model: self.has_model.then(|| part(6)),
                node_pool: self.has_pool.then(|| part(7)),
                gpu_kind: Some(part(8)).filter(|k| !k.is_empty()),
                submitted: self.submitted,
                // Packed only without one ([`crate::decisions`] sends gangs' placements with a
                // topology note as ready payloads).
                topology: None,
                allocated: Quantity { cpu_milli: self.cpu_milli, memory_bytes: self.memory_bytes, gpu_milli: 0 },
                gpus: self.gpus.unpack(),
            }
            .with_gpu_total()
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
                held: HeldView {
                    cpu_milli: 4000,
                    memory_bytes: 16 << 30,
                    gpu_model: Some("H100"),
                    // Another kind's with a gang (both ways covered, and the longest text).
                    gpu_kind: group.map(|_| "amd"),
                    node_pool: None,
                    submitted: Some(Timestamp(7)),
                },
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
                        allocated: Quantity {
                            cpu_milli: 4000,
                            memory_bytes: 16 << 30,
                            gpu_milli: shares.iter().map(|s| u64::from(s.milli)).sum(),
                        },
                        gpu_model: Some("H100".into()),
                        gpu_kind: group.map(|_| "amd".into()),
                        node_pool: None,
                        submitted: Some(Timestamp(7)),
                        topology: None,
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
            assert!(matches!(packed.text, Text::Heap { .. }));
            let got = packed.unpack();
            assert_eq!((got.task.id, got.task.group, got.policy_set.name), (id, Some("g".into()), policy.name.clone()));
            let policy = PolicySetRef { name: "fit".into(), version: 1 };
            let short = PackedScheduled::pack(view(None, &policy), std::iter::empty());
            assert!(matches!(short.text, Text::Inline { .. }), "a typical event allocates nothing");
        }

        #[test]
        fn text_fills_the_inline_bytes_exactly_then_moves_to_the_heap() {
            // 64 bytes of names (a two-byte character at the very end of the id) are inline; one
            // more is not.
            let policy = PolicySetRef { name: "fit".into(), version: 1 };
            for (id_len, inline) in [(28, true), (29, false)] {
                let id = format!("{}é", "x".repeat(id_len - 2));
                let v = ScheduledView {
                    task: TaskView { id: &id, namespace: "ns", queue: "q", group: Some("g"), priority: 0 },
                    node: "node-0123456789abcd",
                    held: HeldView { gpu_model: Some("A100"), node_pool: Some("pool-a"), ..HeldView::default() },
                    ..view(None, &policy)
                };
                let packed = PackedScheduled::pack(v, std::iter::empty());
                assert_eq!(matches!(packed.text, Text::Inline { .. }), inline, "{id_len}-byte id");
                let got = packed.unpack();
                assert_eq!(
                    (got.task.id.as_str(), got.task.namespace.as_str(), got.task.queue.as_str()),
                    (id.as_str(), "ns", "q")
                );
                assert_eq!(
                    (got.task.group.as_deref(), got.node.as_str(), got.policy_set.name.as_str()),
                    (Some("g"), v.node, "fit")
                );
                assert_eq!((got.gpu_model.as_deref(), got.node_pool.as_deref()), (Some("A100"), Some("pool-a")));
            }
        }

        #[test]
        fn gpu_shares_beyond_sixteen_bits_go_to_the_heap_and_come_back_whole() {
            let policy = PolicySetRef { name: "fit".into(), version: 1 };
            let share = |gpu, milli| GpuShare { gpu, milli };
            let cases = [
                (vec![share(63, 1023), share(0, 0)], true),
                ((0..8).map(|g| share(g, 125 * g)).collect(), true),
                ((0..9).map(|g| share(g, 1000)).collect(), false),
                (vec![share(64, 1)], false),
                (vec![share(0, 1024)], false),
                (vec![share(1, 500), share(u32::MAX, u32::MAX)], false),
            ];
            for (shares, inline) in cases {
                let packed = PackedScheduled::pack(view(None, &policy), shares.iter().copied());
                assert_eq!(matches!(packed.gpus, Gpus::Inline { .. }), inline, "{shares:?}");
                assert_eq!(packed.unpack().gpus, shares);
            }
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
                held: HeldView { gpu_model: Some(""), ..HeldView::default() },
            };
            let got = PackedScheduled::pack(v, std::iter::empty()).unpack();
            assert_eq!((got.gpu_model.as_deref(), got.node_pool), (Some(""), None));
            assert_eq!((got.task.id.as_str(), got.task.namespace.as_str(), got.task.queue.as_str()), ("", "", "q"));
            assert_eq!((got.node.as_str(), got.policy_set.name.as_str(), got.task.group), ("", "", None));
        }
    }
}
