//! `wasmsched policy`: pin, check and push policy sets, and steer a running scheduler's registry.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use wasmsched_core::{NodeTable, bind, place, release};
use wasmsched_registry::control::{self, Op};
use wasmsched_registry::{Decision, DirSource, Preparer, Registry, SPEC_FILE, Sample, Source, digest_of};
use wasmsched_runtime::{Runtime, RuntimeConfig};
use wasmsched_sim::generate::{self, Rng};

/// Policy subcommands.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Print the `sha256:` digest that pins a component in a policy set.
    Digest {
        /// The component (`.wasm`).
        file: PathBuf,
    },
    /// Validate a policy set and run every gate a scheduler would (digests, compile, instantiate,
    /// smoke test on a synthetic cluster), without a scheduler.
    Check {
        /// The spec file, or a directory holding `policy.yaml`.
        path: PathBuf,
    },
    /// Print a built-in policy set as the document `simulate --policy NAME` loads: a starting
    /// point for a set of your own (`fgd` and `fgd-cpu` are shown without their target workload,
    /// which `simulate` derives from the trace).
    Builtin {
        /// The score policy: random, dot-prod, gpu-clustering, gpu-packing, best-fit, fgd, fgd-cpu,
        /// least-allocated, most-allocated or gpu-topology.
        name: String,
        /// Add a fair-share stage: proportion, drf or decayed-usage.
        #[arg(long, value_name = "POLICY")]
        fair_share: Option<String>,
        /// Add priority preemption.
        #[arg(long)]
        preempt: bool,
    },
    /// Store a file (a component or a spec) in the NATS object store bucket schedulers watch.
    Push {
        /// The file.
        file: PathBuf,
        /// Object name (what `object:NAME` sources refer to).
        #[arg(long)]
        name: String,
        /// The bucket.
        #[arg(long, default_value = "wasmsched-policies")]
        bucket: String,
        /// How to reach NATS.
        #[command(flatten)]
        nats: wasmsched_events::cli::Nats,
    },
    /// The running scheduler's live version, candidate, shadow statistics and history.
    Status {
        /// How to reach NATS.
        #[command(flatten)]
        nats: wasmsched_events::cli::Nats,
        /// Print the JSON reply.
        #[arg(long)]
        json: bool,
    },
    /// Make the candidate live now (skipping the rest of its shadow run).
    Promote {
        /// How to reach NATS.
        #[command(flatten)]
        nats: wasmsched_events::cli::Nats,
    },
    /// Restore the last good version now.
    Rollback {
        /// How to reach NATS.
        #[command(flatten)]
        nats: wasmsched_events::cli::Nats,
    },
    /// Measure hot reload: time from artifact arrival to live (with and without a cached compiled
    /// artifact), and p99 decision latency with and without swaps every 10 ms, in one run.
    Bench(BenchArgs),
}

/// `policy bench` options.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// The component to measure arrival-to-live with (default: the built-in `gpu-share-score`
    /// padded to `--size` with a custom section).
    #[arg(long)]
    plugin: Option<PathBuf>,
    /// Size the default plugin is padded to, bytes.
    #[arg(long, default_value_t = 1 << 20)]
    size: usize,
    /// Arrival-to-live repetitions per case.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Nodes of the generated cluster for the latency comparison.
    #[arg(long, default_value_t = 1_000)]
    nodes: usize,
    /// Decisions per phase; the three phases (no swaps, prepared, fresh) alternate, `--rounds`
    /// times each. Short phases (~35 ms) spread this VM's slow swings over every case alike: with
    /// phases of 5,000 decisions the swapper doing nothing (`--null-swaps`) read 0.82-1.22×.
    #[arg(long, default_value_t = 500)]
    decisions: usize,
    /// Rounds of the three phases.
    #[arg(long, default_value_t = 40)]
    rounds: usize,
    /// Control run: the swapper threads wake as usual but never swap, so the ratios show the
    /// comparison's own noise floor on this machine.
    #[arg(long)]
    null_swaps: bool,
    /// No progress bar (there is none anyway when stderr is not a terminal).
    #[arg(long)]
    quiet: bool,
    /// Swap interval during the swap phases, milliseconds.
    #[arg(long, default_value_t = 10)]
    swap_ms: u64,
    /// Stage each new version until its mirrors caught up, this many changes per plugin instance
    /// before each decision (`Registry::with_warm_up`, counted in that decision's latency); 0
    /// (the default) swaps at once and lets the first decision with the version catch up.
    #[arg(long, default_value_t = 0)]
    warm_up: usize,
    /// Load every plugin of a new version anew, changed or not (by default a version keeps the
    /// live version's unchanged plugins, instances included): the comparison for keeping them.
    #[arg(long)]
    reload_all: bool,
}

fn nats_config(nats: &wasmsched_events::cli::Nats) -> anyhow::Result<wasmsched_events::NatsConfig> {
    nats.config()?.context("give --nats URL (or --nats-config FILE)")
}

pub fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Builtin { name, fair_share, preempt } => {
            let options = crate::policy::SetOptions {
                score: Some(&name),
                fair_share: fair_share.as_deref(),
                preempt,
                ..Default::default()
            };
            print!("{}", serde_yaml_ng::to_string(&crate::policy::builtin_set(&options)?)?);
            Ok(())
        }
        Command::Digest { file } => {
            let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            println!("{}", digest_of(&bytes));
            Ok(())
        }
        Command::Check { path } => check(path),
        Command::Push { file, name, bucket, nats } => {
            let bytes = wasmsched_runtime::read_component(&file, wasmsched_runtime::component_limit())?;
            let size = wasmsched_registry::push(&nats_config(&nats)?, &bucket, &name, &bytes)?;
            println!("pushed {name} ({size} bytes) to bucket {bucket}\ndigest {}", digest_of(&bytes));
            Ok(())
        }
        Command::Status { nats, json } => {
            let reply = request(&nats, Op::Status)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&reply)?);
            } else {
                print_status(&reply);
            }
            Ok(())
        }
        Command::Promote { nats } => {
            let live = request(&nats, Op::Promote)?;
            println!("live: {}", live.as_str().unwrap_or_default());
            Ok(())
        }
        Command::Rollback { nats } => {
            let live = request(&nats, Op::Rollback)?;
            println!("live: {}", live.as_str().unwrap_or_default());
            Ok(())
        }
        Command::Bench(args) => bench(args),
    }
}

fn request(nats: &wasmsched_events::cli::Nats, op: Op) -> anyhow::Result<serde_json::Value> {
    let reply = control::request(&nats_config(nats)?, op, Duration::from_secs(10))?;
    if !reply.ok {
        bail!("{}", reply.error.unwrap_or_else(|| "refused".into()));
    }
    Ok(reply.result)
}

fn print_status(s: &serde_json::Value) {
    let text = |v: &serde_json::Value| v.as_str().map(str::to_owned).unwrap_or_else(|| "-".into());
    println!(
        "live       {} ({}){}",
        text(&s["live"]),
        text(&s["live_origin"]),
        if s["on_probation"] == true { " on probation" } else { "" }
    );
    println!("last good  {}", text(&s["last_good"]));
    if let Some(w) = s["live_window"].as_object() {
        println!(
            "window     {} decisions, faults {}, unschedulable {}, p99 {} ms",
            w["decisions"], w["fault_rate"], w["unschedulable_rate"], w["p99_ms"]
        );
    }
    println!("candidate  {}", text(&s["candidate"]));
    if let Some(sh) = s["shadow"].as_object() {
        println!(
            "shadow     {} compared, {} identical, fault rate {}, mean score delta {}",
            sh["compared"], sh["identical_share"], sh["fault_rate"], sh["mean_score_delta"]
        );
    }
    for e in s["source_errors"].as_array().into_iter().flatten() {
        println!("source     {}: {}", text(&e[0]), text(&e[1]));
    }
    println!("history");
    for h in s["history"].as_array().into_iter().flatten() {
        println!(
            "  {:<24} {:<11} {}  ({})",
            text(&h["label"]),
            text(&h["outcome"]),
            text(&h["reason"]),
            text(&h["origin"])
        );
    }
}

fn check(path: PathBuf) -> anyhow::Result<()> {
    let fetched = DirSource::new(&path).fetch()?;
    let rt = Arc::new(Runtime::new(crate::policy::runtime_config())?);
    let v = Preparer::new(rt, crate::policy::builtins()).prepare(&fetched, 1, &Sample::synthetic())?;
    println!("policy set {} passes every gate ({:.1} ms)", v.spec.name, v.prepare_time.as_secs_f64() * 1e3);
    for p in &v.plugins {
        let stages: Vec<_> = p.stages.iter().map(|s| s.as_str()).collect();
        println!("  {:<16} {:<28} {}", p.name, stages.join(","), p.digest);
    }
    Ok(())
}

/// Append a custom section so a component reaches `size` bytes (a stand-in for a large plugin).
fn padded(wasm: &[u8], size: usize) -> Vec<u8> {
    let mut out = wasm.to_vec();
    let name = b"wasmsched-bench-padding";
    let payload = size.saturating_sub(wasm.len() + name.len() + 16);
    let mut body = Vec::new();
    leb(&mut body, name.len());
    body.extend_from_slice(name);
    body.resize(body.len() + payload, 0);
    out.push(0); // custom section
    leb(&mut out, body.len());
    out.extend_from_slice(&body);
    out
}

fn leb(out: &mut Vec<u8>, mut v: usize) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn p99(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1]
}

/// The packing set the latency comparison swaps, in two versions: the second changes the packing
/// score (its budget), so every swap replaces that plugin and keeps `resource-fit` — a rollout of
/// one changed plugin. (Two identical versions would keep every plugin and swap at no cost.) No
/// unschedulable-rise check: the generated cluster fills up during the run (12 % of tasks
/// unschedulable in its first window, ~40 % later), which is the workload, not the version, and
/// an automatic rollback would put a third version live.
const BASE_SPECS: [&str; 2] = [
    "name: bench\nplugins:\n  fit: { source: \"builtin:resource-fit\" }\n  pack: { source: \"builtin:most-allocated\" }\nstages:\n  filter: [fit]\n  score: [{ plugin: pack }]\nrollback: { max_unschedulable_increase: null }\n",
    "name: bench\nplugins:\n  fit: { source: \"builtin:resource-fit\" }\n  pack: { source: \"builtin:most-allocated\", deadline_ms: 20 }\nstages:\n  filter: [fit]\n  score: [{ plugin: pack }]\nrollback: { max_unschedulable_increase: null }\n",
];

fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let wasm = match &args.plugin {
        Some(p) => std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
        None => padded(wasmsched_plugins::BEST_FIT.wasm, args.size),
    };
    println!(
        "plugin: {} bytes ({})",
        wasm.len(),
        args.plugin
            .as_ref()
            .map_or("built-in gpu-share-score padded with a custom section".into(), |p| p.display().to_string())
    );

    // Arrival to live: the artifact and spec land in a watched directory; fetch → digest →
    // compile or cache → instantiate → smoke test → swap, timed until `current()` returns it.
    let src = tempfile::tempdir()?;
    let cache = tempfile::tempdir()?;
    std::fs::write(src.path().join("plugin.wasm"), &wasm)?;
    let spec = format!(
        "name: arrived\nplugins:\n  fit: {{ source: \"builtin:resource-fit\" }}\n  score: {{ source: \"file:plugin.wasm\", digest: \"{}\", config: '{{\"policy\":\"best-fit\"}}' }}\nstages:\n  filter: [fit]\n  score: [{{ plugin: score }}]\n",
        digest_of(&wasm)
    );
    let warm = Runtime::new(RuntimeConfig { cache_dir: Some(cache.path().to_path_buf()), ..RuntimeConfig::default() })?;
    warm.load(&wasm, wasmsched_runtime::PluginConfig::new("warm-up").with_config(r#"{"policy":"best-fit"}"#))?;
    drop(warm);
    // Steps: each arrival-to-live run, then each phase of the latency comparison.
    let progress =
        crate::progress::Progress::new((2 * args.repeat + 3 * args.rounds.max(1)) as u64, "measurements", args.quiet);
    let mut rows = Vec::new();
    for cached in [false, true] {
        let mut times = Vec::new();
        for _ in 0..args.repeat {
            // A fresh runtime each time: no in-memory artifact; with `cached`, the disk cache
            // already holds the compiled component (written by the warm-up load above).
            let config =
                RuntimeConfig { cache_dir: cached.then(|| cache.path().to_path_buf()), ..RuntimeConfig::default() };
            let preparer = Preparer::new(Arc::new(Runtime::new(config)?), crate::policy::builtins());
            let registry = initial_registry(&preparer)?;
            let _ = std::fs::remove_file(src.path().join(SPEC_FILE));
            let mut source = DirSource::new(src.path());
            std::fs::write(src.path().join(SPEC_FILE), &spec)?;
            let arrived = Instant::now();
            let fetched = source.poll()?.context("the new version")?;
            registry.offer(&fetched, &preparer).map_err(|e| anyhow::anyhow!("{e}"))?;
            assert_eq!(registry.current().spec.name, "arrived");
            times.push(arrived.elapsed().as_secs_f64() * 1e3);
            progress.step();
        }
        rows.push((cached, median(times.clone()), times));
    }
    progress.suspend(|| {
        for (cached, med, all) in &rows {
            let all: Vec<String> = all.iter().map(|t| format!("{t:.1}")).collect();
            println!(
                "arrival to live, {}: median {med:.1} ms (runs: {} ms)",
                if *cached { "cached compiled artifact" } else { "compiling" },
                all.join(", ")
            );
        }
    });

    // Decision latency with and without swaps, alternating phases in one run.
    let preparer = Preparer::new(Arc::new(Runtime::new(crate::policy::runtime_config())?), crate::policy::builtins())
        .keep_unchanged(!args.reload_all);
    let registry = initial_registry(&preparer)?;
    let registry = Arc::new(if args.warm_up > 0 { registry.with_warm_up(args.warm_up) } else { registry });
    let mut rng = Rng::new(42);
    let mut nodes = generate::cluster(&mut rng, args.nodes);
    let mut running = std::collections::VecDeque::new();
    let mut next = 0u64;
    let variants = Arc::new([base_version(0)?, base_version(1)?]);
    // Two versions prepared ahead and swapped in turn: the cost of the swap itself (and of the
    // mirror deltas the changed plugin's instances catch up on). `fresh`: every swap prepares a
    // new version on another thread, as a real rollout does — the preparation's CPU included.
    // Both alternate the two variants: each swap replaces the packing score and keeps the filter.
    const CASES: [&str; 3] = ["no swaps", "swaps of prepared versions", "swaps of freshly prepared versions"];
    let mut latencies: [Latencies; 3] = Default::default();
    let mut swaps = [0u64; 3];
    // Prepared once, before any phase, so no phase pays for preparing them; each install catches
    // the incoming one up (off the loop) with what changed while the other was live.
    let live = registry.current();
    let pool = Arc::new([
        preparer.prepare_beside(&variants[0], 0, &Sample::synthetic(), Some(&live))?,
        preparer.prepare_beside(&variants[1], 0, &Sample::synthetic(), Some(&live))?,
    ]);
    drop(live);
    for _round in 0..args.rounds.max(1) {
        for case in 0..3 {
            let stop = Arc::new(AtomicBool::new(false));
            let swapper = (case > 0).then(|| {
                let (registry, preparer, stop, variants, pool) =
                    (registry.clone(), preparer.clone(), stop.clone(), variants.clone(), pool.clone());
                let (every, null) = (Duration::from_millis(args.swap_ms), args.null_swaps);
                std::thread::spawn(move || -> anyhow::Result<u64> {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(every);
                        if null {
                            n += 1;
                        } else if case == 1 {
                            // Re-stamp a prepared set: the same plugins (the kept filter live all
                            // along, the packing score's instances warm since its last turn), a
                            // new version number.
                            let v: &wasmsched_registry::PolicyVersion = &pool[(n % 2) as usize];
                            registry.install(wasmsched_registry::PolicyVersion {
                                set: v.set.clone(),
                                spec: v.spec.clone(),
                                version: registry.next_version(),
                                origin: v.origin.clone(),
                                fingerprint: v.fingerprint.clone(),
                                plugins: v.plugins.clone(),
                                prepare_time: v.prepare_time,
                            });
                            n += 1;
                        } else if registry.offer(&variants[(n % 2) as usize], &preparer).is_ok() {
                            n += 1;
                        }
                    }
                    Ok(n)
                })
            });
            // A version that went live after the previous phase's last decision (a swapper
            // finishing its swap while being stopped) caught up to an older sample: let it catch up
            // here, untimed, and count the first decision as one with a new version only when a
            // swap of this phase made it live.
            let live = registry.current();
            live.set.catch_up(&nodes, usize::MAX);
            latencies[case].version = live.version;
            for _ in 0..args.decisions {
                next += 1;
                let task = generate::task(&mut rng, format!("t{next}"));
                decide(&registry, &mut nodes, &mut running, task, &mut latencies[case]);
            }
            stop.store(true, Ordering::Relaxed);
            if let Some(s) = swapper {
                swaps[case] += s.join().map_err(|_| anyhow::anyhow!("swapper panicked"))??;
            }
            progress.step();
        }
    }
    drop(progress);
    let base_p99 = p99(latencies[0].all.clone());
    println!(
        "decision latency over {} nodes, {} decisions per case ({} rounds of {}), {} every {} ms, {}, {}:",
        args.nodes,
        latencies[0].all.len(),
        args.rounds.max(1),
        args.decisions,
        if args.null_swaps { "null swaps (control: the swapper never swaps)" } else { "swaps" },
        args.swap_ms,
        match args.warm_up {
            0 => "swapped at once".to_string(),
            n => format!("warm-up {n} changes per decision"),
        },
        if args.reload_all {
            "every plugin loaded anew (--reload-all)"
        } else {
            "the packing score replaced, the filter kept"
        }
    );
    for case in 0..3 {
        let l = &latencies[case];
        let q = p99(l.all.clone());
        println!(
            "  {:<36} p99 {:>8.1} µs  ratio {:.3}  median {:>6.1} µs  swaps {}",
            CASES[case],
            q,
            q / base_p99,
            median(l.all.clone()),
            swaps[case]
        );
        if case > 0 && !l.first_after_swap.is_empty() {
            // Where the tail comes from: the first decision with each version, or all of them.
            let rest = p99(l.others.clone());
            println!(
                "    first decision with a new version: {} of them, median {:.1} µs; the others: p99 {:.1} µs (ratio {:.3})",
                l.first_after_swap.len(),
                median(l.first_after_swap.clone()),
                rest,
                rest / base_p99
            );
        }
    }
    Ok(())
}

/// Variant `i` of the packing set the latency comparison swaps.
fn base_version(i: usize) -> anyhow::Result<wasmsched_registry::Fetched> {
    Ok(wasmsched_registry::Fetched {
        spec: wasmsched_registry::PolicySetSpec::parse("bench", BASE_SPECS[i])?,
        origin: "bench".into(),
        artifacts: Default::default(),
        fingerprint: String::new(),
    })
}

fn initial_registry(preparer: &Preparer) -> anyhow::Result<Registry> {
    Ok(Registry::new(preparer.prepare(&base_version(0)?, 1, &Sample::synthetic())?, None))
}

type Running = std::collections::VecDeque<(u32, wasmsched_api::Task, Vec<wasmsched_api::DeviceShare>)>;

/// Latencies of one case, the first decision with each new version apart (where a swap's cost
/// lands: the incoming version's mirrors catching up).
#[derive(Default)]
struct Latencies {
    all: Vec<f64>,
    first_after_swap: Vec<f64>,
    others: Vec<f64>,
    version: u64,
}

fn decide(
    registry: &Registry,
    nodes: &mut NodeTable,
    running: &mut Running,
    task: wasmsched_api::Task,
    lat: &mut Latencies,
) {
    // Timed as the loop pays it: the sample a preparation asks for is taken here.
    let started = Instant::now();
    if registry.wants_sample() {
        registry.offer_sample(nodes);
    }
    registry.warm(nodes);
    let live = registry.current();
    let result = place(&live.set, nodes, &task, 0);
    let latency = started.elapsed();
    registry.record(&live, Decision { task: &task, nodes, result: &result, latency });
    let us = latency.as_secs_f64() * 1e6;
    lat.all.push(us);
    if std::mem::replace(&mut lat.version, live.version) != live.version {
        lat.first_after_swap.push(us);
    } else {
        lat.others.push(us);
    }
    if let Ok(p) = result
        && nodes.update_usage(p.node, |n| bind(n, &task, &p.devices)).is_some_and(|r| r.is_ok())
    {
        running.push_back((p.node, task, p.devices));
    }
    while running.len() > nodes.len() * 2 {
        let (slot, t, d) = running.pop_front().expect("non-empty");
        nodes.update_usage(slot, |n| release(n, &t, &d));
    }
}
