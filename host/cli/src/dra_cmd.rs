//! `wasmsched dra`: Dynamic Resource Allocation offline — which devices on which node a claim
//! would get, and for every node that cannot serve it, why.

use std::path::PathBuf;

use anyhow::{Context, bail};
use serde_json::json;
use wasmsched_dra::{Allocator, Inventory, Objects};

/// `wasmsched dra` subcommands.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Which devices on which node a claim would get, and for every node that cannot serve it,
    /// why (which request, which selector or constraint). Exits 1 when no node can serve it.
    Explain(ExplainArgs),
}

/// Arguments of `dra explain`.
#[derive(clap::Args)]
pub struct ExplainArgs {
    /// The claim: a ResourceClaim or a ResourceClaimTemplate (YAML or JSON).
    claim: PathBuf,
    /// The cluster's DRA objects as you have them (ResourceSlices, DeviceClasses, claims already
    /// allocated, Nodes; multi-document YAML or `kubectl get -o yaml` lists, in any mix).
    #[arg(long, required = true, num_args = 1..)]
    objects: Vec<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Explain(args) => explain(args),
    }
}

fn explain(args: ExplainArgs) -> anyhow::Result<()> {
    let mut cluster = Objects::default();
    for path in &args.objects {
        cluster.read(path)?;
    }
    let mut given = Objects::default();
    given.read(&args.claim)?;
    let (name, spec) = match (given.claims.as_slice(), given.templates.as_slice()) {
        ([claim], []) => (claim.metadata.name.clone().unwrap_or_default(), claim.spec.clone().unwrap_or_default()),
        ([], [template]) => (
            template.metadata.name.clone().unwrap_or_default(),
            template.spec.as_ref().and_then(|s| s.spec.clone()).unwrap_or_default(),
        ),
        _ => bail!("{}: give exactly one ResourceClaim or ResourceClaimTemplate", args.claim.display()),
    };
    // Without Nodes, the nodes the slices name are all we know: explain on those, and say what
    // that cannot check.
    let nodes_guessed = cluster.nodes.is_empty();
    if nodes_guessed {
        cluster.nodes = nodes_named_by_slices(&cluster);
        if cluster.nodes.is_empty() {
            bail!(
                "no Node among --objects and no ResourceSlice names its node (spec.nodeName): give the nodes too (`kubectl get nodes -o yaml`)"
            );
        }
        eprintln!(
            "note: no Node among --objects: explaining on the {} node(s) the ResourceSlices name (spec.nodeName); \
             their labels and taints were not known, so slices that select nodes by label match none of them \
             (`kubectl get nodes -o yaml` gives them)",
            cluster.nodes.len()
        );
    }
    let (mut inventory, refused) = Inventory::from_slices(&cluster.slices);
    inventory.apply_taint_rules(&cluster.taint_rules);
    // Its own earlier allocation does not hold devices against it.
    let others = cluster.claims.iter().filter(|c| c.metadata.name.as_deref() != Some(name.as_str()));
    inventory.hold_allocated(others);
    let devices = inventory.devices().len();
    let held = inventory.devices().iter().filter(|d| inventory.is_in_use(&d.id)).count();
    let mut allocator = Allocator::new(inventory, cluster.classes.clone());
    let verdicts = wasmsched_dra::explain(&mut allocator, &spec, &cluster.nodes);
    let fits = verdicts.values().filter(|v| v.is_ok()).count();

    if args.json {
        let nodes: serde_json::Map<String, serde_json::Value> = verdicts
            .iter()
            .map(|(node, v)| {
                let value = match v {
                    Ok(a) => json!({
                        "fits": true,
                        "allocation": serde_json::to_value(a.to_status()).unwrap_or_default(),
                    }),
                    Err(why) => json!({"fits": false, "reason": why.to_string()}),
                };
                (node.to_string(), value)
            })
            .collect();
        let out = json!({
            "claim": name,
            "devices": devices,
            "devices_in_use": held,
            "refused": refused.iter().map(|r| json!({"what": r.what, "reason": r.reason})).collect::<Vec<_>>(),
            "skipped_kinds": cluster.skipped.iter().map(|(_, k)| k).collect::<Vec<_>>(),
            "nodes_that_fit": fits,
            "nodes_from_slices": nodes_guessed,
            "nodes": nodes,
        });
        println!("{}", serde_json::to_string_pretty(&out).context("writing JSON")?);
    } else {
        println!(
            "claim {name}: {} request(s), {} constraint(s); {devices} device(s) in complete pools, {held} held by other claims",
            spec.devices.as_ref().and_then(|d| d.requests.as_ref()).map_or(0, Vec::len),
            spec.devices.as_ref().and_then(|d| d.constraints.as_ref()).map_or(0, Vec::len),
        );
        for r in &refused {
            println!("  not offered: {}: {}", r.what, r.reason);
        }
        let width = verdicts.keys().map(|n| n.len()).max().unwrap_or(0);
        for (node, v) in &verdicts {
            match v {
                Ok(a) => println!("{node:<width$}  fits: {a}"),
                Err(why) => println!("{node:<width$}  no: {why}"),
            }
        }
    }
    if fits == 0 {
        bail!("claim {name} fits on none of the {} node(s)", verdicts.len());
    }
    Ok(())
}

/// A Node with only its name for each node a ResourceSlice is published for.
fn nodes_named_by_slices(cluster: &Objects) -> Vec<k8s_openapi::api::core::v1::Node> {
    let names: std::collections::BTreeSet<&str> =
        cluster.slices.iter().filter_map(|s| s.spec.node_name.as_deref()).filter(|n| !n.is_empty()).collect();
    names
        .into_iter()
        .map(|name| k8s_openapi::api::core::v1::Node {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            ..Default::default()
        })
        .collect()
}
