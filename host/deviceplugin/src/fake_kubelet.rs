//! A stand-in for the kubelet's side of the Device Plugin API, over real unix sockets: the mock at
//! the narrowest boundary, for tests where no kubelet can run (CI).
//!
//! What it does as the kubelet's device manager does (checked against a real kubelet 1.36, whose
//! differences from the first version of this stand-in are the rules marked "real"): serves
//! `Registration` on `kubelet.sock`, connects back to each registered plugin and keeps its latest
//! `ListAndWatch` list; admits a container from the healthy devices no earlier container holds:
//! when exactly as many are free as asked, takes them all without asking the plugin (real);
//! otherwise asks `GetPreferredAllocation`, and an error there fails the admission (real: no
//! fallback), else takes the preferred devices that are free, then fills up from the rest (real);
//! calls `Allocate`, and holds the devices only when it succeeds (a refusal fails the admission).
//! [`FakeKubelet::restart`] removes every socket in the directory, as a starting kubelet does, and
//! serves a new `kubelet.sock`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use crate::serve::unix_channel;
use crate::v1beta1::device_plugin_client::DevicePluginClient;
use crate::v1beta1::registration_server::{Registration, RegistrationServer};
use crate::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse, ContainerPreferredAllocationRequest, Device,
    Empty, PreferredAllocationRequest, RegisterRequest,
};
use crate::{HEALTHY, KUBELET_SOCKET, VERSION};

/// `f`, or a panic after 10 s: a test waiting on the kubelet fails instead of hanging.
pub async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(10), f).await.expect("within 10 s")
}

/// Asks `f` every 25 ms until it gives a value; panics naming `what` after 10 s.
pub async fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    for _ in 0..400 {
        if let Some(v) = f() {
            return v;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

/// One registered resource as the fake kubelet knows it.
#[derive(Default)]
struct Plugin {
    endpoint: String,
    devices: Option<watch::Sender<Vec<Device>>>,
    /// Devices held by admitted containers.
    held: BTreeSet<String>,
}

#[derive(Default)]
struct State {
    plugins: BTreeMap<String, Plugin>,
    registrations: Vec<RegisterRequest>,
}

/// What one admission got.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// What `GetPreferredAllocation` answered (empty when it was not asked: exactly as many
    /// devices free as needed).
    pub preferred: Vec<String>,
    /// The devices the container got.
    pub devices: Vec<String>,
    /// What `Allocate` answered for it.
    pub response: ContainerAllocateResponse,
}

/// The stand-in kubelet.
pub struct FakeKubelet {
    dir: PathBuf,
    state: Arc<Mutex<State>>,
    stop: Option<watch::Sender<bool>>,
    version: String,
}

impl FakeKubelet {
    /// Serves `kubelet.sock` in `dir`.
    pub async fn start(dir: &Path) -> FakeKubelet {
        FakeKubelet::speaking(dir, VERSION).await
    }

    /// A kubelet that speaks device-plugin API `version` only, as a newer kubelet that dropped
    /// ours would: it refuses any other version's registration, as the real one does.
    pub async fn speaking(dir: &Path, version: &str) -> FakeKubelet {
        let mut kubelet =
            FakeKubelet { dir: dir.to_path_buf(), state: Arc::default(), stop: None, version: version.into() };
        kubelet.listen();
        kubelet
    }

    fn listen(&mut self) {
        let socket = self.dir.join(KUBELET_SOCKET);
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).expect("bind kubelet.sock");
        let (stop, mut stopped) = watch::channel(false);
        let service = RegistrationService {
            dir: self.dir.clone(),
            state: self.state.clone(),
            stop: stopped.clone(),
            version: self.version.clone(),
        };
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(service))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = stopped.wait_for(|s| *s).await;
                }),
        );
        self.stop = Some(stop);
    }

    /// As a restarting kubelet: stops serving, removes every socket in its directory (the plugins'
    /// too), forgets what it knew of the plugins (their devices held stay held: the real kubelet
    /// keeps them in its checkpoint) and serves a new `kubelet.sock`.
    pub async fn restart(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        for plugin in self.state.lock().unwrap().plugins.values_mut() {
            plugin.devices = None;
        }
        self.listen();
    }

    /// Every registration request received, in order.
    pub fn registrations(&self) -> Vec<RegisterRequest> {
        self.state.lock().unwrap().registrations.clone()
    }

    /// The latest device list of `resource`, and its changes (waits for the plugin's registration).
    pub async fn devices(&self, resource: &str) -> watch::Receiver<Vec<Device>> {
        until(&format!("{resource} to register with the fake kubelet"), || {
            self.state.lock().unwrap().plugins.get(resource).and_then(|p| p.devices.as_ref()).map(|d| d.subscribe())
        })
        .await
    }

    /// Admits one container asking for `size` devices of `resource`, as the device manager does.
    pub async fn admit(&self, resource: &str, size: usize) -> Result<Admitted, Status> {
        let (endpoint, available) = {
            let state = self.state.lock().unwrap();
            let plugin = state.plugins.get(resource).ok_or_else(|| Status::not_found("resource not registered"))?;
            let devices = plugin.devices.as_ref().map(|d| d.borrow().clone()).unwrap_or_default();
            let available: Vec<String> = devices
                .into_iter()
                .filter(|d| d.health == HEALTHY && !plugin.held.contains(&d.id))
                .map(|d| d.id)
                .collect();
            (plugin.endpoint.clone(), available)
        };
        if available.len() < size {
            return Err(Status::resource_exhausted(format!(
                "requested {size} of {resource}, {} available",
                available.len()
            )));
        }
        let mut client = DevicePluginClient::new(
            unix_channel(&self.dir.join(&endpoint)).await.map_err(|e| Status::unavailable(e.to_string()))?,
        );
        let (preferred, devices) = if available.len() == size {
            (Vec::new(), available)
        } else {
            let request = PreferredAllocationRequest {
                container_requests: vec![ContainerPreferredAllocationRequest {
                    available_device_ids: available.clone(),
                    must_include_device_ids: vec![],
                    allocation_size: size as i32,
                }],
            };
            let preferred = client
                .get_preferred_allocation(request)
                .await?
                .into_inner()
                .container_responses
                .into_iter()
                .next()
                .map(|c| c.device_ids)
                .unwrap_or_default();
            let mut devices: Vec<String> = Vec::with_capacity(size);
            for d in preferred.iter().chain(available.iter()) {
                if devices.len() < size && available.contains(d) && !devices.contains(d) {
                    devices.push(d.clone());
                }
            }
            (preferred, devices)
        };
        let response = client
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest { devices_ids: devices.clone() }],
            })
            .await?
            .into_inner()
            .container_responses
            .into_iter()
            .next()
            .ok_or_else(|| Status::internal("no container response"))?;
        let mut state = self.state.lock().unwrap();
        let plugin = state.plugins.get_mut(resource).ok_or_else(|| Status::not_found("resource gone"))?;
        plugin.held.extend(devices.iter().cloned());
        Ok(Admitted { preferred, devices, response })
    }

    /// The devices of `resource` that admitted containers hold (its PodResources view).
    pub fn held(&self, resource: &str) -> BTreeSet<String> {
        self.state.lock().unwrap().plugins.get(resource).map(|p| p.held.clone()).unwrap_or_default()
    }

    /// A container ended: its devices are free again.
    pub fn release(&self, resource: &str, devices: &[String]) {
        if let Some(p) = self.state.lock().unwrap().plugins.get_mut(resource) {
            for d in devices {
                p.held.remove(d);
            }
        }
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
    }
}

struct RegistrationService {
    dir: PathBuf,
    state: Arc<Mutex<State>>,
    stop: watch::Receiver<bool>,
    version: String,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        if request.version != self.version {
            return Err(Status::invalid_argument(format!("unsupported version {}", request.version)));
        }
        let (devices, _) = watch::channel(Vec::new());
        {
            let mut state = self.state.lock().unwrap();
            state.registrations.push(request.clone());
            let plugin = state.plugins.entry(request.resource_name.clone()).or_default();
            plugin.endpoint = request.endpoint.clone();
            plugin.devices = Some(devices.clone());
        }
        // As the kubelet: connect back and follow the plugin's device list.
        let socket = self.dir.join(&request.endpoint);
        let mut stop = self.stop.clone();
        tokio::spawn(async move {
            let Ok(channel) = unix_channel(&socket).await else { return };
            let Ok(stream) = DevicePluginClient::new(channel).list_and_watch(Empty {}).await else { return };
            let mut stream = stream.into_inner();
            loop {
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    next = stream.message() => match next {
                        Ok(Some(list)) => { devices.send_replace(list.devices); }
                        _ => return,
                    },
                }
            }
        });
        Ok(Response::new(Empty {}))
    }
}
