//! Example filter: a task that asks for GPUs fits only a node with enough free GPUs of the listed
//! models (each one it asks for, share and device memory included). A node without any GPU of
//! those models is *unresolvable* (preemption cannot change hardware); one with too few free is
//! plain *unfit*. Tasks without GPUs fit everywhere. Configuration: a comma-separated list of
//! models, e.g. `H100,A100`.
//!
//! The same filter is written in Python (`../gpu-model-filter-py`) and JavaScript
//! (`../gpu-model-filter-js`); the tests hold the three to the same verdicts and placements.

use wasmsched_sdk::prelude::*;

/// Admits GPU tasks only to nodes with the listed models.
pub struct GpuModelFilter {
    models: Vec<String>,
    /// The reasons, made once: a filter answers for every node of every cycle.
    none: String,
    too_few: String,
}

impl Plugin for GpuModelFilter {
    const NAME: &'static str = "gpu-model-filter";

    fn new(config: &str) -> Result<Self, String> {
        let models: Vec<String> = config.split(',').map(|m| m.trim().to_string()).filter(|m| !m.is_empty()).collect();
        if models.is_empty() {
            return Err("name at least one GPU model, e.g. \"H100,A100\"".into());
        }
        let list = models.join(", ");
        Ok(GpuModelFilter {
            none: format!("no GPU of {list}"),
            too_few: format!("too few free GPUs of {list}"),
            models,
        })
    }
}

impl Filter for GpuModelFilter {
    fn filter(&mut self, task: &Task, node: &Node) -> Verdict {
        if task.gpu.count == 0 {
            return Verdict::Fit;
        }
        let listed = |g: &&GpuDevice| self.models.contains(&g.model);
        if !node.gpus.iter().any(|g| listed(&g)) {
            return Verdict::unresolvable(self.none.clone());
        }
        let free = node.gpus.iter().filter(listed).filter(|g| task.gpu.fits_device(g)).count();
        if free >= task.gpu.count as usize { Verdict::Fit } else { Verdict::unfit(self.too_few.clone()) }
    }
}

wasmsched_sdk::export_plugin!(GpuModelFilter: filter);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmsched_sdk::testing::NativeHarness;

    fn node(models: &[(&str, u32)]) -> Node {
        let gpus = models
            .iter()
            .enumerate()
            .map(|(i, &(model, free_milli))| GpuDevice {
                index: i as u32,
                model: model.into(),
                free_milli,
                ..Default::default()
            })
            .collect::<Vec<_>>();
        Node { name: "n".into(), gpus: gpus.into(), ..Default::default() }
    }

    #[test]
    fn admits_gpu_tasks_only_where_enough_listed_gpus_are_free() {
        let mut h = NativeHarness::<GpuModelFilter>::new("H100, A100").unwrap();
        let two =
            Task { gpu: GpuRequest { count: 2, milli_per_gpu: 1000, ..Default::default() }, ..Default::default() };
        let nodes = [
            node(&[("H100", 1000), ("A100", 1000)]),
            node(&[("H100", 1000), ("H100", 500)]),
            node(&[("T4", 1000), ("T4", 1000)]),
        ];
        let verdicts = h.filter(&two, &nodes).unwrap();
        assert_eq!(verdicts[0], Verdict::Fit);
        assert_eq!(verdicts[1], Verdict::unfit("too few free GPUs of H100, A100"));
        assert_eq!(verdicts[2], Verdict::unresolvable("no GPU of H100, A100"));
        let cpu_only = Task::default();
        assert!(h.filter(&cpu_only, &nodes).unwrap().iter().all(|v| *v == Verdict::Fit));
        assert!(NativeHarness::<GpuModelFilter>::new(" , ").is_err());
    }
}
