//! DRA devices as a scheduler's resource counts: every DeviceClass is a countable resource, so
//! queues, quotas, fair share, gangs and preemption count DRA devices the way they count extended
//! resources, and the allocator then picks the devices on the node the count admitted.

use k8s_openapi::api::resource::v1::ResourceClaimSpec;

/// The extended-resource name under which a DeviceClass's devices are counted: the name Kubernetes
/// gives a class without an `extendedResourceName` of its own (KEP-5004).
pub fn class_resource(class: &str) -> wasmsched_api::ResourceName {
    wasmsched_api::ResourceName::new(&format!("deviceclass.resource.kubernetes.io/{class}"))
}

/// What a claim asks of each DeviceClass, as a count: `(class resource, devices)`. Exact counts;
/// for `firstAvailable` alternatives of one class, the smallest of their counts (the least it
/// will take). `All`, and alternatives across classes, cannot be counted ahead: the allocator
/// checks them on the node. Admin access holds no device and counts none.
pub fn class_counts(spec: &ResourceClaimSpec) -> Vec<(wasmsched_api::ResourceName, u64)> {
    let exact = |mode: &Option<String>| mode.as_deref().is_none_or(|m| m == "ExactCount");
    let mut wants: Vec<(wasmsched_api::ResourceName, u64)> = Vec::new();
    let mut add = |class: &str, n: u64| match wants.iter_mut().find(|(r, _)| *r == class_resource(class)) {
        Some((_, total)) => *total += n,
        None => wants.push((class_resource(class), n)),
    };
    for r in spec.devices.iter().flat_map(|d| d.requests.iter().flatten()) {
        if let Some(e) = &r.exactly {
            if exact(&e.allocation_mode) && e.admin_access != Some(true) {
                add(&e.device_class_name, e.count.unwrap_or(1).max(1) as u64);
            }
        } else if let Some(alternatives) = &r.first_available
            && let Some(first) = alternatives.first()
            && alternatives.iter().all(|a| a.device_class_name == first.device_class_name && exact(&a.allocation_mode))
        {
            let fewest = alternatives.iter().map(|a| a.count.unwrap_or(1).max(1)).min().unwrap_or(1);
            add(&first.device_class_name, fewest as u64);
        }
    }
    wants.sort();
    wants
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_counts_add_up_per_class_and_what_cannot_be_counted_is_left_to_the_allocator() {
        let spec: ResourceClaimSpec = serde_yaml_ng::from_str(
            "devices: {requests: [
               {name: a, exactly: {deviceClassName: gpu, count: 2}},
               {name: b, exactly: {deviceClassName: gpu}},
               {name: c, exactly: {deviceClassName: nic, allocationMode: All}},
               {name: d, exactly: {deviceClassName: gpu, adminAccess: true}},
               {name: e, firstAvailable: [{name: big, deviceClassName: gpu, count: 4}, {name: small, deviceClassName: gpu, count: 1}]},
               {name: f, firstAvailable: [{name: x, deviceClassName: gpu}, {name: y, deviceClassName: other}]}]}",
        )
        .unwrap();
        assert_eq!(class_counts(&spec), vec![(class_resource("gpu"), 4)]);
    }
}
