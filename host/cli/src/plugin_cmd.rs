//! `wasmsched plugin`: load a component the way the scheduler would and report what it is.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use wasmsched_core::PolicyPlugin;
use wasmsched_runtime::{PluginConfig, Runtime};

/// Plugin subcommands.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Compile, check the contract and initialise a plugin with its configuration.
    Check {
        /// The component (`.wasm`).
        file: PathBuf,
        /// Configuration text handed to the plugin's init.
        #[arg(long, default_value = "")]
        config: String,
        /// Name to register it under (default: the file stem).
        #[arg(long)]
        name: Option<String>,
    },
    /// List the built-in plugins.
    List,
}

pub fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::List => {
            for b in wasmsched_plugins::ALL {
                println!("{:<16} {:>8} bytes  config {:?}", b.name, b.wasm.len(), b.config);
            }
            Ok(())
        }
        Command::Check { file, config, name } => {
            let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let name = name.unwrap_or_else(|| file.file_stem().map_or("plugin".into(), |s| s.to_string_lossy().into()));
            let rt = Runtime::new(crate::policy::runtime_config())?;
            let t = Instant::now();
            let plugin = rt.load(&bytes, PluginConfig::new(&name).with_config(config))?;
            println!("plugin   {}", plugin.name());
            println!("stages   {}", plugin.stages().iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "));
            println!("sdk      {}", plugin.sdk_version());
            println!("sha256   {}", plugin.digest());
            println!("loaded   in {:.1} ms (compile + instantiate + init)", t.elapsed().as_secs_f64() * 1e3);
            Ok(())
        }
    }
}
