//! NVML without a GPU: a clear error, never a panic; and the NVML → topology conversion, checked
//! against `nvidia-smi topo -m` of the same machines (what nvidia-smi itself derives from NVML).
//! On a host with a driver, discovery must succeed and agree with its own conversion.

use wasmsched_nvml::{
    Device, Error, Health, Inventory, NvLinkPort, PathLevel, Session, XidWatcher, classify_xid, normalise_bus_id,
};
use wasmsched_topology::{Link, NodeTopology, smi};

fn fixture(name: &str) -> NodeTopology {
    let path = format!("{}/../topology/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    smi::parse(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn without_a_driver_open_says_why() {
    match Session::open() {
        // A GPU host (the lent device machine): discovery works and converts.
        Ok(session) => {
            let inventory = session.inventory().expect("inventory on a GPU host");
            assert!(!inventory.devices.is_empty());
            inventory.topology().expect("topology from NVML");
            assert_eq!(session.telemetry().unwrap().len(), inventory.devices.len());
        }
        Err(Error::Unavailable(reason)) => {
            assert!(reason.contains("libnvidia-ml") || reason.contains("driver"), "{reason}")
        }
        Err(other) => panic!("expected Unavailable, got {other}"),
    }
}

#[test]
fn a_library_that_is_not_nvml_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("libnvidia-ml.so.1");
    std::fs::write(&fake, b"not a shared object").unwrap();
    match Session::open_library(&fake) {
        Err(Error::Unavailable(reason)) => assert!(reason.contains("could not be loaded"), "{reason}"),
        Err(other) => panic!("expected Unavailable, got {other}"),
        Ok(_) => panic!("a text file loaded as NVML"),
    }
    assert!(matches!(Session::open_library(&dir.path().join("missing.so")), Err(Error::Unavailable(_))));
}

#[test]
fn the_xid_watcher_fails_cleanly_without_a_driver() {
    if Session::open().is_ok() {
        return; // a GPU host: covered by the agent run on the device
    }
    let (tx, _rx) = std::sync::mpsc::channel();
    let err = XidWatcher::spawn(tx).err().expect("no NVML, no watcher");
    assert!(matches!(err, Error::Unavailable(_)), "{err}");
}

/// An NVML inventory that reports what `topology` describes: NVLink ports per bonded link (to the
/// peer's bus id, or to NVSwitch bus ids when switched) and a PCIe common ancestor per pair.
fn inventory_like(topology: &NodeTopology) -> Inventory {
    let n = topology.len();
    let bus = |i: usize| format!("0000:{:02x}:00.0", 0x10 + i * 8);
    let switches = ["0000:c4:00.0", "0000:c5:00.0", "0000:c6:00.0", "0000:c7:00.0"];
    let devices = (0..n)
        .map(|i| {
            let mut nvlinks = Vec::new();
            for j in 0..n {
                if let Some(Link::NvLink { links, switched }) = topology.link(i, j) {
                    if switched {
                        if nvlinks.is_empty() {
                            nvlinks = (0..links)
                                .map(|l| NvLinkPort { link: u32::from(l), remote_pci: switches[l as usize % 4].into() })
                                .collect();
                        }
                    } else {
                        for _ in 0..links {
                            nvlinks.push(NvLinkPort { link: nvlinks.len() as u32, remote_pci: bus(j).to_uppercase() });
                        }
                    }
                }
            }
            Device {
                index: i as u32,
                uuid: format!("GPU-{i:08}"),
                name: "test".into(),
                memory_bytes: 80 << 30,
                pci: bus(i),
                numa: topology.gpus()[i].numa,
                cpus: topology.gpus()[i].cpus.clone(),
                mig: None,
                nvlinks,
            }
        })
        .collect();
    let mut paths = Vec::new();
    for a in 0..n {
        for b in a + 1..n {
            paths.push(match topology.link(a, b).unwrap() {
                Link::Pix => PathLevel::Single,
                Link::Pxb => PathLevel::Multiple,
                Link::Phb => PathLevel::HostBridge,
                Link::Node => PathLevel::Node,
                Link::Sys => PathLevel::System,
                Link::NvLink { .. } => PathLevel::Single,
            });
        }
    }
    Inventory { driver: "550.54.15".into(), cuda: Some(12040), devices, paths }
}

#[test]
fn nvml_data_converts_to_the_same_matrix_nvidia_smi_prints() {
    for name in [
        "dgx1v-8gpu-nv1-nv2-cube-mesh.txt",
        "h100-sxm-8gpu-nv18.txt",
        "pcie-6gpu-pix-pairs.txt",
        "dgx2-16gpu-nv6-mlx5.txt",
        "a100-pcie-4gpu-nvlink-bridge-pairs.txt",
    ] {
        let expected = fixture(name);
        let inventory = inventory_like(&expected);
        let json = serde_json::to_string(&inventory).unwrap();
        let back: Inventory = serde_json::from_str(&json).unwrap();
        let got = back.topology().unwrap();
        let n = expected.len();
        for a in 0..n {
            for b in 0..n {
                assert_eq!(got.link(a, b), expected.link(a, b), "{name}: GPU{a}–GPU{b}");
            }
        }
        assert_eq!(got.interconnect(), expected.interconnect(), "{name}");
        assert_eq!(got.gpus()[0].uuid.as_deref(), Some("GPU-00000000"));
        assert_eq!(got.gpus()[n - 1].numa, expected.gpus()[n - 1].numa);
    }
}

#[test]
fn inconsistent_inventories_are_refused() {
    let mut inventory = inventory_like(&fixture("pcie-6gpu-pix-pairs.txt"));
    inventory.paths.pop();
    assert!(inventory.topology().unwrap_err().to_string().contains("paths for 6 devices"));
    let mut inventory = inventory_like(&fixture("pcie-6gpu-pix-pairs.txt"));
    let own = inventory.devices[2].pci.clone();
    inventory.devices[2].nvlinks.push(NvLinkPort { link: 0, remote_pci: own });
    assert!(inventory.topology().unwrap_err().to_string().contains("NVLink to itself"));
}

#[test]
fn bus_ids_are_normalised_to_the_sysfs_form() {
    assert_eq!(normalise_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
    assert_eq!(normalise_bus_id("0000:3b:00.0"), "0000:3b:00.0");
}

#[test]
fn xids_are_classified() {
    assert_eq!(classify_xid(79).0, Health::Unhealthy, "fallen off the bus");
    assert_eq!(classify_xid(48).0, Health::Unhealthy, "double-bit ECC");
    assert_eq!(classify_xid(13).0, Health::Healthy, "an application's exception");
    assert_eq!(classify_xid(31).0, Health::Healthy, "an application's page fault");
    assert_eq!(classify_xid(74).0, Health::Degraded, "NVLink error");
    assert_eq!(classify_xid(9999).0, Health::Unhealthy, "unknown: drain");
}

/// `nvidia-smi`'s output on this host, or None where it is not installed (CI has no GPU).
fn nvidia_smi(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("nvidia-smi").args(args).output().ok()?;
    assert!(out.status.success(), "nvidia-smi {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Some(String::from_utf8(out.stdout).unwrap())
}

/// On a GPU host (the lent device machine; a CI machine has no driver and returns at once): what
/// NVML discovery reports agrees with `nvidia-smi` on the same host, field by field — identity,
/// memory, PCI address, MIG mode, active NVLinks, and the `topo -m` matrix with its CPU and NUMA
/// affinity.
#[test]
fn on_a_gpu_host_discovery_agrees_with_nvidia_smi() {
    let Ok(session) = Session::open() else { return };
    let Some(csv) = nvidia_smi(&[
        "--query-gpu=index,uuid,name,pci.bus_id,memory.total,driver_version,mig.mode.current",
        "--format=csv,noheader,nounits",
    ]) else {
        return;
    };
    let inventory = session.inventory().unwrap();
    let rows: Vec<Vec<&str>> = csv.lines().map(|l| l.split(',').map(str::trim).collect()).collect();
    assert_eq!(rows.len(), inventory.devices.len(), "device count\n{csv}");
    for (row, device) in rows.iter().zip(&inventory.devices) {
        assert_eq!(row[0].parse::<u32>().unwrap(), device.index);
        assert_eq!(row[1], device.uuid);
        assert_eq!(row[2], device.name);
        assert_eq!(normalise_bus_id(row[3]), device.pci);
        assert_eq!(row[4].parse::<u64>().unwrap(), device.memory_bytes >> 20, "memory MiB of GPU{}", device.index);
        assert_eq!(row[5], inventory.driver);
        match (row[6], &device.mig) {
            ("[N/A]", None) => {}
            ("Enabled", Some(mig)) => assert!(mig.enabled),
            ("Disabled", Some(mig)) => assert!(!mig.enabled),
            (smi, ours) => panic!("MIG of GPU{}: nvidia-smi {smi}, NVML {ours:?}", device.index),
        }
    }
    // `nvidia-smi nvlink -s` prints one `Link N: <speed>` per link, `<inactive>` for idle ones.
    if let Some(status) = nvidia_smi(&["nvlink", "-s"]) {
        let mut active = vec![0usize; inventory.devices.len()];
        let mut gpu = None;
        for line in status.lines() {
            if let Some(rest) = line.strip_prefix("GPU ") {
                gpu = rest.split(':').next().and_then(|i| i.trim().parse::<usize>().ok());
            } else if line.trim_start().starts_with("Link ") && !line.contains("inactive") {
                active[gpu.expect("a link line before its GPU line")] += 1;
            }
        }
        for (device, active) in inventory.devices.iter().zip(active) {
            assert_eq!(device.nvlinks.len(), active, "active NVLinks of GPU{}\n{status}", device.index);
        }
    }
    let expected = smi::parse(&nvidia_smi(&["topo", "-m"]).unwrap()).unwrap();
    let got = inventory.topology().unwrap();
    assert_eq!(got.len(), expected.len());
    for a in 0..got.len() {
        for b in 0..got.len() {
            assert_eq!(got.link(a, b), expected.link(a, b), "GPU{a}–GPU{b}");
        }
        assert_eq!(got.gpus()[a].numa, expected.gpus()[a].numa, "NUMA of GPU{a}");
        assert_eq!(got.gpus()[a].cpus, expected.gpus()[a].cpus, "CPU affinity of GPU{a}");
    }
    let telemetry = session.telemetry().unwrap();
    assert!(telemetry.iter().all(|t| t.temperature_c.is_some() && t.memory_used_bytes.is_some()), "{telemetry:?}");
}

/// On a GPU host: the XID watcher registers every device for critical XIDs, waits, and stops
/// within its one-second wait when dropped.
#[test]
fn on_a_gpu_host_the_xid_watcher_starts_and_stops() {
    if Session::open().is_err() {
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let watcher = XidWatcher::spawn(tx).expect("XID registration on a GPU host");
    // A healthy, idle device raises no XID.
    let waited = rx.recv_timeout(std::time::Duration::from_millis(1500));
    assert!(matches!(waited, Err(std::sync::mpsc::RecvTimeoutError::Timeout)), "{waited:?}");
    let start = std::time::Instant::now();
    drop(watcher);
    assert!(start.elapsed() < std::time::Duration::from_secs(3), "stopped in {:?}", start.elapsed());
}

/// A file of `fixtures/`: outputs captured on the lent H200 machine (driver 580.159.04), see
/// `fixtures/README.md`.
fn recorded(name: &str) -> String {
    std::fs::read_to_string(format!("{}/tests/fixtures/h200-driver-580.159.04-{name}", env!("CARGO_MANIFEST_DIR")))
        .unwrap()
}

/// `nvidia-smi -q` of one GPU as `Section/Key → value`; the `GPU <bus id>` level is left out of the
/// path, and keys with children of their own (`HW Slowdown`) do not open a section.
fn smi_query(text: &str) -> std::collections::HashMap<String, String> {
    let mut out = std::collections::HashMap::new();
    let mut sections: Vec<(usize, String)> = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('=') {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        while sections.last().is_some_and(|(at, _)| *at >= indent) {
            sections.pop();
        }
        let path = |key: &str| {
            let mut parts: Vec<&str> = sections.iter().map(|(_, s)| s.as_str()).collect();
            parts.push(key);
            parts.join("/")
        };
        match trimmed.split_once(" : ") {
            Some((key, value)) => {
                out.insert(path(key.trim()), value.trim().to_string());
            }
            None if trimmed.starts_with("GPU ") => {}
            None => sections.push((indent, trimmed.to_string())),
        }
    }
    out
}

/// What NVML discovery printed on the H200 agrees with what `nvidia-smi` printed on the same
/// machine a second earlier, field by field (the values were also checked by hand: one H200 of
/// 143,771 MiB at 0000:00:06.0, MIG supported and off, no NVLink up in the virtual machine, CPUs
/// 0-15 on NUMA node 0 although sysfs says -1 for the device).
#[test]
fn the_recorded_h200_inventory_matches_nvidia_smi_field_by_field() {
    let inventory: Inventory = serde_json::from_str(&recorded("agent-inventory.json")).unwrap();
    let q = smi_query(&recorded("nvidia-smi-q.txt"));
    assert_eq!(inventory.devices.len(), q["Attached GPUs"].parse::<usize>().unwrap());
    let device = &inventory.devices[0];
    assert_eq!(device.uuid, q["GPU UUID"]);
    assert_eq!(device.name, q["Product Name"]);
    assert_eq!(device.name, "NVIDIA H200");
    assert_eq!(device.pci, normalise_bus_id(&q["PCI/Bus Id"]));
    assert_eq!(device.pci, "0000:00:06.0");
    assert_eq!(format!("{} MiB", device.memory_bytes >> 20), q["FB Memory Usage/Total"]);
    assert_eq!(device.memory_bytes, 143_771 << 20, "NVML's total is whole MiB");
    assert_eq!(inventory.driver, q["Driver Version"]);
    let cuda = inventory.cuda.unwrap();
    assert_eq!(format!("{}.{}", cuda / 1000, cuda % 1000 / 10), q["CUDA Version"]);
    let mig = device.mig.as_ref().expect("H200 supports MIG");
    assert_eq!((mig.enabled, mig.pending), (false, false));
    assert_eq!((q["MIG Mode/Current"].as_str(), q["MIG Mode/Pending"].as_str()), ("Disabled", "Disabled"));
    assert!(recorded("nvidia-smi-mig-lgip.txt").contains("MIG 7g.141gb"), "MIG profiles exist while it is off");
    assert!(recorded("nvidia-smi-nvlink-s.txt").trim().is_empty() && device.nvlinks.is_empty(), "no NVLink");

    let csv = recorded("query-gpu.csv");
    let row: Vec<&str> = csv.lines().nth(1).unwrap().split(',').map(str::trim).collect();
    assert_eq!((row[1], row[2], row[5]), (device.uuid.as_str(), device.name.as_str(), inventory.driver.as_str()));

    let smi_topology = smi::parse(
        &std::fs::read_to_string(format!(
            "{}/../topology/tests/fixtures/h200-1gpu-vm-driver-580.159.04.txt",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap(),
    )
    .unwrap();
    let ours = inventory.topology().unwrap();
    assert_eq!(ours.len(), smi_topology.len());
    assert_eq!(
        (ours.gpus()[0].numa, &ours.gpus()[0].cpus),
        (smi_topology.gpus()[0].numa, &smi_topology.gpus()[0].cpus)
    );
    assert_eq!((ours.gpus()[0].numa, ours.gpus()[0].cpus.to_string().as_str()), (Some(0), "0-15"));
    assert_eq!(ours.interconnect(), "pcie");
}
