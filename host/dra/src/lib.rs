//! Kubernetes Dynamic Resource Allocation (`resource.k8s.io/v1`), the way kube-scheduler's
//! structured-parameters allocator does it: the devices drivers publish in ResourceSlices
//! ([`inventory`]), CEL selectors over them ([`selector`]), and the allocator that gives a claim's
//! requests devices on a node ([`allocator`]). Offline tools read the same objects from files
//! ([`objects`]).
//!
//! No I/O against a cluster here: `wasmsched-kube` watches the objects and writes allocations.

pub mod allocator;
pub mod counted;
pub mod inventory;
pub mod node_selector;
pub mod objects;
pub mod quantity;
pub mod selector;
pub mod topology;

pub use allocator::{Allocation, Allocator, Funnel, PreparedClaim, Unsatisfied, explain};
pub use counted::{beyond_count, class_counts, class_resource, held_by_class};
pub use inventory::{Attribute, Device, DeviceId, Inventory, Reach, Refusal};
pub use objects::{Objects, ObjectsError};
pub use quantity::Quantity;
pub use selector::{Selector, SelectorError};
