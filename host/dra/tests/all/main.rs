//! The allocator on the objects NVIDIA's DRA driver publishes (`examples/dra`), and on the input
//! an outsider could send it: malformed pools, CEL that does not compile, fails, loops or is huge.

use std::path::Path;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaimSpec, ResourceSlice};
use wasmsched_dra::{Allocator, Attribute, Inventory, Objects, SelectorError, Unsatisfied, explain};

fn examples() -> Objects {
    let mut o = Objects::default();
    o.read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/dra/cluster.yaml")).unwrap();
    o
}

fn allocator(o: &Objects) -> Allocator {
    let (mut inventory, refused) = Inventory::from_slices(&o.slices);
    assert!(refused.is_empty(), "{refused:?}");
    inventory.hold_allocated(&o.claims);
    Allocator::new(inventory, o.classes.clone())
}

fn node<'a>(o: &'a Objects, name: &str) -> &'a Node {
    o.nodes.iter().find(|n| n.metadata.name.as_deref() == Some(name)).unwrap()
}

fn claim(yaml: &str) -> ResourceClaimSpec {
    serde_yaml_ng::from_str(yaml).unwrap()
}

fn gpus(count: u32, selector: &str, constraint: &str) -> ResourceClaimSpec {
    let selectors = if selector.is_empty() {
        String::new()
    } else {
        format!(", selectors: [{{cel: {{expression: {selector:?}}}}}]")
    };
    let constraints = if constraint.is_empty() { String::new() } else { format!("constraints: [{constraint}]") };
    claim(&format!(
        "devices: {{requests: [{{name: gpus, exactly: {{deviceClassName: gpu.nvidia.com, count: {count}{selectors}}}}}], {constraints}}}"
    ))
}

fn attribute<'a>(a: &'a Allocator, device: &wasmsched_dra::DeviceId, name: &str) -> &'a Attribute {
    let d = a.inventory().devices().iter().find(|d| &d.id == device).unwrap();
    &d.attributes[name]
}

#[test]
fn the_example_claim_gets_four_a100s_under_one_pcie_root_and_every_other_node_says_why_not() {
    let o = examples();
    let mut a = allocator(&o);
    let mut given = Objects::default();
    given
        .read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/dra/claim-four-a100-one-pcie-root.yaml"))
        .unwrap();
    let verdicts = explain(&mut a, given.claims[0].spec.as_ref().unwrap(), &o.nodes);
    let fit = verdicts["dgx-a100-0"].as_ref().unwrap();
    assert_eq!(fit.results.len(), 4);
    let roots: std::collections::BTreeSet<String> = fit
        .results
        .iter()
        .map(|(_, id, _)| format!("{:?}", attribute(&a, id, "resource.kubernetes.io/pcieRoot")))
        .collect();
    assert_eq!(roots.len(), 1, "one PCIe root: {roots:?}");
    assert!(fit.results.iter().all(|(request, id, admin)| request == "gpus" && &*id.pool == "dgx-a100-0" && !admin));
    let status = fit.to_status();
    let terms = &status.node_selector.unwrap().node_selector_terms;
    assert_eq!(terms[0].match_fields.as_ref().unwrap()[0].values, Some(vec!["dgx-a100-0".to_string()]));
    // Six of dgx-a100-1's GPUs are held by another claim: two left, under one root.
    match &verdicts["dgx-a100-1"] {
        Err(Unsatisfied::TooFew { funnel, wanted, .. }) => {
            assert_eq!((funnel.on_node, funnel.of_class, funnel.selected, funnel.free), (8, 8, 8, 2));
            assert_eq!(wanted, "4");
        }
        other => panic!("{other:?}"),
    }
    // The H100 node's GPUs are of the class but not A100s.
    match &verdicts["h100-0"] {
        Err(Unsatisfied::TooFew { funnel, .. }) => assert_eq!((funnel.of_class, funnel.selected), (4, 0)),
        other => panic!("{other:?}"),
    }
    let text = verdicts["h100-0"].as_ref().unwrap_err().to_string();
    assert!(text.contains("4 of the class, 0 selected"), "{text}");
}

#[test]
fn constraints_match_or_separate_attributes_and_an_impossible_one_is_named() {
    let o = examples();
    let mut a = allocator(&o);
    let dgx = node(&o, "dgx-a100-0");
    let one_root = "{requests: [gpus], matchAttribute: resource.kubernetes.io/pcieRoot}";
    // Four GPUs per root: five under one root cannot be had.
    match a.allocate(&gpus(5, "", one_root), dgx) {
        Err(Unsatisfied::Constraint(text)) => {
            assert!(text.contains("matchAttribute resource.kubernetes.io/pcieRoot"), "{text}")
        }
        other => panic!("{other:?}"),
    }
    let two_roots = a.allocate(&gpus(2, "", "{distinctAttribute: resource.kubernetes.io/pcieRoot}"), dgx).unwrap();
    let roots: Vec<_> = two_roots
        .results
        .iter()
        .map(|(_, id, _)| attribute(&a, id, "resource.kubernetes.io/pcieRoot").clone())
        .collect();
    assert_ne!(roots[0], roots[1]);
    // A constraint on an attribute the devices lack cannot be met.
    assert!(matches!(
        a.allocate(&gpus(1, "", "{matchAttribute: example.com/missing}"), dgx),
        Err(Unsatisfied::Constraint(_))
    ));
}

#[test]
fn first_available_takes_the_first_alternative_the_node_can_serve() {
    let o = examples();
    let mut a = allocator(&o);
    let mut t = Objects::default();
    t.read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/dra/template-one-gpu-prefer-h100.yaml"))
        .unwrap();
    let spec = t.templates[0].spec.as_ref().and_then(|s| s.spec.as_ref()).unwrap();
    let on_h100 = a.allocate(spec, node(&o, "h100-0")).unwrap();
    assert_eq!(on_h100.results[0].0, "gpu/h100");
    let on_a100 = a.allocate(spec, node(&o, "dgx-a100-0")).unwrap();
    assert_eq!(on_a100.results[0].0, "gpu/any");
}

#[test]
fn all_mode_takes_every_matching_device_and_fails_if_any_is_held() {
    let o = examples();
    let mut a = allocator(&o);
    let all =
        claim("devices: {requests: [{name: gpus, exactly: {deviceClassName: gpu.nvidia.com, allocationMode: All}}]}");
    assert_eq!(a.allocate(&all, node(&o, "h100-0")).unwrap().results.len(), 4);
    assert!(matches!(a.allocate(&all, node(&o, "dgx-a100-1")), Err(Unsatisfied::TooFew { .. })));
    // Admin access sees devices others hold, and holds none itself.
    let admin = claim(
        "devices: {requests: [{name: gpus, exactly: {deviceClassName: gpu.nvidia.com, count: 8, adminAccess: true}}]}",
    );
    let got = a.allocate(&admin, node(&o, "dgx-a100-1")).unwrap();
    assert!(got.results.iter().all(|r| r.2));
}

#[test]
fn held_devices_are_never_given_twice() {
    let o = examples();
    let mut a = allocator(&o);
    let dgx = node(&o, "dgx-a100-0");
    let first = a.allocate(&gpus(5, "", ""), dgx).unwrap();
    a.hold(&first, true);
    let second = a.allocate(&gpus(3, "", ""), dgx).unwrap();
    a.hold(&second, true);
    let ids: std::collections::BTreeSet<_> = first.results.iter().chain(&second.results).map(|r| r.1.clone()).collect();
    assert_eq!(ids.len(), 8, "eight distinct GPUs");
    assert!(matches!(a.allocate(&gpus(1, "", ""), dgx), Err(Unsatisfied::TooFew { .. })));
    a.hold(&second, false);
    assert_eq!(a.allocate(&gpus(3, "", ""), dgx).unwrap().results.len(), 3, "released devices are free again");
}

#[test]
fn an_allocation_made_before_the_slices_changed_holds_and_releases_the_same_devices() {
    let o = examples();
    let mut before = allocator(&o);
    let dgx = node(&o, "dgx-a100-0");
    let given = before.allocate(&gpus(3, "", ""), dgx).unwrap();
    // New slices: another driver's pool sorts first, so every device has moved in the
    // inventory; and without dgx-a100-0's pool, the devices are in none.
    let extra = slice(
        "{metadata: {name: a}, spec: {driver: a.example.com, nodeName: dgx-a100-0, pool: {name: a, generation: 1, resourceSliceCount: 1}, devices: [{name: x}, {name: y}, {name: z}, {name: w}]}}",
    );
    let held_count = |a: &Allocator| a.inventory().devices().iter().filter(|d| a.inventory().is_in_use(&d.id)).count();
    let moved: Vec<ResourceSlice> = std::iter::once(extra.clone()).chain(o.slices.iter().cloned()).collect();
    let gone: Vec<ResourceSlice> =
        std::iter::once(extra).chain(o.slices.iter().filter(|s| s.spec.pool.name != "dgx-a100-0").cloned()).collect();
    for slices in [moved, gone] {
        let (mut inventory, _) = Inventory::from_slices(&slices);
        inventory.hold_allocated(&o.claims);
        let mut after = Allocator::new(inventory, o.classes.clone());
        let already = held_count(&after);
        after.hold(&given, true);
        assert!(given.results.iter().all(|(_, id, _)| after.inventory().is_in_use(id)), "{given}");
        let in_pool = given.results.iter().filter(|(_, id, _)| after.inventory().devices().iter().any(|d| d.id == *id));
        assert_eq!(held_count(&after), already + in_pool.count(), "only the allocation's devices");
        after.hold(&given, false);
        assert!(given.results.iter().all(|(_, id, _)| !after.inventory().is_in_use(id)));
        assert_eq!(held_count(&after), already);
    }
}

#[test]
fn cel_sees_quantities_versions_and_missing_domains_as_kubernetes_does() {
    let o = examples();
    let mut a = allocator(&o);
    let h100 = node(&o, "h100-0");
    let dgx = node(&o, "dgx-a100-0");
    let hopper = "device.attributes['gpu.nvidia.com'].cudaComputeCapability.isGreaterThan(semver('8.5.0'))";
    assert!(a.allocate(&gpus(1, hopper, ""), h100).is_ok());
    assert!(matches!(a.allocate(&gpus(1, hopper, ""), dgx), Err(Unsatisfied::TooFew { .. })));
    let big = "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('79Gi')) && device.capacity['gpu.nvidia.com'].memory.asInteger() == 85899345920";
    assert!(a.allocate(&gpus(8, big, ""), dgx).is_ok());
    // A domain no device has reads as an empty map, not an error.
    let other = "!('model' in device.attributes['other.example.com'])";
    assert!(a.allocate(&gpus(1, other, ""), dgx).is_ok());
}

#[test]
fn bad_cel_is_a_reason_on_the_claim_never_a_panic() {
    let o = examples();
    let mut a = allocator(&o);
    let dgx = node(&o, "dgx-a100-0");
    let reason = |a: &mut Allocator, expression: &str| match a.allocate(&gpus(1, expression, ""), dgx) {
        Err(Unsatisfied::Selector { error, .. }) => error,
        other => panic!("{expression}: {other:?}"),
    };
    assert!(matches!(reason(&mut a, "device.driver =="), SelectorError::Compile { .. }));
    // Asked again, the failure comes from the allocator's table of verdicts: the same error.
    for _ in 0..2 {
        match reason(&mut a, "device.attributes['gpu.nvidia.com'].nosuch == 1") {
            SelectorError::Runtime { device, .. } => assert!(device.starts_with("gpu.nvidia.com/dgx-a100-0/gpu-")),
            other => panic!("{other:?}"),
        }
    }
    assert!(matches!(reason(&mut a, "device.driver"), SelectorError::NotBoolean { .. }));
    assert!(matches!(reason(&mut a, "quantity('lots') == quantity('1')"), SelectorError::Runtime { .. }));
    // Hostile: over the length limit, nested past the depth limit, and a comprehension bomb.
    assert!(matches!(reason(&mut a, &format!("'{}' == ''", "x".repeat(11_000))), SelectorError::TooLong(_)));
    let deep = format!("{}true{}", "(".repeat(4_000), ")".repeat(4_000));
    assert!(matches!(reason(&mut a, &deep), SelectorError::TooDeep { .. } | SelectorError::Compile { .. }));
    let lists = format!("{}{} == []", "[".repeat(4_000), "]".repeat(4_000));
    assert!(matches!(reason(&mut a, &lists), SelectorError::TooDeep { .. } | SelectorError::Compile { .. }));
    // The parser folds a chain of negations: whatever it makes of one, it must not crash.
    let _ = a.allocate(&gpus(1, &format!("{}true", "!".repeat(9_001)), ""), dgx);
    let attrs = "device.attributes['gpu.nvidia.com']";
    let bomb = format!("{attrs}.all(a, {attrs}.all(b, {attrs}.all(c, {attrs}.all(d, {attrs}.all(e, true)))))");
    assert!(matches!(reason(&mut a, &bomb), SelectorError::TooCostly { .. }));
    // The cluster keeps allocating after all of them.
    assert!(a.allocate(&gpus(1, "", ""), dgx).is_ok());
    // A class that does not exist is named.
    let missing = claim("devices: {requests: [{name: x, exactly: {deviceClassName: tpu.example.com}}]}");
    assert!(matches!(a.allocate(&missing, dgx), Err(Unsatisfied::NoClass { class, .. }) if class == "tpu.example.com"));
}

fn slice(yaml: &str) -> ResourceSlice {
    serde_yaml_ng::from_str(yaml).unwrap()
}

#[test]
fn only_complete_newest_valid_pools_are_offered() {
    let device = |n: &str| format!("{{name: {n}, attributes: {{type: {{string: gpu}}}}}}");
    let made = std::cell::Cell::new(0);
    let s = |pool: &str, generation: u32, count: u32, devices: &[&str]| {
        made.set(made.get() + 1);
        slice(&format!(
            "{{apiVersion: resource.k8s.io/v1, kind: ResourceSlice, metadata: {{name: slice-{}}}, spec: {{driver: gpu.nvidia.com, nodeName: n1, pool: {{name: {pool}, generation: {generation}, resourceSliceCount: {count}}}, devices: [{}]}}}}",
            made.get(),
            devices.iter().map(|d| device(d)).collect::<Vec<_>>().join(", ")
        ))
    };
    let slices = vec![
        s("complete", 1, 1, &["a", "b"]),
        s("upgraded", 1, 1, &["old"]),
        s("upgraded", 2, 2, &["new-1"]),
        s("upgraded", 2, 2, &["new-2"]),
        s("incomplete", 3, 2, &["x"]),
        s("duplicated", 1, 2, &["d"]),
        s("duplicated", 1, 2, &["d"]),
        s("too-many", 1, 1, &["m"]),
        s("too-many", 1, 1, &["n"]),
    ];
    // The same slices given twice (overlapping files) count once.
    let (inventory, refused) = Inventory::from_slices(slices.iter().chain(&slices));
    let names: Vec<String> = inventory.devices().iter().map(|d| format!("{}/{}", d.id.pool, d.id.device)).collect();
    assert_eq!(names, ["complete/a", "complete/b", "upgraded/new-1", "upgraded/new-2"]);
    let why: std::collections::BTreeMap<&str, &str> =
        refused.iter().map(|r| (r.what.as_str(), r.reason.as_str())).collect();
    assert!(why["gpu.nvidia.com/incomplete"].contains("1 of the 2 slices"), "{why:?}");
    assert!(why["gpu.nvidia.com/duplicated"].contains("appears twice"), "{why:?}");
    assert!(why["gpu.nvidia.com/too-many"].contains("2 slices of generation 1, more than its count of 1"), "{why:?}");
    // A device with an attribute of two types is refused alone; its pool stays.
    let mixed = slice(
        "{apiVersion: resource.k8s.io/v1, kind: ResourceSlice, metadata: {name: m}, spec: {driver: d.example.com, nodeName: n1, pool: {name: p, generation: 1, resourceSliceCount: 1}, devices: [{name: bad, attributes: {x: {int: 1, string: one}}}, {name: good}]}}",
    );
    let (inventory, refused) = Inventory::from_slices([&mixed]);
    assert_eq!(inventory.devices().len(), 1);
    assert!(refused[0].what.ends_with("/bad") && refused[0].reason.contains("exactly one"), "{refused:?}");
}

#[test]
fn objects_come_as_lists_documents_or_json_and_bad_ones_are_located() {
    let o = examples();
    assert_eq!((o.classes.len(), o.nodes.len(), o.slices.len(), o.claims.len()), (1, 3, 3, 1));
    let mut bad = Objects::default();
    let err = bad
        .add(
            Path::new("x.yaml"),
            "apiVersion: v1\nkind: Node\nmetadata: {name: a}\n---\nkind: ResourceSlice\nspec: 3\n",
        )
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("x.yaml: document 2: not a valid ResourceSlice"), "{err}");
    let mut json = Objects::default();
    json.add(Path::new("j.json"), r#"{"kind": "ResourceSliceList", "items": [{"spec": {"driver": "d", "nodeName": "n", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}}}]}"#).unwrap();
    assert_eq!(json.slices.len(), 1, "a typed list's items may leave out their kind");
    let mut other = Objects::default();
    other.add(Path::new("p.yaml"), "kind: Pod\nmetadata: {name: p}\n").unwrap();
    assert_eq!(other.skipped.len(), 1);
}

#[test]
fn a_tainted_device_goes_only_to_a_request_that_tolerates_its_taint() {
    // Two devices, one tainted by its driver (say, an ECC error); a third with an informational taint.
    let tainted = slice(
        "{apiVersion: resource.k8s.io/v1, kind: ResourceSlice, metadata: {name: t}, spec: {driver: gpu.nvidia.com, nodeName: n1, pool: {name: n1, generation: 1, resourceSliceCount: 1}, devices: [{name: gpu-0, taints: [{key: gpu.nvidia.com/ecc, value: uncorrectable, effect: NoSchedule}]}, {name: gpu-1, taints: [{key: gpu.nvidia.com/note, effect: None}]}]}}",
    );
    let (inventory, refused) = Inventory::from_slices([&tainted]);
    assert!(refused.is_empty(), "{refused:?}");
    let class = serde_yaml_ng::from_str("{metadata: {name: gpu.nvidia.com}, spec: {}}").unwrap();
    let mut a = Allocator::new(inventory, [class]);
    let n1: Node = serde_yaml_ng::from_str("{metadata: {name: n1}}").unwrap();
    // Two devices: one is tainted and not tolerated.
    let err = a.allocate(&gpus(2, "", ""), &n1).unwrap_err().to_string();
    assert!(err.contains("2 selected, 1 with a taint it does not tolerate, 1 free"), "{err}");
    // One: the untainted (an informational taint keeps nothing away).
    let one = a.allocate(&gpus(1, "", ""), &n1).unwrap();
    assert_eq!(&*one.results[0].1.device, "gpu-1");
    // A request that tolerates the taint — by key and value, or any value of the key — gets both.
    for toleration in [
        "{key: gpu.nvidia.com/ecc, operator: Equal, value: uncorrectable, effect: NoSchedule}",
        "{key: gpu.nvidia.com/ecc, operator: Exists}",
        "{operator: Exists}",
    ] {
        let spec = claim(&format!(
            "devices: {{requests: [{{name: gpus, exactly: {{deviceClassName: gpu.nvidia.com, count: 2, tolerations: [{toleration}]}}}}]}}"
        ));
        assert_eq!(a.allocate(&spec, &n1).unwrap().results.len(), 2, "{toleration}");
    }
    // The wrong value, or another effect, does not tolerate it.
    for toleration in [
        "{key: gpu.nvidia.com/ecc, operator: Equal, value: correctable}",
        "{key: gpu.nvidia.com/ecc, operator: Exists, effect: NoExecute}",
    ] {
        let spec = claim(&format!(
            "devices: {{requests: [{{name: gpus, exactly: {{deviceClassName: gpu.nvidia.com, count: 2, tolerations: [{toleration}]}}}}]}}"
        ));
        assert!(a.allocate(&spec, &n1).is_err(), "{toleration}");
    }
}

#[test]
fn gpus_without_a_constraint_still_come_from_one_pcie_root_and_a_single_gpu_fills_the_broken_root() {
    let o = examples();
    let mut a = allocator(&o);
    let dgx = node(&o, "dgx-a100-0");
    let root = |a: &Allocator, r: &(String, wasmsched_dra::DeviceId, bool)| {
        format!("{:?}", attribute(a, &r.1, "resource.kubernetes.io/pcieRoot"))
    };
    // Three of the first root's four GPUs taken: slice order would pair its last one with the
    // second root's first, across the CPU's interconnect.
    let three = a.allocate(&gpus(3, "", ""), dgx).unwrap();
    a.hold(&three, true);
    let pair = a.allocate(&gpus(2, "", ""), dgx).unwrap();
    let roots: std::collections::BTreeSet<String> = pair.results.iter().map(|r| root(&a, r)).collect();
    assert_eq!(roots.len(), 1, "two GPUs under one root: {pair:?}");
    // One GPU: the first root's last, keeping the second root's four whole.
    let one = a.allocate(&gpus(1, "", ""), dgx).unwrap();
    assert_eq!(root(&a, &one.results[0]), root(&a, &three.results[0]), "{one:?}");
}

#[test]
fn devices_that_show_a_selector_the_same_fields_get_its_verdict_without_being_evaluated_again() {
    use wasmsched_dra::selector::{DeviceValue, Environment};
    let o = examples();
    let (inventory, _) = Inventory::from_slices(&o.slices);
    let env = Environment::default();
    let named = [
        "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-SXM4-80GB'",
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
        "device.attributes['resource.kubernetes.io']['pcieRoot'] == 'pci0000:80' && device.driver == 'gpu.nvidia.com'",
        "has(device.attributes['gpu.nvidia.com'].index) && device.attributes['gpu.nvidia.com'].index < 2",
        "device.attributes['other.example.com'].x == 1",
    ];
    let whole = [
        "'productName' in device.attributes['gpu.nvidia.com']",
        "device.attributes['gpu.nvidia.com'].exists(k, k == 'index')",
        "size(device.capacity) > 0",
    ];
    for expression in named {
        let s = wasmsched_dra::Selector::compile(expression).unwrap();
        let mut by_seen = std::collections::HashMap::new();
        for d in inventory.devices() {
            let seen = s.seen(d).unwrap_or_else(|| panic!("{expression} reads named fields only"));
            // Failures name their device: compared as failures only (they are not shared).
            let verdict = s.matches(&env, &DeviceValue::new(d)).map_err(|_| ());
            // Equal footprints, equal verdicts (the index one tells devices apart by index).
            let first = by_seen.entry(seen).or_insert(verdict);
            assert_eq!(*first, verdict, "{expression} on {}", d.id);
        }
        assert!(by_seen.len() < inventory.devices().len() / 2 || expression.contains("index"), "{expression}");
        // The allocator's table of them answers what evaluating would, for every device whose
        // footprint it has learnt, and knows nothing of the others.
        let mut footprints = wasmsched_dra::selector::Footprints::default();
        let mut learnt = std::collections::HashSet::new();
        for d in inventory.devices() {
            let truth = s.matches(&env, &DeviceValue::new(d));
            match footprints.verdict(&s, d) {
                Some(v) => assert_eq!(Ok(v), truth.map_err(|_| ()), "{expression} on {}", d.id),
                // Failures are not learnt (their message names the device).
                None => {
                    if let Ok(v) = truth {
                        assert!(learnt.insert(s.seen(d).unwrap()), "{expression}: a learnt footprint forgotten");
                        footprints.learn(&s, d, v);
                    }
                }
            }
        }
    }
    for expression in whole {
        let s = wasmsched_dra::Selector::compile(expression).unwrap();
        assert!(s.seen(&inventory.devices()[0]).is_none(), "{expression} reads a map as a whole");
        let mut footprints = wasmsched_dra::selector::Footprints::default();
        footprints.learn(&s, &inventory.devices()[0], true);
        assert_eq!(footprints.verdict(&s, &inventory.devices()[0]), None, "{expression}: never shared");
    }
}

#[test]
fn a_device_taint_rule_keeps_the_devices_it_selects_from_claims_that_do_not_tolerate_it() {
    let mut o = Objects::default();
    o.add(
        Path::new("objects.yaml"),
        "{apiVersion: resource.k8s.io/v1, kind: ResourceSlice, metadata: {name: s}, spec: {driver: gpu.nvidia.com, nodeName: n1, pool: {name: n1, generation: 1, resourceSliceCount: 1}, devices: [{name: gpu-0}, {name: gpu-1}, {name: gpu-2}]}}\n---\n\
         {apiVersion: resource.k8s.io/v1beta2, kind: DeviceTaintRule, metadata: {name: drain-gpu-0}, spec: {deviceSelector: {driver: gpu.nvidia.com, pool: n1, device: gpu-0}, taint: {key: example.com/maintenance, value: drain, effect: NoSchedule}}}\n---\n\
         {apiVersion: resource.k8s.io/v1beta2, kind: DeviceTaintRule, metadata: {name: note-all}, spec: {taint: {key: example.com/note, effect: None}}}\n---\n\
         {apiVersion: resource.k8s.io/v1beta2, kind: DeviceTaintRule, metadata: {name: other-driver}, spec: {deviceSelector: {driver: fpga.example.com}, taint: {key: example.com/x, effect: NoExecute}}}\n",
    )
    .unwrap();
    assert_eq!((o.slices.len(), o.taint_rules.len(), o.skipped.len()), (1, 3, 0));
    let (mut inventory, refused) = Inventory::from_slices(&o.slices);
    assert!(refused.is_empty(), "{refused:?}");
    inventory.apply_taint_rules(&o.taint_rules);
    // Only the device the first rule names carries a taint that keeps claims away; the
    // informational one and the other driver's leave the rest alone.
    let tainted: Vec<&str> =
        inventory.devices().iter().filter(|d| !d.taints.is_empty()).map(|d| &*d.id.device).collect();
    assert_eq!(tainted, ["gpu-0"]);
    let class = serde_yaml_ng::from_str("{metadata: {name: gpu.nvidia.com}, spec: {}}").unwrap();
    let mut a = Allocator::new(inventory, [class]);
    let n1: Node = serde_yaml_ng::from_str("{metadata: {name: n1}}").unwrap();
    let err = a.allocate(&gpus(3, "", ""), &n1).unwrap_err().to_string();
    assert!(err.contains("1 with a taint it does not tolerate"), "{err}");
    let two = a.allocate(&gpus(2, "", ""), &n1).unwrap();
    assert!(two.results.iter().all(|r| &*r.1.device != "gpu-0"), "{two:?}");
    let spec = claim(
        "devices: {requests: [{name: gpus, exactly: {deviceClassName: gpu.nvidia.com, count: 3, tolerations: [{key: example.com/maintenance, operator: Exists}]}}]}",
    );
    assert_eq!(a.allocate(&spec, &n1).unwrap().results.len(), 3, "tolerated: all three");
}

/// The drivers' kubelet plugins read a device's configuration from the claim's allocation (NVIDIA's
/// ComputeDomain channel learns its domain there): the class's config, then the claim's, each
/// naming the requests it is for, as kube-scheduler writes them.
#[test]
fn the_class_s_and_the_claim_s_device_configuration_go_into_the_allocation() {
    let mut o = examples();
    let opaque = |value: &str| {
        serde_json::json!({"driver": "gpu.nvidia.com", "parameters": {"apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig", "sharing": {"strategy": value}}})
    };
    let class = o.classes.iter_mut().find(|c| c.metadata.name.as_deref() == Some("gpu.nvidia.com")).unwrap();
    class.spec.as_mut().unwrap().config =
        Some(vec![serde_json::from_value(serde_json::json!({"opaque": opaque("TimeSlicing")})).unwrap()]);
    let mut a = allocator(&o);
    let spec: ResourceClaimSpec = serde_json::from_value(serde_json::json!({"devices": {
        "requests": [{"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
                     {"name": "b", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
        "config": [{"requests": ["b"], "opaque": opaque("MPS")},
                   {"requests": ["elsewhere"], "opaque": opaque("never")},
                   {"opaque": opaque("Everyone")}]}}))
    .unwrap();
    let status = serde_json::to_value(a.allocate(&spec, node(&o, "dgx-a100-0")).unwrap().to_status()).unwrap();
    let config = status["devices"]["config"].as_array().unwrap();
    let summary: Vec<(String, Vec<String>, String)> = config
        .iter()
        .map(|c| {
            let requests = c["requests"]
                .as_array()
                .map_or(vec![], |r| r.iter().map(|x| x.as_str().unwrap().to_string()).collect());
            let strategy = c["opaque"]["parameters"]["sharing"]["strategy"].as_str().unwrap().to_string();
            (c["source"].as_str().unwrap().to_string(), requests, strategy)
        })
        .collect();
    let row = |s: &str, r: &[&str], v: &str| (s.to_string(), r.iter().map(|x| x.to_string()).collect(), v.to_string());
    assert_eq!(
        summary,
        [
            row("FromClass", &["a", "b"], "TimeSlicing"),
            row("FromClaim", &["b"], "MPS"),
            row("FromClaim", &[], "Everyone")
        ]
    );
    // Without any configuration the allocation carries none.
    let plain = examples();
    let status = allocator(&plain).allocate(&gpus(1, "", ""), node(&plain, "dgx-a100-0")).unwrap().to_status();
    assert!(serde_json::to_value(status).unwrap()["devices"].get("config").is_none());
}
