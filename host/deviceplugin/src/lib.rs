//! The kubelet's Device Plugin API, v1beta1: how a node's devices reach the kubelet, and how the
//! kubelet asks which of them a container gets.
//!
//! A [`Resource`] is one extended resource (`nvidia.com/gpu`, …): its devices and health, and the
//! answers to the kubelet's two questions — which devices it would prefer for a container
//! ([`Resource::preferred`]) and what the container runtime must do to expose the devices the
//! kubelet chose ([`Resource::allocate`]). [`serve`] puts a resource on a unix socket in the
//! kubelet's device-plugin directory, registers it with the kubelet, streams its device list, and
//! starts over when the kubelet restarts (a restarting kubelet deletes every plugin socket there and
//! recreates its own: a plugin that does not register again loses its resource on the node).
//!
//! The wire types are generated from `proto/deviceplugin-v1beta1.proto` ([`v1beta1`]).

mod serve;
pub mod v1beta1;

#[cfg(feature = "fake-kubelet")]
pub mod fake_kubelet;

pub use serve::{ServeError, Served, serve, socket_name};
pub use v1beta1::{ContainerAllocateResponse, Device};

/// The API version this crate speaks, sent at registration.
pub const VERSION: &str = "v1beta1";
/// The kubelet's registration socket, in its device-plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// The kubelet's device-plugin directory on a standard node.
pub const DEFAULT_DIR: &str = "/var/lib/kubelet/device-plugins";
/// A device the kubelet may give out.
pub const HEALTHY: &str = "Healthy";
/// A device the kubelet must not give out (containers already holding it keep it).
pub const UNHEALTHY: &str = "Unhealthy";

/// Why a resource refuses the kubelet: the kubelet fails the pod's admission with this message,
/// which shows in the pod's events (`UnexpectedAdmissionError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(pub String);

/// One extended resource served to the kubelet.
pub trait Resource: Send + Sync + 'static {
    /// The extended resource's name, e.g. `nvidia.com/gpu`.
    fn name(&self) -> &str;

    /// The devices and their health now; every change is sent to the kubelet as a new list.
    fn devices(&self) -> tokio::sync::watch::Receiver<Vec<Device>>;

    /// Which `size` devices of `available` (including `must_include`) one container should get.
    /// A refusal fails the pod's admission (`UnexpectedAdmissionError`, "GetPreferredAllocation rpc
    /// failed", seen on a real v1.36 kubelet). Where the kubelet does not ask (as many devices free
    /// as asked), [`Resource::allocate`] is where a wrong pick is refused.
    fn preferred(&self, available: &[String], must_include: &[String], size: usize) -> Result<Vec<String>, Refusal>;

    /// The kubelet gave `devices` to one container: what the runtime must set up for it.
    fn allocate(&self, devices: &[String]) -> Result<ContainerAllocateResponse, Refusal>;
}
