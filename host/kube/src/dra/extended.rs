//! Extended resources served by DRA (KEP-5004): a pod asking `nvidia.com/gpu: 2` on a node that
//! does not offer that resource itself gets the devices of a DeviceClass whose
//! `extendedResourceName` is `nvidia.com/gpu` (or whose implicit name,
//! `deviceclass.resource.kubernetes.io/<class>`, the pod asks for), through a ResourceClaim the
//! scheduler creates for the pod. The claim's requests and the pod's container mappings are made
//! exactly as kube-scheduler makes them, so the kubelet finds each container's devices the same way.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ContainerExtendedResourceRequest, Pod};
use k8s_openapi::api::resource::v1::{DeviceRequest, ExactDeviceRequest};

/// Annotation on the claim made for a pod's extended resources (with the pod as its controller).
pub const CLAIM_ANNOTATION: &str = "resource.kubernetes.io/extended-resource-claim";

/// One container's resource requests, as the mapping reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerRequests {
    /// Its name.
    pub name: String,
    /// An init container that is not a sidecar: it runs before the others and may use devices
    /// they ask for.
    pub short_lived: bool,
    /// Every resource it requests (sorted by name: a request's index names the claim request),
    /// with the whole quantity (0 when not whole).
    pub requests: BTreeMap<String, i64>,
}

/// The containers of `pod` (init containers first), when any asks for an extended resource (a
/// name with a domain, outside `kubernetes.io`); else none.
pub fn containers(pod: &Pod) -> Vec<ContainerRequests> {
    let Some(spec) = &pod.spec else { return Vec::new() };
    let inits = spec.init_containers.iter().flatten().map(|c| (c, true));
    let all: Vec<ContainerRequests> = inits
        .chain(spec.containers.iter().map(|c| (c, false)))
        .map(|(c, init)| {
            let resources = c.resources.as_ref();
            // The API server defaults requests to limits for extended resources.
            let mut list = resources.and_then(|r| r.limits.clone()).unwrap_or_default();
            list.extend(resources.and_then(|r| r.requests.clone()).unwrap_or_default());
            let requests = list
                .into_iter()
                .map(|(name, q)| {
                    let whole = q.0.parse::<i64>().unwrap_or(0);
                    (name, whole)
                })
                .collect();
            ContainerRequests {
                name: c.name.clone(),
                short_lived: init && c.restart_policy.as_deref() != Some("Always"),
                requests,
            }
        })
        .collect();
    if all.iter().any(|c| c.requests.keys().any(|n| is_extended(n))) { all } else { Vec::new() }
}

/// Whether `name` is an extended resource DRA may serve.
pub fn is_extended(name: &str) -> bool {
    name.contains('/') && !name.starts_with("kubernetes.io/") && !name.starts_with("requests.")
}

/// The device requests of the claim for `served` (resource → DeviceClass) and which container
/// uses which request: one request per long-lived container and resource
/// (`container-<index>-request-<index of the resource among its requests>`); init containers
/// that are not sidecars first use what later containers ask for and share one request for the rest.
pub fn requests_and_mappings(
    containers: &[ContainerRequests],
    served: &BTreeMap<String, String>,
) -> (Vec<DeviceRequest>, Vec<ContainerExtendedResourceRequest>) {
    let mut requests = Vec::new();
    let mut mappings = Vec::new();
    for (resource, class) in served {
        let mut long_lived: Vec<Option<DeviceRequest>> = vec![None; containers.len()];
        let mut long_maps = Vec::new();
        for (i, c) in containers.iter().enumerate().filter(|(_, c)| !c.short_lived) {
            let (request, maps) = one(i, c, resource, class, &[]);
            long_lived[i] = request;
            long_maps.extend(maps);
        }
        let mut largest: Option<DeviceRequest> = None;
        let mut short_names = BTreeSet::new();
        let mut short_maps = Vec::new();
        for (i, c) in containers.iter().enumerate().filter(|(_, c)| c.short_lived) {
            let (request, maps) = one(i, c, resource, class, &long_lived[i..]);
            if let Some(r) = request {
                short_names.insert(r.name.clone());
                if largest.as_ref().is_none_or(|l| count(l) < count(&r)) {
                    largest = Some(r);
                }
            }
            short_maps.extend(maps);
        }
        if let Some(l) = &largest
            && short_names.len() > 1
        {
            short_names.remove(&l.name);
            for m in short_maps
                .iter_mut()
                .filter(|m: &&mut ContainerExtendedResourceRequest| short_names.contains(&m.request_name))
            {
                m.request_name = l.name.clone();
            }
        }
        requests.extend(largest);
        requests.extend(long_lived.into_iter().flatten());
        mappings.extend(long_maps);
        mappings.extend(short_maps);
    }
    requests.sort_by(|a, b| a.name.cmp(&b.name));
    (requests, mappings)
}

fn count(r: &DeviceRequest) -> i64 {
    r.exactly.as_ref().and_then(|e| e.count).unwrap_or(0)
}

/// Container `index`'s request for `resource`, after what `reusable` requests already give it,
/// and its mappings.
fn one(
    index: usize,
    container: &ContainerRequests,
    resource: &str,
    class: &str,
    reusable: &[Option<DeviceRequest>],
) -> (Option<DeviceRequest>, Vec<ContainerExtendedResourceRequest>) {
    let wanted = container.requests.get(resource).copied().unwrap_or(0);
    if wanted == 0 {
        return (None, Vec::new());
    }
    let mapping = |request: &str| ContainerExtendedResourceRequest {
        container_name: container.name.clone(),
        resource_name: resource.to_string(),
        request_name: request.to_string(),
    };
    let mut maps = Vec::new();
    let mut given = 0;
    for r in reusable.iter().flatten() {
        given += count(r);
        maps.push(mapping(&r.name));
        if given >= wanted {
            return (None, maps);
        }
    }
    let position = container.requests.keys().position(|k| k == resource).unwrap_or(0);
    let name = format!("container-{index}-request-{position}");
    maps.push(mapping(&name));
    let request = DeviceRequest {
        name,
        exactly: Some(ExactDeviceRequest {
            device_class_name: class.to_string(),
            allocation_mode: Some("ExactCount".into()),
            count: Some(wanted - given),
            ..Default::default()
        }),
        ..Default::default()
    };
    (Some(request), maps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(name: &str, short_lived: bool, requests: &[(&str, i64)]) -> ContainerRequests {
        let requests = requests.iter().map(|(n, v)| (n.to_string(), *v)).collect();
        ContainerRequests { name: name.into(), short_lived, requests }
    }

    fn served() -> BTreeMap<String, String> {
        [("nvidia.com/gpu".to_string(), "gpu.nvidia.com".to_string())].into()
    }

    #[test]
    fn each_long_lived_container_gets_its_own_request_named_by_indices() {
        let containers = [
            container("a", false, &[("cpu", 1), ("memory", 0), ("nvidia.com/gpu", 2)]),
            container("b", false, &[("nvidia.com/gpu", 1)]),
            container("c", false, &[("cpu", 1)]),
        ];
        let (requests, maps) = requests_and_mappings(&containers, &served());
        let got: Vec<(String, i64)> = requests.iter().map(|r| (r.name.clone(), count(r))).collect();
        assert_eq!(got, [("container-0-request-2".into(), 2), ("container-1-request-0".into(), 1)]);
        let maps: Vec<(&str, &str)> =
            maps.iter().map(|m| (m.container_name.as_str(), m.request_name.as_str())).collect();
        assert_eq!(maps, [("a", "container-0-request-2"), ("b", "container-1-request-0")]);
    }

    #[test]
    fn init_containers_reuse_later_requests_and_share_the_largest_of_the_rest() {
        // init0 needs 1 (the main container's 2 cover it); init1 needs 4: 2 reused, 2 of its own;
        // init2 needs 3: 2 reused, 1 of its own, which the larger init request replaces.
        let containers = [
            container("init0", true, &[("nvidia.com/gpu", 1)]),
            container("init1", true, &[("nvidia.com/gpu", 4)]),
            container("init2", true, &[("nvidia.com/gpu", 3)]),
            container("main", false, &[("nvidia.com/gpu", 2)]),
        ];
        let (requests, maps) = requests_and_mappings(&containers, &served());
        let got: Vec<(String, i64)> = requests.iter().map(|r| (r.name.clone(), count(r))).collect();
        assert_eq!(got, [("container-1-request-0".into(), 2), ("container-3-request-0".into(), 2)]);
        let maps: Vec<(&str, &str)> =
            maps.iter().map(|m| (m.container_name.as_str(), m.request_name.as_str())).collect();
        assert_eq!(
            maps,
            [
                ("main", "container-3-request-0"),
                ("init0", "container-3-request-0"),
                ("init1", "container-3-request-0"),
                ("init1", "container-1-request-0"),
                ("init2", "container-3-request-0"),
                ("init2", "container-1-request-0"),
            ]
        );
    }
}
