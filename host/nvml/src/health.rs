//! GPU health from XID errors: which XIDs mean the device is broken, and a watcher thread that
//! waits on NVML's event set and reports them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Sender, sync_channel};
use std::thread::JoinHandle;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use serde::{Deserialize, Serialize};

use crate::{Error, Session};

/// What an XID says about the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Health {
    /// The error was the application's (a bad kernel, a page fault): the device is fine.
    Healthy,
    /// Usable, but worth draining (correctable ECC storms, pending page retirement, NVLink errors).
    Degraded,
    /// Do not place work on it (double-bit ECC, fallen off the bus, GSP failure, …).
    Unhealthy,
}

/// Classifies an XID (NVIDIA's XID catalogue). Application-caused XIDs are healthy, as in
/// NVIDIA's device plugin; XIDs not listed count as unhealthy, because an unknown hardware error
/// is safer drained than trusted.
pub fn classify_xid(xid: u64) -> (Health, &'static str) {
    match xid {
        13 => (Health::Healthy, "graphics engine exception (application)"),
        31 => (Health::Healthy, "GPU memory page fault (application)"),
        43 => (Health::Healthy, "GPU stopped processing (application)"),
        45 => (Health::Healthy, "preemptive cleanup after a previous error"),
        68 => (Health::Healthy, "video decoder exception (application)"),
        109 => (Health::Healthy, "context switch timeout (application)"),
        63 => (Health::Degraded, "ECC page retirement or row remapping recorded"),
        74 => (Health::Degraded, "NVLink error"),
        92 => (Health::Degraded, "high single-bit ECC error rate"),
        94 => (Health::Degraded, "contained ECC error"),
        48 => (Health::Unhealthy, "double-bit ECC error"),
        64 => (Health::Unhealthy, "ECC page retirement or row remapping failure"),
        79 => (Health::Unhealthy, "GPU has fallen off the bus"),
        95 => (Health::Unhealthy, "uncontained ECC error"),
        119 | 120 => (Health::Unhealthy, "GSP firmware error"),
        _ => (Health::Unhealthy, "unclassified XID"),
    }
}

/// One XID seen on one device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct XidEvent {
    /// UUID of the device.
    pub uuid: String,
    /// The XID, None when NVML could not say which.
    pub xid: Option<u64>,
    /// What it means for the device.
    pub health: Health,
    /// Why.
    pub description: String,
}

/// A thread waiting on NVML's critical-XID events. Dropping it stops the thread within a second.
pub struct XidWatcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl XidWatcher {
    /// Opens its own NVML session, registers every device for critical XID events, and sends each
    /// event to `events`. Fails like [`Session::open`] without a driver.
    pub fn spawn(events: Sender<XidEvent>) -> Result<XidWatcher, Error> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = sync_channel::<Result<(), Error>>(1);
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("nvml-xid".into())
            .spawn(move || {
                let session = match Session::open() {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let nvml = session.nvml();
                let setup = || -> Result<_, NvmlError> {
                    let mut set = nvml.create_event_set()?;
                    for index in 0..nvml.device_count()? {
                        let device = nvml.device_by_index(index)?;
                        set = device.register_events(EventTypes::CRITICAL_XID_ERROR, set).map_err(|e| e.error)?;
                    }
                    Ok(set)
                };
                let set = match setup() {
                    Ok(set) => set,
                    Err(e) => {
                        let _ = ready_tx
                            .send(Err(Error::Call { what: "XID event registration".into(), reason: e.to_string() }));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                while !flag.load(Ordering::Relaxed) {
                    match set.wait(1000) {
                        Ok(event) => {
                            let xid = match event.event_data {
                                Some(XidError::Value(v)) => Some(v),
                                _ => None,
                            };
                            let (health, description) = xid.map_or((Health::Unhealthy, "unknown XID"), classify_xid);
                            let uuid = event.device.uuid().unwrap_or_default();
                            tracing::warn!(%uuid, ?xid, ?health, description, "GPU XID");
                            let sent = events.send(XidEvent { uuid, xid, health, description: description.into() });
                            if sent.is_err() {
                                return;
                            }
                        }
                        Err(NvmlError::Timeout) => {}
                        Err(e) => {
                            tracing::error!(error = %e, "waiting for NVML events failed; XID watcher stops");
                            return;
                        }
                    }
                }
            })
            .map_err(|e| Error::Call { what: "starting the XID watcher".into(), reason: e.to_string() })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(XidWatcher { stop, thread: Some(thread) }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(Error::Call { what: "starting the XID watcher".into(), reason: "the thread died".into() }),
        }
    }
}

impl Drop for XidWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
