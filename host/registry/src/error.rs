//! Why a policy set version did not go live. Each error names what failed; none touches the live set.

/// The specification is malformed or breaks a rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("policy set {origin}: {message}")]
pub struct SpecError {
    /// File, object or other origin of the text.
    pub origin: String,
    /// What is wrong.
    pub message: String,
}

/// A source could not deliver a version.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The specification is invalid.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A file or object could not be read (missing, unreadable, the bucket is gone).
    #[error("{what}: {message}")]
    Fetch {
        /// What was fetched.
        what: String,
        /// Why it failed.
        message: String,
    },
}

/// A fetched version failed a gate of its preparation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    /// The artifact's bytes do not match the pinned digest (tampered, truncated, wrong file).
    #[error("plugin {plugin}: digest mismatch: pinned {pinned}, artifact is {actual}")]
    Digest {
        /// Local plugin name.
        plugin: String,
        /// What the spec pins.
        pinned: String,
        /// What the bytes hash to.
        actual: String,
    },
    /// Compilation, contract check or `init` failed.
    #[error("plugin {plugin}: {message}")]
    Load {
        /// Local plugin name.
        plugin: String,
        /// The runtime's error.
        message: String,
    },
    /// A plugin is used for a stage it does not implement.
    #[error("plugin {plugin} is used for {stage} but implements only {implemented}")]
    Stage {
        /// Local plugin name.
        plugin: String,
        /// The stage it is used for.
        stage: String,
        /// The stages it exports.
        implemented: String,
    },
    /// The smoke test failed: a plugin faulted or a decision took too long.
    #[error("smoke test: {0}")]
    Smoke(String),
    /// The shadow run did not pass its thresholds.
    #[error("shadow run: {0}")]
    Shadow(String),
}

impl PrepareError {
    /// The gate that failed, for status and metrics: `digest`, `load`, `stage`, `smoke`, `shadow`.
    pub fn gate(&self) -> &'static str {
        match self {
            PrepareError::Digest { .. } => "digest",
            PrepareError::Load { .. } => "load",
            PrepareError::Stage { .. } => "stage",
            PrepareError::Smoke(_) => "smoke",
            PrepareError::Shadow(_) => "shadow",
        }
    }
}
