//! Compiled-artifact cache: compile a component once per (content, engine) and reuse it.
//!
//! In memory for the life of the runtime, and optionally on disk across restarts. A disk entry is
//! `<sha256(wasm)>-<engine hash>.cwasm` with a `.sha256` sidecar of the artifact; an entry whose
//! digest does not match (truncated write, bit rot, tampering) is ignored and rebuilt, because
//! deserialising an artifact trusts it completely.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use crate::error::LoadError;

/// Hex sha256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) struct ArtifactCache {
    dir: Option<PathBuf>,
    /// Largest artefact compiled or read back; larger ones are refused.
    max_bytes: u64,
    engine_hash: String,
    memory: Mutex<HashMap<String, Component>>,
}

/// Where a component came from, for metrics and the hot-reload timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    Memory,
    Disk,
    Compiled,
}

impl ArtifactCache {
    pub(crate) fn new(engine: &Engine, dir: Option<PathBuf>, max_bytes: u64) -> Result<Self, LoadError> {
        if let Some(dir) = &dir {
            std::fs::create_dir_all(dir).map_err(|source| LoadError::Cache { path: dir.clone(), source })?;
        }
        let mut h = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        Ok(ArtifactCache {
            dir,
            max_bytes,
            engine_hash: format!("{:016x}", h.finish()),
            memory: Mutex::new(HashMap::new()),
        })
    }

    pub(crate) fn get_or_compile(
        &self,
        engine: &Engine,
        plugin: &str,
        wasm: &[u8],
    ) -> Result<(Component, Origin), LoadError> {
        let key = format!("{}-{}", sha256_hex(wasm), self.engine_hash);
        if let Some(c) = self.memory.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok((c.clone(), Origin::Memory));
        }
        let disk = self.dir.as_deref().map(|d| d.join(format!("{key}.cwasm")));
        let (component, origin) = match disk.as_deref().and_then(|p| load_verified(engine, p, self.max_bytes)) {
            Some(c) => (c, Origin::Disk),
            None => {
                let artifact = engine.precompile_component(wasm).map_err(|e| LoadError::Compile {
                    plugin: plugin.into(),
                    message: first_line(&format!("{e:#}")),
                })?;
                if artifact.len() as u64 > self.max_bytes {
                    return Err(LoadError::ArtifactTooLarge {
                        plugin: plugin.into(),
                        size: artifact.len() as u64,
                        limit: self.max_bytes,
                    });
                }
                if let Some(path) = &disk {
                    store(path, &artifact);
                }
                (
                    deserialize(engine, &artifact)
                        .map_err(|message| LoadError::Compile { plugin: plugin.into(), message })?,
                    Origin::Compiled,
                )
            }
        };
        self.memory.lock().unwrap_or_else(|e| e.into_inner()).insert(key, component.clone());
        Ok((component, origin))
    }
}

/// wasmparser's messages can carry multi-line debug dumps; one line is enough for an operator.
fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().trim_end_matches(&[' ', '-', '=', '['][..]).to_string()
}

#[allow(unsafe_code)]
fn deserialize(engine: &Engine, artifact: &[u8]) -> Result<Component, String> {
    // SAFETY: `artifact` was produced by `Engine::precompile_component` on an engine with the same
    // compatibility hash, either just now or read back from disk after its sha256 matched the
    // digest written beside it, so it is a well-formed artifact of ours.
    unsafe { Component::deserialize(engine, artifact) }.map_err(|e| format!("{e:#}"))
}

fn load_verified(engine: &Engine, path: &Path, max_bytes: u64) -> Option<Component> {
    // An artefact over the limit is never read: the disk cache is not trusted with memory either.
    if std::fs::metadata(path).ok()?.len() > max_bytes {
        tracing::warn!(path = %path.display(), "cached artifact over the size limit; ignored");
        return None;
    }
    let artifact = std::fs::read(path).ok()?;
    let digest = std::fs::read_to_string(path.with_extension("sha256")).ok()?;
    if digest.trim() != sha256_hex(&artifact) {
        tracing::warn!(path = %path.display(), "cached artifact does not match its digest; recompiling");
        return None;
    }
    deserialize(engine, &artifact)
        .inspect_err(|e| tracing::warn!(path = %path.display(), error = %e, "cached artifact unusable; recompiling"))
        .ok()
}

/// Best effort: a cache that cannot be written only costs a recompile next time.
fn store(path: &Path, artifact: &[u8]) {
    // A name per process: concurrent schedulers (or test runs) sharing a cache never write into
    // each other's temporary file; the rename is atomic and the digest check covers the rest.
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    let result = std::fs::write(&tmp, artifact)
        .and_then(|()| std::fs::write(path.with_extension("sha256"), sha256_hex(artifact)))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = result {
        tracing::warn!(path = %path.display(), error = %e, "could not write compiled artifact to cache");
    }
}
