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
    /// The plugin's `init` returned an error: it rejected its configuration.
    #[error("plugin {plugin}: configuration rejected: {message}")]
    Config {
        /// Plugin name.
        plugin: String,
        /// The plugin's message.
        message: String,
    },
    /// Instantiation or `init` failed without an answer: a trap, the deadline, the memory cap, an
    /// exit. The message names the cause.
    #[error("plugin {plugin}: {message}")]
    Init {
        /// Plugin name.
        plugin: String,
        /// What went wrong, in words.
        message: String,
    },
    /// The component file is larger than the runtime accepts.
    #[error("plugin {plugin}: the component is {size} bytes, over the limit of {limit} bytes")]
    TooLarge {
        /// Plugin name (or file).
        plugin: String,
        /// Its size in bytes.
        size: u64,
        /// The limit in bytes.
        limit: u64,
    },
    /// A component file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The compiled artefact is larger than the runtime accepts.
    #[error("plugin {plugin}: compiled, it is {size} bytes, over the limit of {limit} bytes")]
    ArtifactTooLarge {
        /// Plugin name.
        plugin: String,
        /// Its size in bytes.
        size: u64,
        /// The limit in bytes.
        limit: u64,
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
