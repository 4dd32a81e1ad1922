//! Resource accounting on a node: bind a task (with its devices) and release it, refusing
//! anything that would over-commit the node.

use wasmsched_api::{DeviceShare, GPU_MILLI, Node, ResourceName, Task};

use crate::plugin::validate;

/// A bind or release that would break the node's accounting.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// The devices do not match the request or the node (double-booking is refused here).
    #[error("invalid devices for task {task} on {node}: {reason}")]
    Devices {
        /// Task id.
        task: String,
        /// Node name.
        node: String,
        /// What is wrong.
        reason: String,
    },
    /// The node lacks CPU, memory or an extended resource.
    #[error("task {task} does not fit {node}: insufficient {resource}")]
    Insufficient {
        /// Task id.
        task: String,
        /// Node name.
        node: String,
        /// The resource.
        resource: String,
    },
}

fn insufficient(task: &Task, node: &Node, resource: &str) -> AllocError {
    AllocError::Insufficient { task: task.id.clone(), node: node.name.clone(), resource: resource.into() }
}

/// Account `task` on `node` with `devices`. Refuses (changing nothing) anything that would
/// over-commit CPU, memory, extended resources or a device.
pub fn bind(node: &mut Node, task: &Task, devices: &[DeviceShare]) -> Result<(), AllocError> {
    validate::devices(devices, task, node).map_err(|reason| AllocError::Devices {
        task: task.id.clone(),
        node: node.name.clone(),
        reason,
    })?;
    if node.free_cpu_milli() < task.request.cpu_milli {
        return Err(insufficient(task, node, "cpu"));
    }
    if node.free_memory_bytes() < task.request.memory_bytes {
        return Err(insufficient(task, node, "memory"));
    }
    for (name, want) in &task.request.extended {
        if node.allocatable.extended(name).saturating_sub(node.allocated.extended(name)) < *want {
            return Err(insufficient(task, node, name));
        }
    }
    node.allocated.cpu_milli += task.request.cpu_milli;
    node.allocated.memory_bytes += task.request.memory_bytes;
    for (name, want) in &task.request.extended {
        add_extended(&mut node.allocated.extended, *name, *want as i128);
    }
    node.gpus.update(|gpus| {
        for d in devices {
            if let Some(g) = gpus.iter_mut().find(|g| g.index == d.gpu) {
                g.free_milli -= d.milli;
                g.free_memory_bytes = g.free_memory_bytes.saturating_sub(task.gpu.memory_bytes_per_gpu);
            }
        }
    });
    for d in devices {
        node.allocated.gpu_milli += u64::from(d.milli);
    }
    Ok(())
}

/// Undo [`bind`]. Quantities saturate at zero and device shares at a whole device, so releasing
/// twice cannot corrupt the node (it only under-counts until the next full sync).
pub fn release(node: &mut Node, task: &Task, devices: &[DeviceShare]) {
    node.allocated.cpu_milli = node.allocated.cpu_milli.saturating_sub(task.request.cpu_milli);
    node.allocated.memory_bytes = node.allocated.memory_bytes.saturating_sub(task.request.memory_bytes);
    for (name, want) in &task.request.extended {
        add_extended(&mut node.allocated.extended, *name, -(*want as i128));
    }
    node.gpus.update(|gpus| {
        for d in devices {
            if let Some(g) = gpus.iter_mut().find(|g| g.index == d.gpu) {
                g.free_milli = (g.free_milli + d.milli).min(GPU_MILLI);
                g.free_memory_bytes = (g.free_memory_bytes + task.gpu.memory_bytes_per_gpu).min(g.memory_bytes);
            }
        }
    });
    for d in devices {
        node.allocated.gpu_milli = node.allocated.gpu_milli.saturating_sub(u64::from(d.milli));
    }
}

/// Account `task` on `node` as a fact, not a decision: a pod that already runs. If it over-commits
/// the node (bound by another scheduler, or the node shrank) it still counts, saturating, so the
/// node shows as full rather than the pod being lost. [`release`] undoes it.
pub fn bind_fact(node: &mut Node, task: &Task, devices: &[DeviceShare]) {
    if bind(node, task, devices).is_ok() {
        return;
    }
    node.allocated.cpu_milli = node.allocated.cpu_milli.saturating_add(task.request.cpu_milli);
    node.allocated.memory_bytes = node.allocated.memory_bytes.saturating_add(task.request.memory_bytes);
    for (name, want) in &task.request.extended {
        add_extended(&mut node.allocated.extended, *name, *want as i128);
    }
    node.gpus.update(|gpus| {
        for d in devices {
            if let Some(g) = gpus.iter_mut().find(|g| g.index == d.gpu) {
                g.free_milli = g.free_milli.saturating_sub(d.milli);
                g.free_memory_bytes = g.free_memory_bytes.saturating_sub(task.gpu.memory_bytes_per_gpu);
            }
        }
    });
    for d in devices {
        node.allocated.gpu_milli = node.allocated.gpu_milli.saturating_add(u64::from(d.milli));
    }
}

fn add_extended(list: &mut wasmsched_api::Extended, name: ResourceName, delta: i128) {
    match list.binary_search_by(|(n, _)| n.cmp(&name)) {
        Ok(i) => list[i].1 = (list[i].1 as i128 + delta).clamp(0, u64::MAX as i128) as u64,
        Err(i) if delta > 0 => list.insert(i, (name, delta as u64)),
        Err(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::default_select_devices;
    use wasmsched_api::{GpuDevice, GpuRequest, Resources};

    fn node() -> Node {
        Node {
            name: "n".into(),
            allocatable: Resources { cpu_milli: 4000, memory_bytes: 1000, ..Default::default() },
            gpus: vec![
                GpuDevice { index: 0, free_milli: 1000, ..Default::default() },
                GpuDevice { index: 1, free_milli: 400, ..Default::default() },
                GpuDevice { index: 2, free_milli: 1000, ..Default::default() },
            ]
            .into(),
            ..Default::default()
        }
    }

    fn task(count: u32, milli: u32) -> Task {
        Task {
            id: "t".into(),
            gpu: GpuRequest { count, milli_per_gpu: milli, ..Default::default() },
            ..Default::default()
        }
    }

    #[test]
    fn shared_is_best_fit_whole_is_lowest_index() {
        let n = node();
        assert_eq!(default_select_devices(&task(1, 300), &n).unwrap(), vec![DeviceShare { gpu: 1, milli: 300 }]);
        assert_eq!(default_select_devices(&task(1, 500), &n).unwrap(), vec![DeviceShare { gpu: 0, milli: 500 }]);
        assert_eq!(
            default_select_devices(&task(2, 1000), &n).unwrap(),
            vec![DeviceShare { gpu: 0, milli: 1000 }, DeviceShare { gpu: 2, milli: 1000 }]
        );
        assert!(default_select_devices(&task(3, 1000), &n).is_err());
    }

    #[test]
    fn bind_refuses_double_booking_and_release_restores() {
        let mut n = node();
        let t = task(1, 1000);
        let d = [DeviceShare { gpu: 0, milli: 1000 }];
        bind(&mut n, &t, &d).unwrap();
        assert_eq!(n.gpus[0].free_milli, 0);
        assert!(matches!(bind(&mut n, &t, &d), Err(AllocError::Devices { .. })));
        release(&mut n, &t, &d);
        release(&mut n, &t, &d);
        assert_eq!(n.gpus[0].free_milli, 1000);
        assert_eq!(n.allocated.gpu_milli, 0);
        let mut big = task(0, 0);
        big.request.cpu_milli = 5000;
        assert!(matches!(bind(&mut n, &big, &[]), Err(AllocError::Insufficient { .. })));
    }
}
