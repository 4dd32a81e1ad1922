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
