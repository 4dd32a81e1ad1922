//! `wasmsched experiment`: the FGD paper's grid (traces × policies × seeds) with the table and
//! figures it reports.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::chart::Axes;

use anyhow::{Context, bail, ensure};
use serde::Serialize;
use wasmsched_dashboard::View;
use wasmsched_dashboard::view::{ExperimentRow, ExperimentsView};
use wasmsched_sim::experiment::{self, Grid, MAX_COLUMN, Outcome, Row, Trace};
use wasmsched_sim::trace;

use crate::policy::{PAPER_POLICIES, policy_set};

/// The 17 workloads of the paper's grid (`docs/openb-protocol.md` §0).
pub const PAPER_TRACES: [&str; 17] = [
    "default",
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpushare100",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "gpuspec33",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
];

/// Arguments of `experiment`.
#[derive(clap::Args)]
pub struct Args {
    /// Folder with `openb_node_list_gpu_node.csv` and `openb_pod_list_<trace>.csv` (default: the
    /// repository's `examples/traces/openb`, under the current directory or in the checkout this
    /// binary was built from).
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// Traces, comma-separated, or `paper` for the paper's 17.
    #[arg(long, default_value = "paper", value_delimiter = ',')]
    traces: Vec<String>,
    /// Policies, comma-separated, or `paper` for the paper's six.
    #[arg(long, default_value = "paper", value_delimiter = ',')]
    policies: Vec<String>,
    /// Seeds: a range `42-51` or a list `42,43`.
    #[arg(long, default_value = "42-51")]
    seeds: String,
    /// Submit pods until this multiple of GPU capacity has arrived (a positive number).
    #[arg(long, default_value_t = 1.3, allow_negative_numbers = true)]
    tune: f64,
    /// Experiments run in parallel (default: one per core).
    #[arg(long)]
    jobs: Option<usize>,
    /// Where the CSVs, the summary and the figures go.
    #[arg(long, default_value = "target/experiment")]
    out: PathBuf,
    /// `NAME=PATH`: add a policy set of your own (a directory with `policy.yaml`, or the file) to
    /// the grid as policy NAME, beside `--policies` (repeatable). It passes the hot-reload gates
    /// once before the grid starts; each experiment gets its own instances.
    #[arg(long = "policy-set", value_name = "NAME=PATH", conflicts_with = "native")]
    policy_sets: Vec<crate::replay_policies::NamedSet>,
    /// No progress bar (there is none anyway when stderr is not a terminal).
    #[arg(long)]
    quiet: bool,
    /// Run the policies natively instead of as Wasm components.
    #[arg(long)]
    native: bool,
    /// Skip malformed pod rows (reporting each) instead of failing.
    #[arg(long)]
    lenient: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
    /// Run nothing: draw the figures again from the CSVs and `summary.json` already in `--out`
    /// (to get the PNGs or the zoomed charts of an earlier run without repeating it).
    #[arg(long, conflicts_with = "serve")]
    redraw: bool,
    /// Serve the dashboard here: the grid's progress while it runs, then its table and each
    /// trace's allocation curves per policy, until Ctrl-C (e.g. `127.0.0.1:8080`).
    #[arg(long, value_name = "ADDR")]
    serve: Option<std::net::SocketAddr>,
}

#[derive(Serialize)]
struct Summary {
    experiments: usize,
    traces: Vec<String>,
    policies: Vec<String>,
    seeds: Vec<u64>,
    tune: f64,
    runtime: &'static str,
    jobs: usize,
    total_seconds: f64,
    replay_seconds_mean: f64,
    skipped_rows: Vec<String>,
    /// Traces on which FGD does not have the highest mean allocation at 130 % among the paper's
    /// policies (empty = it always does).
    fgd_not_best_at_130: Option<Vec<String>>,
    /// `fgd-cpu` against FGD at 130 %, when the grid has both.
    fgd_cpu_over_fgd_at_130: Option<GainSummary>,
    table: Vec<TableRow>,
}

#[derive(Serialize)]
struct GainSummary {
    /// Traces where fgd-cpu's mean is higher by more than the standard errors (`Gain::significant`).
    better: usize,
    /// The largest loss (negative) or smallest gain, percentage points.
    worst: f64,
    traces: Vec<GainRow>,
}

#[derive(Serialize)]
struct GainRow {
    workload: String,
    seeds: usize,
    mean_difference: f64,
    paired_standard_error: f64,
    fgd_standard_error: f64,
    significant: bool,
}

fn gain_summary(outcomes: &[Outcome]) -> Option<GainSummary> {
    let gains = experiment::gains_at_130(outcomes, "fgd-cpu", "fgd");
    (!gains.is_empty()).then(|| GainSummary {
        better: gains.iter().filter(|g| g.significant()).count(),
        worst: gains.iter().map(|g| g.mean).fold(f64::INFINITY, f64::min),
        traces: gains
            .iter()
            .map(|g| GainRow {
                workload: g.trace.clone(),
                seeds: g.seeds,
                mean_difference: g.mean,
                paired_standard_error: g.paired_se,
                fgd_standard_error: g.baseline_se,
                significant: g.significant(),
            })
            .collect(),
    })
}

#[derive(Serialize)]
struct TableRow {
    workload: String,
    policy: String,
    seeds: usize,
    alloc_100_mean: f64,
    alloc_100_std: f64,
    alloc_130_mean: f64,
    alloc_130_std: f64,
}

fn parse_seeds(text: &str) -> anyhow::Result<Vec<u64>> {
    let seeds: Vec<u64> = match text.split_once('-') {
        Some((a, b)) => {
            let (a, b): (u64, u64) = (a.trim().parse()?, b.trim().parse()?);
            ensure!(a <= b, "seed range {a}-{b} is empty");
            (a..=b).collect()
        }
        None => text.split(',').map(|s| s.trim().parse::<u64>()).collect::<Result<_, _>>()?,
    };
    ensure!(!seeds.is_empty() && seeds.len() <= 10_000, "give between 1 and 10000 seeds");
    Ok(seeds)
}

fn expand(list: &[String], paper: &[&str]) -> Vec<String> {
    if list.len() == 1 && list[0] == "paper" { paper.iter().map(|s| s.to_string()).collect() } else { list.to_vec() }
}

/// Where the openb traces are when `--data` is not given: `examples/traces/openb` under the
/// current directory, in the checkout this binary was built from, or under a directory above the
/// binary (a checkout's `target/release`).
fn openb_data() -> anyhow::Result<PathBuf> {
    const DIR: &str = "examples/traces/openb";
    let here = std::env::current_dir().ok();
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let exe = std::env::current_exe().ok();
    let above_exe = exe.iter().flat_map(|e| e.ancestors().skip(1)).map(Path::to_path_buf);
    here.into_iter()
        .chain(std::iter::once(checkout))
        .chain(above_exe)
        .map(|d| d.join(DIR))
        .find(|d| d.join("openb_node_list_gpu_node.csv").is_file())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "the openb traces ({DIR}) are not under the current directory, the checkout this \
                 binary was built from, or a directory above it"
            )
        })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.redraw {
        return redraw(&args.out);
    }
    let started = Instant::now();
    ensure!(args.tune > 0.0 && args.tune.is_finite(), "--tune must be a positive number");
    let seeds = parse_seeds(&args.seeds).with_context(|| format!("--seeds {:?}", args.seeds))?;
    let policies = expand(&args.policies, &PAPER_POLICIES);
    let names = expand(&args.traces, &PAPER_TRACES);
    let data = match &args.data {
        Some(dir) => dir.clone(),
        None => openb_data().context("give --data DIR")?,
    };
    let nodes = trace::load_nodes(&data.join("openb_node_list_gpu_node.csv"))?;
    ensure!(!nodes.is_empty(), "the node list is empty");
    let mut traces = Vec::new();
    let mut skipped_rows = Vec::new();
    for name in &names {
        let (pods, skipped) = trace::load_pods_lenient(&data.join(format!("openb_pod_list_{name}.csv")), args.lenient)?;
        skipped_rows.extend(skipped.iter().map(ToString::to_string));
        traces.push(Trace { name: name.clone(), pods });
    }
    for e in &skipped_rows {
        tracing::warn!("skipped malformed row: {e}");
    }
    let runtime = crate::policy::replay_runtime(args.native)?;
    // Sets of the operator's: gated once here, prepared per experiment (instances are per set).
    let preparer = runtime.clone().map(|rt| wasmsched_registry::Preparer::new(rt, crate::policy::builtins()));
    let mut custom: std::collections::BTreeMap<String, wasmsched_registry::Fetched> = Default::default();
    for named in &args.policy_sets {
        let preparer = preparer.as_ref().context("policy sets run as Wasm components")?;
        ensure!(
            !policies.contains(&named.name) && !custom.contains_key(&named.name),
            "--policy-set {}: the grid already has a policy of that name",
            named.name
        );
        let fetched =
            crate::replay_policies::fetch_checked(preparer, &named.path, &wasmsched_registry::Sample::synthetic())?;
        custom.insert(named.name.clone(), fetched);
    }
    // Fail on a bad policy name before the grid starts.
    for p in &policies {
        policy_set(
            runtime.as_ref(),
            p,
            0,
            &[wasmsched_api::fragmentation::TypicalPod {
                cpu_milli: 0,
                milli: 0,
                count: 0,
                models: vec![],
                weight: 1.0,
            }],
        )?;
    }
    let jobs = args.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
    let policies: Vec<String> = policies.into_iter().chain(args.policy_sets.iter().map(|n| n.name.clone())).collect();
    let grid = Grid { nodes, traces, policies: policies.clone(), seeds: seeds.clone(), tune: args.tune };
    let total = grid.traces.len() * grid.policies.len() * grid.seeds.len();
    let bar = crate::progress::Progress::new(total as u64, "experiments", args.quiet);
    let runtime_name = if args.native { "native" } else { "Wasm" };
    let source = format!(
        "experiment: {} traces × {} policies × {} seeds, tune {}, {runtime_name}",
        names.len(),
        policies.len(),
        seeds.len(),
        args.tune
    );
    let grid_view = ExperimentsView {
        done: 0,
        total,
        traces: names.clone(),
        policies: policies.clone(),
        seeds: seeds.len(),
        rows: Vec::new(),
    };
    let first = || View { source: source.clone(), experiments: Some(Arc::new(grid_view.clone())), ..View::default() };
    let board = args.serve.map(|addr| crate::dashboard::Board::start(addr, first())).transpose()?;
    let show = |experiments: ExperimentsView, source: String| {
        if let Some(board) = &board {
            let view = View { source, experiments: Some(Arc::new(experiments)), ..View::default() };
            board.publisher.publish(view);
        }
    };
    let outcomes = experiment::run(
        &grid,
        jobs,
        |policy, seed, typical| match (custom.get(policy), preparer.as_ref()) {
            (Some(fetched), Some(preparer)) => preparer
                .prepare(fetched, 1, &wasmsched_registry::Sample::synthetic())
                .map(|v| v.set)
                .map_err(|e| anyhow::anyhow!("policy set {policy}: {e}")),
            _ => policy_set(runtime.as_ref(), policy, seed, typical),
        },
        |p| {
            bar.at(p.done as u64);
            show(ExperimentsView { done: p.done, ..grid_view.clone() }, source.clone());
        },
    )?;
    drop(bar);
    if let Some(o) = outcomes.iter().find(|o| o.faulted > 0) {
        bail!("{} of {}'s pods failed by plugin faults on {} seed {}", o.faulted, o.policy, o.trace, o.seed);
    }

    std::fs::create_dir_all(args.out.join("figures")).with_context(|| format!("creating {}", args.out.display()))?;
    write_series(&args.out.join("allocation.csv"), &outcomes, args.tune, |o| &o.allocation)?;
    write_series(&args.out.join("fragmentation.csv"), &outcomes, args.tune, |o| &o.fragmentation)?;
    write_series(&args.out.join("fragmentation_ratio.csv"), &outcomes, args.tune, |o| &o.fragmentation_ratio)?;
    let rows = experiment::table(&outcomes);
    write_table(&args.out.join("table.csv"), &rows)?;
    let runtime = if args.native { "native" } else { "Wasm" };
    let seeds_note = format!("{} seed{}", seeds.len(), if seeds.len() == 1 { "" } else { "s" });
    draw_figures(&args.out, &names, &policies, &seeds_note, args.tune, runtime, &outcomes)?;
    let summary = Summary {
        experiments: outcomes.len(),
        traces: names,
        policies: policies.clone(),
        seeds,
        tune: args.tune,
        runtime: if args.native { "native" } else { "wasm" },
        jobs,
        total_seconds: started.elapsed().as_secs_f64(),
        replay_seconds_mean: outcomes.iter().map(|o| o.replay_time.as_secs_f64()).sum::<f64>()
            / outcomes.len().max(1) as f64,
        skipped_rows,
        fgd_not_best_at_130: (policies.iter().any(|p| p == "fgd")
            && policies.iter().filter(|p| PAPER_POLICIES.contains(&p.as_str())).count() > 1)
            .then(|| {
                let paper: Vec<Row> =
                    rows.iter().filter(|r| PAPER_POLICIES.contains(&r.policy.as_str())).cloned().collect();
                experiment::not_best_at_130(&paper, "fgd").into_iter().map(String::from).collect()
            }),
        fgd_cpu_over_fgd_at_130: gain_summary(&outcomes),
        table: rows
            .iter()
            .map(|r| TableRow {
                workload: r.trace.clone(),
                policy: r.policy.clone(),
                seeds: r.seeds,
                alloc_100_mean: r.at_100.0,
                alloc_100_std: r.at_100.1,
                alloc_130_mean: r.at_130.0,
                alloc_130_std: r.at_130.1,
            })
            .collect(),
    };
    let json = serde_json::to_string_pretty(&summary)?;
    std::fs::write(args.out.join("summary.json"), &json)?;
    show(
        ExperimentsView { done: outcomes.len(), rows: experiment_rows(&outcomes, &rows), ..grid_view.clone() },
        format!("{source} — grid finished"),
    );
    if args.json {
        println!("{json}");
        return serve(board);
    }
    println!(
        "{} experiments ({} traces × {} policies × {} seeds, {}) in {:.1} s on {} threads; mean replay {:.2} s",
        summary.experiments,
        summary.traces.len(),
        summary.policies.len(),
        summary.seeds.len(),
        summary.runtime,
        summary.total_seconds,
        jobs,
        summary.replay_seconds_mean
    );
    println!("\nGPU allocation ratio (%) at 130 % arrived, mean over seeds:");
    print!("{:<13}", "workload");
    for p in &policies {
        print!("{p:>16}");
    }
    println!();
    for name in &summary.traces {
        print!("{name:<13}");
        for p in &policies {
            let v = rows.iter().find(|r| &r.trace == name && &r.policy == p).map(|r| r.at_130.0);
            print!("{:>16}", v.map_or("-".into(), |v| format!("{v:.2}")));
        }
        println!();
    }
    if let Some(bad) = &summary.fgd_not_best_at_130 {
        if bad.is_empty() {
            println!("\nFGD has the highest allocation ratio at 130 % of the paper's policies on every trace.");
        } else {
            println!("\nFGD is NOT the highest of the paper's policies at 130 % on: {}", bad.join(", "));
        }
    }
    if let Some(gain) = &summary.fgd_cpu_over_fgd_at_130 {
        println!(
            "fgd-cpu over fgd at 130 %: higher by more than the seeds' standard error on {} of {} traces; \
             worst difference {:+.2} pp",
            gain.better,
            gain.traces.len(),
            gain.worst
        );
    }
    println!(
        "\nwrote {}/{{table,allocation,fragmentation,fragmentation_ratio}}.csv, summary.json, figures/",
        args.out.display()
    );
    serve(board)
}

/// With `--serve`: the final view until Ctrl-C or SIGTERM.
fn serve(board: Option<crate::dashboard::Board>) -> anyhow::Result<()> {
    board.map_or(Ok(()), crate::dashboard::Board::serve_until_interrupted)
}

/// The dashboard's rows of a finished grid: the table's figures and each mean allocation curve.
fn experiment_rows(outcomes: &[Outcome], rows: &[Row]) -> Vec<ExperimentRow> {
    let figure = |(mean, sd): (f64, f64)| mean.is_finite().then_some([mean, if sd.is_finite() { sd } else { 0.0 }]);
    rows.iter()
        .map(|r| ExperimentRow {
            trace: r.trace.clone(),
            policy: r.policy.clone(),
            at_100: figure(r.at_100),
            at_130: figure(r.at_130),
            allocation: experiment::mean_curve(outcomes, &r.trace, &r.policy, |o| &o.allocation),
        })
        .collect()
}

/// One row per experiment: `workload,sc_policy,tune,seed,total_gpus,0..130`, blank where empty.
fn write_series(
    path: &Path,
    outcomes: &[Outcome],
    tune: f64,
    column: fn(&Outcome) -> &[Option<f64>],
) -> anyhow::Result<()> {
    let mut s = String::from("workload,sc_policy,tune,seed,total_gpus");
    for c in 0..=MAX_COLUMN {
        let _ = write!(s, ",{c}");
    }
    s.push('\n');
    for o in outcomes {
        let _ = write!(s, "{},{},{tune},{},{}", o.trace, o.policy, o.seed, o.total_gpus);
        for v in column(o) {
            s.push(',');
            if let Some(v) = v {
                let _ = write!(s, "{v}");
            }
        }
        s.push('\n');
    }
    std::fs::write(path, s).with_context(|| format!("writing {}", path.display()))
}

fn write_table(path: &Path, rows: &[Row]) -> anyhow::Result<()> {
    let mut s = String::from("workload,policy,seeds,alloc_100_mean,alloc_100_std,alloc_130_mean,alloc_130_std\n");
    for r in rows {
        let _ = writeln!(
            s,
            "{},{},{},{:.4},{:.4},{:.4},{:.4}",
            r.trace, r.policy, r.seeds, r.at_100.0, r.at_100.1, r.at_130.0, r.at_130.1
        );
    }
    std::fs::write(path, s).with_context(|| format!("writing {}", path.display()))
}

/// One curve per policy against arrived workload (%), like the paper's Fig. 9(a).
/// Policies keep the paper's colours on every figure.
/// The figures of a grid: per trace, the allocation ratio (full and zoomed past 80 % arrived) and
/// the fragmented share, each as SVG and PNG, titled with every parameter of the run.
fn draw_figures(
    out: &Path,
    traces: &[String],
    policies: &[String],
    seeds_note: &str,
    tune: f64,
    runtime: &str,
    outcomes: &[Outcome],
) -> anyhow::Result<()> {
    std::fs::create_dir_all(out.join("figures")).with_context(|| format!("creating {}", out.display()))?;
    for name in traces {
        let curves = |column: fn(&Outcome) -> &[Option<f64>]| -> Vec<(String, Vec<Option<f64>>)> {
            policies.iter().map(|p| (p.clone(), experiment::mean_curve(outcomes, name, p, column))).collect()
        };
        let about = format!("openb {name} ({seeds_note}, tune {tune}, {runtime})");
        let allocation = curves(|o| &o.allocation);
        for (file, axes, what) in [
            (format!("figures/allocation_{name}.svg"), Axes::Full, "GPU allocation ratio"),
            // Where the policies part: past 80 % arrived, between round bounds around the curves.
            (format!("figures/allocation_{name}_zoom.svg"), Axes::ZoomFrom(80.0), "GPU allocation ratio, zoomed"),
        ] {
            plot(&out.join(file), &format!("{what}, {about}"), "GPU allocation ratio (%)", axes, &allocation)?;
        }
        plot(
            &out.join(format!("figures/fragmentation_{name}.svg")),
            &format!("Fragmented GPU share, {about}"),
            "fragmented GPU (% of capacity)",
            Axes::Full,
            &curves(|o| &o.fragmentation),
        )?;
    }
    Ok(())
}

/// `--redraw`: the outcomes read back from `allocation.csv` and `fragmentation.csv`, the run's
/// parameters from `summary.json`, and the figures drawn from them.
fn redraw(out: &Path) -> anyhow::Result<()> {
    let summary_path = out.join("summary.json");
    let text = std::fs::read_to_string(&summary_path)
        .with_context(|| format!("reading {} (give --out the folder of an earlier run)", summary_path.display()))?;
    #[derive(serde::Deserialize)]
    struct Ran {
        traces: Vec<String>,
        policies: Vec<String>,
        seeds: Vec<u64>,
        tune: f64,
        runtime: String,
    }
    let ran: Ran = serde_json::from_str(&text).with_context(|| format!("reading {}", summary_path.display()))?;
    let allocation = read_series(&out.join("allocation.csv"))?;
    let mut fragmentation = read_series(&out.join("fragmentation.csv"))?;
    let outcomes: Vec<Outcome> = allocation
        .into_iter()
        .map(|(key, allocation)| Outcome {
            fragmentation: fragmentation.remove(&key).unwrap_or_default(),
            trace: key.0,
            policy: key.1,
            seed: key.2,
            submitted: 0,
            placed: 0,
            faulted: 0,
            total_gpus: 0,
            allocation,
            fragmentation_ratio: Vec::new(),
            replay_time: std::time::Duration::ZERO,
        })
        .collect();
    let runtime = if ran.runtime == "native" { "native" } else { "Wasm" };
    let seeds_note = format!("{} seed{}", ran.seeds.len(), if ran.seeds.len() == 1 { "" } else { "s" });
    draw_figures(out, &ran.traces, &ran.policies, &seeds_note, ran.tune, runtime, &outcomes)?;
    println!("{} figures drawn again in {}", ran.traces.len() * 3 * 2, out.join("figures").display());
    Ok(())
}

/// A series CSV as `write_series` writes it: (trace, policy, seed) → the value per column.
type Series = std::collections::BTreeMap<(String, String, u64), Vec<Option<f64>>>;

fn read_series(path: &Path) -> anyhow::Result<Series> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut series = Series::new();
    for (n, line) in text.lines().enumerate().skip(1).filter(|(_, l)| !l.is_empty()) {
        let cells: Vec<&str> = line.split(',').collect();
        let bad =
            || format!("{} line {}: not `workload,sc_policy,tune,seed,total_gpus,columns…`", path.display(), n + 1);
        ensure!(cells.len() > 5, "{}", bad());
        let seed: u64 = cells[3].parse().with_context(bad)?;
        let values = cells[5..]
            .iter()
            .map(|c| if c.is_empty() { Ok(None) } else { c.parse::<f64>().map(Some) })
            .collect::<Result<Vec<_>, _>>()
            .with_context(bad)?;
        series.insert((cells[0].to_string(), cells[1].to_string(), seed), values);
    }
    Ok(series)
}

fn plot(
    path: &Path,
    title: &str,
    y_label: &str,
    axes: Axes,
    curves: &[(String, Vec<Option<f64>>)],
) -> anyhow::Result<()> {
    let curves: Vec<(String, Vec<(f64, f64)>)> = curves
        .iter()
        .map(|(name, ys)| (name.clone(), ys.iter().enumerate().filter_map(|(x, y)| y.map(|y| (x as f64, y))).collect()))
        .collect();
    crate::chart::lines(path, title, ("arrived workload (% of GPU capacity)", y_label), axes, &PAPER_POLICIES, &curves)
}
