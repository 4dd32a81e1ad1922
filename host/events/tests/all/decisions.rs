//! The placement hot path (`decisions::publish`) writes exactly the events the plain payload
//! builders describe, whatever shortcut it takes on the scheduling thread.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use wasmsched_api::{DeviceShare, GpuDevice, Node, Task};
use wasmsched_core::{Diagnosis, Placement};
use wasmsched_events::decisions::{self, Decision};
use wasmsched_events::schema::{Payload, PolicySetRef};
use wasmsched_events::{JsonlReader, OutboxConfig, Timestamp};

fn task(id: &str, group: Option<&str>) -> Task {
    Task {
        id: id.into(),
        namespace: "team-ñ".into(),
        queue: "research".into(),
        group: group.map(Into::into),
        priority: 7,
        ..Default::default()
    }
}

fn placement(gpus: u32) -> Placement {
    Placement {
        node: 3,
        devices: (0..gpus).map(|g| DeviceShare { gpu: g, milli: 1000 - 10 * g }).collect(),
        score: 912,
        feasible: 41,
        skipped_faults: Vec::new(),
    }
}

#[test]
fn published_placements_and_diagnoses_read_back_as_the_builders_describe() {
    let (_dir, path, sink) = support::jsonl_sink("events.jsonl", "d", |_| OutboxConfig::default());
    let policy = PolicySetRef { name: "fit+pack".into(), version: 12 };

    let mut want = Vec::new();
    let placed =
        [(task("a", None), 0), (task("b", Some("gang-b")), 1), (task("c", Some("")), 8), (task("d", None), 12)];
    for (i, (t, gpus)) in placed.iter().enumerate() {
        let p = placement(*gpus);
        // Every other node in a pool, with GPUs of a model.
        let gpus: Vec<GpuDevice> =
            (0..16).map(|index| GpuDevice { index, model: format!("model-{i}"), ..Default::default() }).collect();
        let labels =
            if i % 2 == 0 { vec![("cloud.google.com/gke-nodepool".to_string(), format!("pool-{i}"))] } else { vec![] };
        let node = Node { name: format!("node-{i}"), labels, gpus: gpus.into(), ..Default::default() };
        let submitted = (i > 0).then_some(Timestamp(i as u64));
        let d = Decision { task: t, outcome: Ok((&p, &node)), evaluated: 500, attempt: 2, submitted };
        decisions::publish(Some(&sink), Some(Timestamp(1_000 + i as u64)), d, &policy);
        want.push(decisions::scheduled(t, Ok(&node), &p, 500, &policy, 2, submitted));
    }
    let refused = task("e", Some("gang-e"));
    let diagnosis = Diagnosis {
        rejections: BTreeMap::from([(("resource-fit".to_string(), "insufficient GPU".to_string()), (9, false))]),
        faults: Vec::new(),
        candidates: 9,
    };
    let d = Decision { task: &refused, outcome: Err(&diagnosis), evaluated: 9, attempt: 3, submitted: None };
    decisions::publish(Some(&sink), Some(Timestamp(2_000)), d, &policy);

    let stats = sink.close(Duration::from_secs(10));
    assert_eq!((stats.emitted, stats.delivered, stats.dropped), (5, 5, 0));
    let mut reader = JsonlReader::open(&path).unwrap();
    let mut read = Vec::new();
    while let Some(e) = reader.next_event().unwrap() {
        read.push(e);
    }
    assert_eq!(read.len(), 5);
    for (i, (e, w)) in read.iter().zip(&want).enumerate() {
        assert_eq!(&e.payload, w, "placement {i}");
        assert_eq!(e.time, Timestamp(1_000 + i as u64));
        assert_eq!(e.id, format!("d-{}", i + 1), "ids follow emission order");
        assert_eq!(e.namespace.as_deref(), Some("team-ñ"));
        assert_eq!(e.subject, placed[i].0.id);
    }
    let Payload::TaskUnschedulable(u) = &read[4].payload else { panic!("{:?}", read[4].payload) };
    assert_eq!((u.task.id.as_str(), u.task.group.as_deref(), u.attempt), ("e", Some("gang-e"), 3));
    assert_eq!(u.reasons[0].reason, "insufficient GPU (resource-fit)");
    assert_eq!(u.reasons[0].nodes, 9);
}
