//! Accelerator kinds: NVIDIA GPUs, AMD GPUs, Intel Gaudi, Huawei Ascend, AWS Neuron, or an
//! operator's own (`accelerators` in the WIT).
//!
//! Every accelerator is a [`crate::GpuDevice`] on its node and every request for one a
//! [`crate::GpuRequest`]; both carry a `kind`, and a request only ever fits devices of its own
//! kind ([`crate::GpuRequest::fits_device`]). NVIDIA GPUs are the default kind, written as the
//! empty string, so a cluster of NVIDIA GPUs alone looks exactly as it did before kinds existed.
//!
//! A request of another kind also names the kind's resource in `request.extended` (e.g.
//! `amd.com/gpu: 2`, whole devices), as the kubelet counts it: a node's `allocatable.extended`
//! holds the same name, so a resource-fit filter that knows nothing of kinds still keeps an AMD
//! pod off a node without AMD GPUs, and a queue's quota for that name is a quota for that kind.
//! `gpu-milli` counts NVIDIA GPUs only, so a queue's `nvidia.com/gpu` quota is NVIDIA's alone.
//!
//! Components built before kinds existed keep working: the host never lets a task onto a node
//! without enough devices of its kind, and refuses a device choice of the wrong kind. Plugins that
//! want the kinds (a score that prefers one vendor, a device choice on a node with two) ask the
//! host through the SDK's `wasmsched_sdk::accelerators`.

/// A device's or a request's kind: an interned name (the empty name is NVIDIA's).
///
/// Every device carries one and every placement compares the request's with each device's. As a
/// `String` per device, that comparison read each device's own heap bytes — a cache miss per
/// device, and the two-vendor benchmark ran 30 times slower than NVIDIA's alone (BENCHMARKS.md,
/// "Two vendors"). Interned, equal kinds are one address compared first, and the bytes are read
/// once, hot (as [`crate::ResourceName`] does for resource names).
#[derive(Clone, Copy)]
pub struct KindName(&'static str);

impl KindName {
    /// The kind `name`, interned.
    pub fn new(name: &str) -> KindName {
        if name.is_empty() { KindName("") } else { KindName(crate::ResourceName::new(name).as_str()) }
    }

    /// The name (empty for NVIDIA's).
    #[inline]
    pub fn as_str(&self) -> &'static str {
        self.0
    }
}

impl Default for KindName {
    /// NVIDIA's (no interning: a default device costs no lock).
    fn default() -> Self {
        KindName("")
    }
}

impl std::ops::Deref for KindName {
    type Target = str;
    #[inline]
    fn deref(&self) -> &str {
        self.0
    }
}

impl PartialEq for KindName {
    /// NVIDIA's (empty) kinds by length alone, interned ones by address first: asked for every
    /// device a request is fitted to.
    #[inline]
    fn eq(&self, other: &KindName) -> bool {
        self.0.len() == other.0.len()
            && (self.0.is_empty() || std::ptr::eq(self.0.as_ptr(), other.0.as_ptr()) || self.0 == other.0)
    }
}

impl Eq for KindName {}

impl PartialEq<str> for KindName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for KindName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl std::hash::Hash for KindName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state)
    }
}

impl PartialOrd for KindName {
    fn partial_cmp(&self, other: &KindName) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for KindName {
    fn cmp(&self, other: &KindName) -> std::cmp::Ordering {
        self.0.cmp(other.0)
    }
}

impl std::fmt::Debug for KindName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.0, f)
    }
}

impl std::fmt::Display for KindName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl From<&str> for KindName {
    fn from(name: &str) -> KindName {
        KindName::new(name)
    }
}

impl From<&String> for KindName {
    fn from(name: &String) -> KindName {
        KindName::new(name)
    }
}

impl From<String> for KindName {
    fn from(name: String) -> KindName {
        KindName::new(&name)
    }
}

/// The default kind's name, as shown to people (devices and requests of it have an empty `kind`).
pub const NVIDIA: &str = "nvidia";

/// A kind's name for people: [`NVIDIA`] for the default (empty) kind, else the kind itself.
pub fn display_name(kind: &str) -> &str {
    if kind.is_empty() { NVIDIA } else { kind }
}

/// The kind as stored: the empty string for [`NVIDIA`], else `name` unchanged.
pub fn stored_name(name: &str) -> &str {
    if name == NVIDIA { "" } else { name }
}

/// One kind the host knows, as plugins see it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Kind {
    /// Its name (`nvidia`, `amd`, `gaudi`, …).
    pub name: String,
    /// The extended resources a request of it names in `request.extended` (none for NVIDIA,
    /// counted in `gpu-milli`).
    pub resources: Vec<String>,
}

/// The kind `request` asks for, stored form: the kind whose resource its extended resources name,
/// else NVIDIA's (empty). What a plugin reads when it did not get the kind from the host.
pub fn kind_of_request(kinds: &[Kind], request: &crate::Resources) -> KindName {
    kinds
        .iter()
        .find(|k| k.resources.iter().any(|r| request.extended(r) > 0))
        .map_or(KindName::default(), |k| KindName::new(stored_name(&k.name)))
}

/// What the host answers. Implemented by the scheduler core; the Wasm runtime forwards the
/// component's `accelerators` imports to it.
pub trait AcceleratorView: Send + Sync {
    /// The kinds the host knows besides NVIDIA's.
    fn kinds(&self) -> Vec<Kind>;
    /// The stored kind of each of `node`'s devices, by position in its `gpus`; None when all are
    /// NVIDIA's (or the host has no such node).
    fn device_kinds(&self, node: &str) -> Option<Vec<String>>;
}

call_view!(AcceleratorView);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_of_the_kind_whose_resource_it_names() {
        let kinds = [
            Kind { name: "amd".into(), resources: vec!["amd.com/gpu".into()] },
            Kind {
                name: "neuron".into(),
                resources: vec!["aws.amazon.com/neuron".into(), "aws.amazon.com/neuroncore".into()],
            },
        ];
        let asks = |name: &str| crate::Resources { extended: vec![(name.into(), 2)].into(), ..Default::default() };
        assert_eq!(kind_of_request(&kinds, &asks("aws.amazon.com/neuroncore")), "neuron");
        assert_eq!(kind_of_request(&kinds, &asks("amd.com/gpu")), "amd");
        assert_eq!(kind_of_request(&kinds, &asks("rdma/hca")), "", "no kind's resource: NVIDIA");
        assert_eq!(display_name(""), "nvidia");
        assert_eq!(stored_name("nvidia"), "");
        assert_eq!(stored_name("amd"), "amd");
    }
}
