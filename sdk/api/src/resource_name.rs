//! Names of extended resources, interned.
//!
//! A filter asks every node it sees for the free amount of each extended resource a task
//! requests (`deviceclass.resource.kubernetes.io/gpu.nvidia.com`, say). With the name a `String`
//! on each node, that lookup read the node's list and then each name's own heap bytes: two
//! dependent cache misses per resource per node, and the largest cost of placing a DRA pod
//! (BENCHMARKS.md, "DRA inside `bench`"). An interned name is one `&'static str` for all nodes
//! and tasks, so names compare by address and their bytes are read once, hot.
//!
//! Interning keeps every distinct name for the life of the process, once: a cluster names a
//! handful of extended resources, and a stream of made-up names (pods asking for resources no
//! node has) costs their bytes once each — less than the pods that carried them.

use std::collections::BTreeSet;
use std::sync::Mutex;

static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());

/// An extended resource's name (`nvidia.com/gpu`, `deviceclass.resource.kubernetes.io/<class>`).
/// Cheap to copy; equal names are the same address, compared first.
#[derive(Clone, Copy)]
pub struct ResourceName(&'static str);

impl ResourceName {
    /// The name `name`, interned.
    pub fn new(name: &str) -> ResourceName {
        let mut names = NAMES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(&kept) = names.get(name) {
            return ResourceName(kept);
        }
        let kept: &'static str = Box::leak(name.to_owned().into_boxed_str());
        names.insert(kept);
        ResourceName(kept)
    }

    /// The name.
    #[inline]
    pub fn as_str(&self) -> &'static str {
        self.0
    }
}

impl std::ops::Deref for ResourceName {
    type Target = str;
    #[inline]
    fn deref(&self) -> &str {
        self.0
    }
}

impl AsRef<str> for ResourceName {
    fn as_ref(&self) -> &str {
        self.0
    }
}

impl std::borrow::Borrow<str> for ResourceName {
    fn borrow(&self) -> &str {
        self.0
    }
}

impl PartialEq for ResourceName {
    #[inline]
    fn eq(&self, other: &ResourceName) -> bool {
        crate::same_name(self.0, other.0)
    }
}

impl Eq for ResourceName {}

impl PartialEq<str> for ResourceName {
    fn eq(&self, other: &str) -> bool {
        crate::same_name(self.0, other)
    }
}

impl PartialEq<&str> for ResourceName {
    fn eq(&self, other: &&str) -> bool {
        crate::same_name(self.0, other)
    }
}

impl std::hash::Hash for ResourceName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state)
    }
}

impl PartialOrd for ResourceName {
    fn partial_cmp(&self, other: &ResourceName) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ResourceName {
    fn cmp(&self, other: &ResourceName) -> std::cmp::Ordering {
        self.0.cmp(other.0)
    }
}

impl std::fmt::Display for ResourceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::fmt::Debug for ResourceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.0, f)
    }
}

impl From<&str> for ResourceName {
    fn from(name: &str) -> ResourceName {
        ResourceName::new(name)
    }
}

impl From<&String> for ResourceName {
    fn from(name: &String) -> ResourceName {
        ResourceName::new(name)
    }
}

impl From<String> for ResourceName {
    fn from(name: String) -> ResourceName {
        ResourceName::new(&name)
    }
}

impl From<ResourceName> for String {
    fn from(name: ResourceName) -> String {
        name.0.to_owned()
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for ResourceName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for ResourceName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ResourceName, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Ok(ResourceName::new(&name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_names_are_one_address_and_compare_by_content_anyway() {
        let a = ResourceName::new("deviceclass.resource.kubernetes.io/gpu.nvidia.com");
        let b = ResourceName::from(String::from("deviceclass.resource.kubernetes.io/gpu.nvidia.com"));
        assert_eq!(a.as_str().as_ptr(), b.as_str().as_ptr());
        assert_eq!(a, b);
        assert_ne!(a, ResourceName::new("deviceclass.resource.kubernetes.io/gpu.nvidia.co"));
        assert!(ResourceName::new("a") < ResourceName::new("b"));
        assert_eq!(a, *"deviceclass.resource.kubernetes.io/gpu.nvidia.com");
        assert_eq!(format!("{a} {a:?}"), format!("{} {:?}", a.as_str(), a.as_str()));
    }
}
