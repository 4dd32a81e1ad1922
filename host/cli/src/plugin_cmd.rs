//! `wasmsched plugin`: load a component the way the scheduler would and report what it is.

use std::path::PathBuf;
use std::time::Instant;

use wasmsched_core::PolicyPlugin;
use wasmsched_registry::{Sample, exercise};
use wasmsched_runtime::{PluginConfig, Runtime};

/// Plugin subcommands.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Load a plugin the way the scheduler does (compile, contract, init, under its budgets),
    /// then call every stage it exports on a small generated cluster and report each answer and
    /// its cost. Exits non-zero if loading or any stage fails.
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
            println!("calls    on {} generated nodes:", sample.nodes.len());
            let mut failed = 0;
            for run in exercise(&plugin, plugin.stages(), &sample) {
                let took = run.took.as_secs_f64() * 1e3;
                match run.outcome {
                    Ok(answer) => println!("  {:<15} ok     {took:>8.3} ms  {answer}", run.stage.as_str()),
                    Err(fault) => {
                        failed += 1;
                        println!(
                            "  {:<15} FAULT  {took:>8.3} ms  {} ({})",
                            run.stage.as_str(),
                            fault.message,
                            fault.kind.as_str()
                        );
                    }
                }
            }
            if failed > 0 {
                anyhow::bail!("{failed} stage(s) of {name} faulted on the generated cluster");
            }
            Ok(())
        }
    }
}
