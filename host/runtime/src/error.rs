//! Errors loading a plugin. Faults during calls are `wasmsched_core::PluginFault`.

use std::path::PathBuf;

/// Why a plugin could not be loaded. Every variant names the plugin; the live policy set is
/// untouched by a failed load.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The bytes are not a valid component (truncated, corrupt, a core module, or not Wasm).
    #[error("plugin {plugin}: not a valid WebAssembly component: {message}")]
    Compile {
        /// Plugin name.
        plugin: String,
        /// Compiler message.
        message: String,
    },
    /// The component does not implement the contract: wrong world, incompatible version, or an
    /// import the host does not provide.
    #[error("plugin {plugin}: incompatible with wasmsched:policy@{}: {message}", wasmsched_api::CONTRACT_VERSION)]
    Contract {
        /// Plugin name.
        plugin: String,
        /// What is missing or mismatched.
        message: String,
    },
    /// The plugin rejected its configuration (or trapped while reading it).
    #[error("plugin {plugin}: configuration rejected: {message}")]
    Config {
        /// Plugin name.
        plugin: String,
        /// The plugin's message.
        message: String,
    },
    /// The runtime's own configuration is invalid.
    #[error("runtime configuration: {0}")]
    Runtime(String),
    /// The artifact cache directory cannot be used.
    #[error("artifact cache {path}: {source}")]
    Cache {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}
