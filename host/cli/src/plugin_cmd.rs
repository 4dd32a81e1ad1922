//! `wasmsched plugin`: load a component the way the scheduler would and report what it is.

use std::path::PathBuf;
use std::time::Instant;

use wasmsched_core::PolicyPlugin;
use wasmsched_registry::{Sample, StageRun, exercise_stage};
use wasmsched_runtime::{PluginConfig, Runtime};

/// Plugin subcommands.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Load a plugin the way the scheduler does (compile, contract, init, under its budgets),
    /// then call every stage it exports twice on a small generated cluster and report each answer
    /// and the cost of both calls. Exits non-zero if loading or any stage fails; a deadline fault
    /// counts only if a retry on a fresh instance overruns too (the machine, not the plugin, may
    /// have taken the time), and the one it forgave is printed.
    Check {
        /// The component (`.wasm`).
        file: PathBuf,
        /// Configuration text handed to the plugin's init.
        #[arg(long, default_value = "")]
        config: String,
        /// Name to register it under, as a policy set's local name would (default: the file stem).
        #[arg(long)]
        name: Option<String>,
    },
    /// List the built-in plugins.
    List,
    /// Write a new policy project (Rust or Python) with a passing test of its behaviour and a
    /// build script that makes the component and a policy set using it.
    New(crate::plugin_new::Args),
}

pub fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::New(args) => crate::plugin_new::run(args),
        Command::List => {
            for b in wasmsched_plugins::ALL {
                println!("{:<16} {:>8} bytes  config {:?}", b.name, b.wasm.len(), b.config);
            }
            Ok(())
        }
        Command::Check { file, config, name } => {
            let rt = Runtime::new(crate::policy::runtime_config())?;
            let bytes = rt.read_component(&file)?;
            let name = name.unwrap_or_else(|| file.file_stem().map_or("plugin".into(), |s| s.to_string_lossy().into()));
            let t = Instant::now();
            let plugin = rt.load(&bytes, PluginConfig::new(&name).with_config(config))?;
            let config = plugin.config();
            match plugin.own_name() == plugin.name() {
                true => println!("plugin   {}", plugin.own_name()),
                false => println!("plugin   {} (registered here as {})", plugin.own_name(), plugin.name()),
            }
            println!("stages   {}", plugin.stages().iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "));
            println!("sdk      {}", plugin.sdk_version());
            println!("sha256   {}", plugin.digest());
            println!("loaded   in {:.1} ms (compile + instantiate + init)", t.elapsed().as_secs_f64() * 1e3);
            println!(
                "budgets  {:?} CPU per call (wall ceiling {:?}), {} MiB memory",
                config.deadline,
                config.effective_wall_ceiling(),
                config.memory_limit >> 20
            );
            let sample = Sample::synthetic();
            println!(
                "calls    on {} generated nodes, twice per stage (the first on a fresh instance):",
                sample.nodes.len()
            );
            let mut failed = 0;
            for &stage in plugin.stages() {
                let first = exercise_stage(&plugin, stage, &sample);
                let then = first.run.outcome.is_ok().then(|| exercise_stage(&plugin, stage, &sample));
                // The call that decides: the second when the first answered.
                let last = then.as_ref().unwrap_or(&first);
                let ms = |run: &StageRun| run.took.as_secs_f64() * 1e3;
                match (&first.run.outcome, &last.run.outcome) {
                    (Ok(answer), Ok(_)) => println!(
                        "  {:<15} ok     {:>8.3} ms, then {:.3} ms  {answer}",
                        stage.as_str(),
                        ms(&first.run),
                        ms(&last.run)
                    ),
                    (_, Err(fault)) | (Err(fault), _) => {
                        failed += 1;
                        println!(
                            "  {:<15} FAULT  {:>8.3} ms  {} ({})",
                            stage.as_str(),
                            ms(&last.run),
                            fault.message,
                            fault.kind.as_str()
                        );
                    }
                }
                for fault in [Some(&first), then.as_ref()].into_iter().flatten().filter_map(|t| t.overran.as_ref()) {
                    println!(
                        "  {:<15} note   one try overran its deadline ({}), its retry on a fresh instance did \
                         not: this machine stalled, or the stage is close to its budget",
                        "", fault.message
                    );
                }
            }
            if failed > 0 {
                anyhow::bail!("{failed} stage(s) of {name} faulted on the generated cluster");
            }
            Ok(())
        }
    }
}
