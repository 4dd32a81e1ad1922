//! One resource on its socket: serve, register, and start over when the kubelet restarts.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use crate::v1beta1::device_plugin_server::{DevicePlugin, DevicePluginServer};
use crate::v1beta1::registration_client::RegistrationClient;
use crate::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerPreferredAllocationResponse, DevicePluginOptions, Empty,
    ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse, RegisterRequest,
};
use crate::{KUBELET_SOCKET, Refusal, Resource, VERSION};

/// How often the sockets are looked at: a kubelet restart is noticed within this.
const WATCH_EVERY: Duration = Duration::from_millis(250);
/// The longest wait between two registration attempts while the kubelet is away.
const RETRY_AT_MOST: Duration = Duration::from_secs(5);

/// What stops [`serve`] for good (a kubelet that is away or restarting is waited for, not an error).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The plugin's socket could not be created.
    #[error("creating the socket {path}: {source}")]
    Socket {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The kubelet answered the registration with an error (e.g. the resource is another
    /// plugin's, or the version is not one it speaks): trying again would get the same answer.
    #[error("the kubelet refused to register {resource}: {status}")]
    Refused {
        /// The resource.
        resource: String,
        /// Its answer.
        status: String,
    },
}

/// What [`serve`] reports of its life, for logs, metrics and tests: each registration the kubelet
/// accepted (the first, then one after every kubelet restart).
#[derive(Debug, Default)]
pub struct Served {
    registrations: watch::Sender<u64>,
}

impl Served {
    /// A fresh record.
    pub fn new() -> Arc<Served> {
        Arc::new(Served { registrations: watch::Sender::new(0) })
    }

    /// Registrations accepted so far; `changed()` wakes at the next one.
    pub fn registrations(&self) -> watch::Receiver<u64> {
        self.registrations.subscribe()
    }
}

/// The plugin's socket name for `resource`: `wasmsched-` and the name with `/` and `.` as `-`.
pub fn socket_name(resource: &str) -> String {
    let name: String = resource.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    format!("wasmsched-{name}.sock")
}

/// Serves `resource` in the kubelet's device-plugin directory `dir` until `stop` turns true:
/// listens on its own socket, registers with the kubelet, and does both again whenever the
/// kubelet restarts (its socket is recreated, or ours removed). Registration is retried while the
/// kubelet is not there; only a refusal by the kubelet ends it with an error.
pub async fn serve(
    resource: Arc<dyn Resource>,
    dir: PathBuf,
    mut stop: watch::Receiver<bool>,
    served: Arc<Served>,
) -> Result<(), ServeError> {
    let name = socket_name(resource.name());
    let socket = dir.join(&name);
    let kubelet = dir.join(KUBELET_SOCKET);
    loop {
        // One life: our socket, the server on it, then registration.
        let _ = std::fs::remove_file(&socket);
        let listener =
            UnixListener::bind(&socket).map_err(|source| ServeError::Socket { path: socket.clone(), source })?;
        let ours = inode(&socket);
        let (end_life, life_ended) = watch::channel(false);
        let service = Service { resource: resource.clone(), stop: life_ended.clone() };
        let mut server_stop = life_ended.clone();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(service))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = server_stop.wait_for(|ended| *ended).await;
                }),
        );

        let registered_with = match register_until_accepted(&kubelet, &name, resource.name(), &mut stop).await {
            Ok(Some(kubelet_inode)) => {
                served.registrations.send_modify(|n| *n += 1);
                tracing::info!(resource = resource.name(), socket = %socket.display(), "registered with the kubelet");
                Some(kubelet_inode)
            }
            Ok(None) => None,
            Err(e) => {
                let _ = end_life.send(true);
                let _ = server.await;
                let _ = std::fs::remove_file(&socket);
                return Err(e);
            }
        };

        // Live until asked to stop or until the kubelet restarts.
        let restarted = match registered_with {
            None => false,
            Some(kubelet_inode) => loop {
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => break false,
                    _ = tokio::time::sleep(WATCH_EVERY) => {
                        if inode(&socket) != ours || inode(&kubelet) != Some(kubelet_inode) {
                            break true;
                        }
                    }
                }
            },
        };
        let _ = end_life.send(true);
        let _ = server.await;
        if !restarted {
            let _ = std::fs::remove_file(&socket);
            return Ok(());
        }
        tracing::info!(resource = resource.name(), "the kubelet restarted; registering again");
    }
}

fn inode(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// Registers until the kubelet accepts (its socket's inode then) or `stop` (None).
async fn register_until_accepted(
    kubelet: &Path,
    endpoint: &str,
    resource: &str,
    stop: &mut watch::Receiver<bool>,
) -> Result<Option<u64>, ServeError> {
    let mut wait = Duration::from_millis(100);
    loop {
        if *stop.borrow() {
            return Ok(None);
        }
        let before = inode(kubelet);
        match register(kubelet, endpoint, resource).await {
            Ok(()) => return Ok(before.or_else(|| inode(kubelet))),
            Err(Attempt::Refused(status)) => {
                return Err(ServeError::Refused { resource: resource.to_string(), status: status.to_string() });
            }
            Err(Attempt::Away(why)) => {
                tracing::debug!(resource, %why, "kubelet not reachable yet");
            }
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return Ok(None),
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(RETRY_AT_MOST);
    }
}

enum Attempt {
    /// No kubelet to talk to (yet): try again.
    Away(String),
    /// The kubelet said no.
    Refused(Status),
}

async fn register(kubelet: &Path, endpoint: &str, resource: &str) -> Result<(), Attempt> {
    let channel = unix_channel(kubelet).await.map_err(|e| Attempt::Away(e.to_string()))?;
    let request = RegisterRequest {
        version: VERSION.into(),
        endpoint: endpoint.into(),
        resource_name: resource.into(),
        options: Some(options()),
    };
    match RegistrationClient::new(channel).register(request).await {
        Ok(_) => Ok(()),
        Err(status) if status.code() == tonic::Code::Unavailable => Err(Attempt::Away(status.to_string())),
        Err(status) => Err(Attempt::Refused(status)),
    }
}

/// A gRPC channel over the unix socket at `path` (the URI is a placeholder gRPC needs; the
/// connector ignores it).
pub(crate) async fn unix_channel(path: &Path) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}

fn options() -> DevicePluginOptions {
    DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true }
}

/// The gRPC service the kubelet calls, over one [`Resource`].
struct Service {
    resource: Arc<dyn Resource>,
    /// Ends the device-list streams with the life they belong to (a server does not stop while a
    /// stream it serves is open).
    stop: watch::Receiver<bool>,
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(&self, _: Request<Empty>) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<DeviceStream>, Status> {
        let devices = self.resource.devices();
        let stop = self.stop.clone();
        // The list as it is now, then again after every change, until this life ends.
        let stream = futures_util::stream::unfold((devices, stop, true), |(mut devices, mut stop, first)| async move {
            if !first {
                tokio::select! {
                    changed = devices.changed() => changed.ok()?,
                    _ = stop.wait_for(|s| *s) => return None,
                }
            }
            let list = ListAndWatchResponse { devices: devices.borrow_and_update().clone() };
            Some((Ok(list), (devices, stop, false)))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let resource = self.resource.clone();
        let requests = request.into_inner().container_requests;
        let container_responses = self
            .answer("GetPreferredAllocation", move || {
                requests
                    .iter()
                    .map(|c| {
                        let size = usize::try_from(c.allocation_size).unwrap_or(0);
                        let device_ids =
                            resource.preferred(&c.available_device_ids, &c.must_include_device_ids, size)?;
                        Ok(ContainerPreferredAllocationResponse { device_ids })
                    })
                    .collect::<Result<Vec<_>, Refusal>>()
            })
            .await?;
        Ok(Response::new(PreferredAllocationResponse { container_responses }))
    }

    async fn allocate(&self, request: Request<AllocateRequest>) -> Result<Response<AllocateResponse>, Status> {
        let resource = self.resource.clone();
        let requests = request.into_inner().container_requests;
        let container_responses = self
            .answer("Allocate", move || {
                requests.iter().map(|c| resource.allocate(&c.devices_ids)).collect::<Result<Vec<_>, Refusal>>()
            })
            .await?;
        Ok(Response::new(AllocateResponse { container_responses }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

impl Service {
    /// Runs a resource's answer to the kubelet's call `what` on the blocking pool (it may wait for
    /// the pod the call is for to be known); a refusal is the kubelet's `FailedPrecondition` with
    /// the reason (what the pod's events show). Its time is logged at debug: the kubelet has no
    /// metric for `GetPreferredAllocation`.
    async fn answer<T: Send + 'static>(
        &self,
        what: &'static str,
        call: impl FnOnce() -> Result<T, Refusal> + Send + 'static,
    ) -> Result<T, Status> {
        let started = std::time::Instant::now();
        let result = match tokio::task::spawn_blocking(call).await {
            Ok(result) => result.map_err(|r| Status::failed_precondition(r.0)),
            Err(e) => Err(Status::internal(format!("the device plugin's call failed: {e}"))),
        };
        let micros = started.elapsed().as_micros() as u64;
        tracing::debug!(resource = self.resource.name(), micros, "answered {what}");
        result
    }
}
