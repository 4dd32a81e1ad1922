//! DRA devices as a scheduler's resource counts: every DeviceClass is a countable resource, so
//! queues, quotas, fair share, gangs and preemption count DRA devices the way they count extended
//! resources, and the allocator then picks the devices on the node the count admitted.

use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaimSpec};

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

/// What `allocation` holds of each DeviceClass, by class resource: a running pod's claims, counted
/// as its own when a scheduler takes it over. Admin access holds none.
pub fn held_by_class(
    spec: &ResourceClaimSpec,
    allocation: &AllocationResult,
) -> Vec<(wasmsched_api::ResourceName, u64)> {
    let mut class_of: Vec<(String, &str)> = Vec::new();
    for r in spec.devices.iter().flat_map(|d| d.requests.iter().flatten()) {
        if let Some(e) = &r.exactly {
            class_of.push((r.name.clone(), &e.device_class_name));
        }
        for a in r.first_available.iter().flatten() {
            class_of.push((format!("{}/{}", r.name, a.name), &a.device_class_name));
        }
    }
    let mut held: Vec<(wasmsched_api::ResourceName, u64)> = Vec::new();
    for result in allocation.devices.iter().flat_map(|d| d.results.iter().flatten()) {
        if result.admin_access == Some(true) {
            continue;
        }
        let Some((_, class)) = class_of.iter().find(|(name, _)| *name == result.request) else { continue };
        let resource = class_resource(class);
        match held.iter_mut().find(|(r, _)| *r == resource) {
            Some((_, n)) => *n += 1,
            None => held.push((resource, 1)),
        }
    }
    held.sort();
    held
}

/// What `allocation` holds of each DeviceClass beyond what [`class_counts`] counted ahead for the
/// claim: the devices of an `All` request, of a larger `firstAvailable` alternative than the
/// smallest, of alternatives across classes.
pub fn beyond_count(
    spec: &ResourceClaimSpec,
    allocation: &AllocationResult,
) -> Vec<(wasmsched_api::ResourceName, u64)> {
    let counted = class_counts(spec);
    held_by_class(spec, allocation)
        .into_iter()
        .filter_map(|(r, n)| {
            let ahead = counted.iter().find(|(c, _)| *c == r).map_or(0, |(_, k)| *k);
            (n > ahead).then(|| (r, n - ahead))
        })
        .collect()
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

    #[test]
    fn what_an_allocation_holds_beyond_the_count_is_the_all_requests_and_the_larger_alternatives() {
        let spec: ResourceClaimSpec = serde_yaml_ng::from_str(
            "devices: {requests: [
               {name: a, exactly: {deviceClassName: gpu, count: 2}},
               {name: c, exactly: {deviceClassName: nic, allocationMode: All}},
               {name: d, exactly: {deviceClassName: gpu, adminAccess: true}},
               {name: e, firstAvailable: [{name: big, deviceClassName: gpu, count: 4}, {name: small, deviceClassName: gpu, count: 1}]}]}",
        )
        .unwrap();
        let results = |requests: &[&str]| -> AllocationResult {
            let results: Vec<serde_json::Value> = requests
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let admin = *r == "d";
                    serde_json::json!({"request": r, "driver": "x", "pool": "p", "device": format!("d{i}"), "adminAccess": admin})
                })
                .collect();
            serde_json::from_value(serde_json::json!({"devices": {"results": results}})).unwrap()
        };
        // Counted ahead: 2 + 1 GPUs. The larger alternative took 4, the All request 3 NICs.
        let big = results(&["a", "a", "c", "c", "c", "d", "e/big", "e/big", "e/big", "e/big"]);
        assert_eq!(beyond_count(&spec, &big), vec![(class_resource("gpu"), 3), (class_resource("nic"), 3)]);
        // The smallest alternative: nothing beyond the count but the NICs.
        let small = results(&["a", "a", "c", "d", "e/small"]);
        assert_eq!(beyond_count(&spec, &small), vec![(class_resource("nic"), 1)]);
        // All it holds, admin access aside: what a running pod's claim counts after a restart.
        assert_eq!(held_by_class(&spec, &big), vec![(class_resource("gpu"), 6), (class_resource("nic"), 3)]);
    }
}
