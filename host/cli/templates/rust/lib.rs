//! {{NAME}}: a score policy. It prefers nodes whose GPUs are entirely free (spreading work);
//! replace `score` with your own, or implement `Filter`, `Preempt`, `FairShare`, `SelectDevices`
//! and list them in `export_plugin!`.

use wasmsched_sdk::prelude::*;

/// The policy.
pub struct Policy;

impl Plugin for Policy {
    const NAME: &'static str = "{{NAME}}";

    fn new(config: &str) -> Result<Self, String> {
        match config.trim() {
            "" => Ok(Policy),
            other => Err(format!("{{NAME}} takes no configuration, got {other:?}")),
        }
    }
}

impl Score for Policy {
    fn score(&mut self, _task: &Task, node: &Node) -> u32 {
        let idle = node.gpus.iter().filter(|g| g.is_idle()).count() as u32;
        (idle * MAX_SCORE / node.gpus.len().max(1) as u32).min(MAX_SCORE)
    }
}

wasmsched_sdk::export_plugin!(Policy: score);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmsched_sdk::testing::NativeHarness;

    fn node(name: &str, free: &[u32]) -> Node {
        let gpus: Vec<GpuDevice> = free
            .iter()
            .enumerate()
            .map(|(i, &free_milli)| GpuDevice { index: i as u32, free_milli, ..Default::default() })
            .collect();
        Node { name: name.into(), gpus: gpus.into(), ..Default::default() }
    }

    #[test]
    fn prefers_nodes_with_more_idle_gpus() {
        let mut h = NativeHarness::<Policy>::new("").unwrap();
        let nodes = [node("busy", &[0, 300]), node("half", &[1000, 300]), node("idle", &[1000, 1000])];
        assert_eq!(h.score(&Task::default(), &nodes).unwrap(), vec![0, 50, 100]);
    }
}
