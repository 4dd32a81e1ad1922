//! `serve` against the stand-in kubelet (`fake_kubelet`, the mock at the kubelet's gRPC boundary)
//! over real unix sockets: registration, the device list and its changes, re-registration after a
//! kubelet restart, and the socket gone when the plugin stops.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use wasmsched_deviceplugin::fake_kubelet::{FakeKubelet, until, within};
use wasmsched_deviceplugin::{ContainerAllocateResponse, Device, HEALTHY, Refusal, Resource, Served, UNHEALTHY};

/// Devices `d0`…; prefers the last ones offered; refuses `d0`.
struct Plain {
    devices: watch::Sender<Vec<Device>>,
    allocated: Mutex<Vec<Vec<String>>>,
}

fn device(id: &str, health: &str) -> Device {
    Device { id: id.into(), health: health.into(), topology: None }
}

impl Resource for Plain {
    fn name(&self) -> &str {
        "example.com/thing"
    }
    fn devices(&self) -> watch::Receiver<Vec<Device>> {
        self.devices.subscribe()
    }
    fn preferred(&self, available: &[String], _: &[String], size: usize) -> Result<Vec<String>, Refusal> {
        Ok(available[available.len() - size..].to_vec())
    }
    fn allocate(&self, devices: &[String]) -> Result<ContainerAllocateResponse, Refusal> {
        if devices.iter().any(|d| d == "d0") {
            return Err(Refusal("d0 is never given".into()));
        }
        self.allocated.lock().unwrap().push(devices.to_vec());
        let mut r = ContainerAllocateResponse::default();
        r.envs.insert("THINGS".into(), devices.join(","));
        Ok(r)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_lists_allocates_and_registers_again_after_a_kubelet_restart() {
    let dir = tempfile::tempdir().unwrap();
    let plain = Arc::new(Plain {
        devices: watch::Sender::new(vec![device("d0", HEALTHY), device("d1", HEALTHY), device("d2", HEALTHY)]),
        allocated: Mutex::default(),
    });
    // The plugin starts before the kubelet: it waits for it.
    let (stop, stopped) = watch::channel(false);
    let served = Served::new();
    let server =
        tokio::spawn(wasmsched_deviceplugin::serve(plain.clone(), dir.path().to_path_buf(), stopped, served.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut kubelet = FakeKubelet::start(dir.path()).await;

    let mut registrations = served.registrations();
    within(registrations.wait_for(|n| *n == 1)).await.unwrap();
    let sent = kubelet.registrations();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].version, "v1beta1");
    assert_eq!(sent[0].resource_name, "example.com/thing");
    assert_eq!(sent[0].endpoint, "wasmsched-example-com-thing.sock");
    assert!(sent[0].options.unwrap().get_preferred_allocation_available);

    let list = kubelet.devices("example.com/thing").await;
    let ids = |l: &watch::Receiver<Vec<Device>>| l.borrow().iter().map(|d| d.id.clone()).collect::<Vec<_>>();
    until("the first list", || (ids(&list).len() == 3).then_some(())).await;

    // The preferred devices are taken; the runtime gets what allocate answered.
    let admitted = kubelet.admit("example.com/thing", 2).await.unwrap();
    assert_eq!(admitted.preferred, ["d1", "d2"]);
    assert_eq!(admitted.devices, ["d1", "d2"]);
    assert_eq!(admitted.response.envs["THINGS"], "d1,d2");
    // A refusal fails the admission and holds nothing.
    let refused = kubelet.admit("example.com/thing", 1).await.unwrap_err();
    assert!(refused.message().contains("d0 is never given"), "{refused:?}");
    assert_eq!(kubelet.held("example.com/thing").len(), 2);

    // A health change reaches the kubelet as a new list.
    plain.devices.send_replace(vec![device("d0", HEALTHY), device("d1", HEALTHY), device("d2", UNHEALTHY)]);
    until("the health change", || (list.borrow().iter().any(|d| d.health == UNHEALTHY)).then_some(())).await;

    // The kubelet restarts (every socket in its directory removed): the plugin serves and
    // registers again, and the kubelet follows its list again.
    kubelet.restart().await;
    within(registrations.wait_for(|n| *n == 2)).await.unwrap();
    assert_eq!(kubelet.registrations().len(), 2);
    let list = kubelet.devices("example.com/thing").await;
    until("the list after the restart", || (ids(&list).len() == 3).then_some(())).await;
    plain.devices.send_replace(vec![device("d0", HEALTHY), device("d1", HEALTHY)]);
    until("a change after the restart", || (ids(&list).len() == 2).then_some(())).await;

    // Stopping ends it and removes its socket.
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server).await.unwrap().unwrap().unwrap();
    assert!(!dir.path().join("wasmsched-example-com-thing.sock").exists());
    assert_eq!(plain.allocated.lock().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_stopped_while_the_kubelet_is_away_ends_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let plain = Arc::new(Plain { devices: watch::Sender::new(vec![]), allocated: Mutex::default() });
    let (stop, stopped) = watch::channel(false);
    let served = Served::new();
    let server = tokio::spawn(wasmsched_deviceplugin::serve(plain, dir.path().to_path_buf(), stopped, served.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(*served.registrations().borrow(), 0);
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server).await.unwrap().unwrap().unwrap();
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "no socket left behind");
}
