//! `wasmsched dra explain` on the objects NVIDIA's DRA driver publishes (`examples/dra`), through
//! the real command.

use super::wasmsched;

#[test]
fn explain_names_the_node_that_fits_and_why_each_other_does_not() {
    let o = wasmsched(&[
        "dra",
        "explain",
        "examples/dra/claim-four-a100-one-pcie-root.yaml",
        "--objects",
        "examples/dra/cluster.yaml",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("20 device(s) in complete pools, 6 held by other claims"), "{out}");
    let line = |node: &str| out.lines().find(|l| l.starts_with(node)).unwrap_or_default().to_string();
    assert!(line("dgx-a100-0 ").contains("fits: gpus: gpu.nvidia.com/dgx-a100-0 gpu-0, gpu-1, gpu-2, gpu-3"), "{out}");
    assert!(line("dgx-a100-1 ").contains("8 device(s), 8 of the class, 8 selected, 2 free"), "{out}");
    assert!(line("h100-0 ").contains("4 of the class, 0 selected"), "{out}");

    let o = wasmsched(&[
        "dra",
        "explain",
        "examples/dra/template-one-gpu-prefer-h100.yaml",
        "--objects",
        "examples/dra/cluster.yaml",
        "--json",
    ]);
    assert!(o.status.success());
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(json["nodes_that_fit"], 3);
    let results = &json["nodes"]["h100-0"]["allocation"]["devices"]["results"];
    assert_eq!(results[0]["request"], "gpu/h100", "{json}");
    assert_eq!(json["nodes"]["dgx-a100-0"]["allocation"]["devices"]["results"][0]["request"], "gpu/any");
}

#[test]
fn a_claim_that_fits_nowhere_or_bad_objects_exit_non_zero_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let claim = dir.path().join("claim.yaml");
    std::fs::write(
        &claim,
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: nine}\nspec: {devices: {requests: [{name: gpus, exactly: {deviceClassName: gpu.nvidia.com, count: 9}}]}}\n",
    )
    .unwrap();
    let o = wasmsched(&["dra", "explain", claim.to_str().unwrap(), "--objects", "examples/dra/cluster.yaml"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("claim nine fits on none of the 3 node(s)"));
    assert!(String::from_utf8_lossy(&o.stdout).contains("needs 9 device(s)"));

    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "kind: ResourceSlice\nspec: {driver: 3}\n").unwrap();
    let o = wasmsched(&["dra", "explain", claim.to_str().unwrap(), "--objects", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad.yaml: document 1: not a valid ResourceSlice"), "{err}");
}

#[test]
fn without_nodes_the_slices_nodes_are_explained_and_the_gap_is_said() {
    // The cluster's objects without its Nodes (the `List` of three that cluster.yaml opens with).
    let cluster =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/dra/cluster.yaml")).unwrap();
    let no_nodes: Vec<&str> = cluster.split("\n---\n").filter(|doc| !doc.contains("kind: Node")).collect();
    assert!(no_nodes.len() < cluster.split("\n---\n").count(), "cluster.yaml has Nodes to leave out");
    let dir = tempfile::tempdir().unwrap();
    let objects = dir.path().join("slices.yaml");
    std::fs::write(&objects, no_nodes.join("\n---\n")).unwrap();

    let o = wasmsched(&[
        "dra",
        "explain",
        "examples/dra/claim-four-a100-one-pcie-root.yaml",
        "--objects",
        objects.to_str().unwrap(),
    ]);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}{err}");
    assert!(err.contains("no Node among --objects: explaining on the 3 node(s) the ResourceSlices name"), "{err}");
    assert!(err.contains("labels and taints were not known"), "{err}");
    let line = |node: &str| out.lines().find(|l| l.starts_with(node)).unwrap_or_default().to_string();
    assert!(line("dgx-a100-0 ").contains("fits: gpus: gpu.nvidia.com/dgx-a100-0 gpu-0, gpu-1, gpu-2, gpu-3"), "{out}");
    assert!(line("h100-0 ").contains("0 selected"), "{out}");

    // Slices that name no node (all published with a node selector) leave nothing to explain on.
    let only_class = dir.path().join("class.yaml");
    let class: Vec<&str> = cluster.split("\n---\n").filter(|doc| doc.contains("kind: DeviceClass")).collect();
    std::fs::write(&only_class, class.join("\n---\n")).unwrap();
    let o = wasmsched(&[
        "dra",
        "explain",
        "examples/dra/claim-four-a100-one-pcie-root.yaml",
        "--objects",
        only_class.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("give the nodes too"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
