//! Tutorial plugin: score nodes by how early their best free GPU model appears in a preference
//! list. Configuration: a comma-separated list, most preferred first, e.g. `H100,A100`.

use wasmsched_sdk::prelude::*;

/// Prefers GPU models in order.
pub struct GpuModelAffinity {
    preferred: Vec<String>,
}

impl Plugin for GpuModelAffinity {
    const NAME: &'static str = "gpu-model-affinity";

    fn new(config: &str) -> Result<Self, String> {
        let preferred: Vec<String> =
            config.split(',').map(|m| m.trim().to_string()).filter(|m| !m.is_empty()).collect();
        if preferred.is_empty() {
            return Err("name at least one GPU model, e.g. \"H100,A100\"".into());
        }
        Ok(GpuModelAffinity { preferred })
    }
}

impl Score for GpuModelAffinity {
    fn score(&mut self, task: &Task, node: &Node) -> u32 {
        let rank = node
            .gpus
            .iter()
            .filter(|g| task.gpu.fits_device(g))
            .filter_map(|g| self.preferred.iter().position(|m| *m == g.model))
            .min();
        match rank {
            // First choice 100, then evenly down to a floor above 0 for the last listed model.
            Some(r) => MAX_SCORE - (r as u32 * MAX_SCORE / (self.preferred.len() as u32 + 1)),
            None => 0,
        }
    }
}

wasmsched_sdk::export_plugin!(GpuModelAffinity: score);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmsched_sdk::testing::NativeHarness;

    fn node(model: &str) -> Node {
        Node {
            name: model.into(),
            gpus: vec![GpuDevice { model: model.into(), free_milli: GPU_MILLI, ..Default::default() }].into(),
            ..Default::default()
        }
    }

    #[test]
    fn prefers_models_in_order() {
        let mut h = NativeHarness::<GpuModelAffinity>::new("H100, A100").unwrap();
        let task =
            Task { gpu: GpuRequest { count: 1, milli_per_gpu: 1000, ..Default::default() }, ..Default::default() };
        let scores = h.score(&task, &[node("H100"), node("A100"), node("T4")]).unwrap();
        assert_eq!(scores, vec![100, 67, 0]);
        assert!(NativeHarness::<GpuModelAffinity>::new(" , ").is_err());
    }
}
