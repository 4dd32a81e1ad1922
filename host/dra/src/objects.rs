//! DRA objects as people already have them: multi-document YAML or JSON, single objects or
//! `kubectl get -o yaml` lists, in any mix of kinds.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use serde::Deserialize;

/// Everything read, by kind.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    /// ResourceSlices.
    pub slices: Vec<ResourceSlice>,
    /// DeviceClasses.
    pub classes: Vec<DeviceClass>,
    /// ResourceClaims (allocated ones hold their devices).
    pub claims: Vec<ResourceClaim>,
    /// ResourceClaimTemplates.
    pub templates: Vec<ResourceClaimTemplate>,
    /// Nodes.
    pub nodes: Vec<Node>,
    /// DeviceTaintRules (`resource.k8s.io/v1beta2`): taints on the devices they select.
    pub taint_rules: Vec<k8s_openapi::api::resource::v1beta2::DeviceTaintRule>,
    /// Objects of other kinds, skipped: (file, kind).
    pub skipped: Vec<(PathBuf, String)>,
}

/// A file that could not be read as Kubernetes objects.
#[derive(Debug, thiserror::Error)]
pub enum ObjectsError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A document is not YAML or JSON, or not an object of its kind.
    #[error("{path}: document {document}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The document's position (1-based).
        document: usize,
        /// What is wrong.
        message: String,
    },
}

impl Objects {
    /// Read `path` and add its objects.
    pub fn read(&mut self, path: &Path) -> Result<(), ObjectsError> {
        let text = std::fs::read_to_string(path).map_err(|source| ObjectsError::Read { path: path.into(), source })?;
        self.add(path, &text)
    }

    /// Add the objects of `text` (read from `path`, named in errors).
    pub fn add(&mut self, path: &Path, text: &str) -> Result<(), ObjectsError> {
        for (i, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
            let parse = |message: String| ObjectsError::Parse { path: path.into(), document: i + 1, message };
            let value = serde_json::Value::deserialize(document).map_err(|e| parse(e.to_string()))?;
            if value.is_null() {
                continue;
            }
            self.add_value(path, value).map_err(parse)?;
        }
        Ok(())
    }

    fn add_value(&mut self, path: &Path, value: serde_json::Value) -> Result<(), String> {
        let kind = value.get("kind").and_then(|k| k.as_str()).ok_or("no `kind`")?.to_string();
        if kind.ends_with("List") {
            let items = value.get("items").and_then(|i| i.as_array()).cloned().unwrap_or_default();
            for (n, item) in items.into_iter().enumerate() {
                // Items of a typed list (`ResourceSliceList`) may leave out their kind.
                let item = match item {
                    serde_json::Value::Object(mut o) if !o.contains_key("kind") && kind != "List" => {
                        o.insert("kind".into(), kind.trim_end_matches("List").into());
                        serde_json::Value::Object(o)
                    }
                    other => other,
                };
                self.add_value(path, item).map_err(|e| format!("item {}: {e}", n + 1))?;
            }
            return Ok(());
        }
        let typed = |what: &str, e: serde_json::Error| format!("not a valid {what}: {e}");
        match kind.as_str() {
            "ResourceSlice" => self.slices.push(serde_json::from_value(value).map_err(|e| typed(&kind, e))?),
            "DeviceClass" => self.classes.push(serde_json::from_value(value).map_err(|e| typed(&kind, e))?),
            "ResourceClaim" => self.claims.push(serde_json::from_value(value).map_err(|e| typed(&kind, e))?),
            "ResourceClaimTemplate" => self.templates.push(serde_json::from_value(value).map_err(|e| typed(&kind, e))?),
            "Node" => self.nodes.push(serde_json::from_value(value).map_err(|e| typed(&kind, e))?),
            "DeviceTaintRule" => self.taint_rules.push(serde_json::from_value(value).map_err(|e| typed(&kind, e))?),
            _ => self.skipped.push((path.into(), kind)),
        }
        Ok(())
    }
}
