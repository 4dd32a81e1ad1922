//! The components compiled into the binary that runs the registry, by name (`builtin:NAME`).
//!
//! The registry does not know which components those are: the binary hands it its table. So the
//! registry is the same for every build (a scheduler with the standard plugins, a test with a few,
//! an embedder with its own), and a built-in is loaded through the same gates as any artifact.

use std::collections::BTreeMap;

/// One compiled-in component and the configuration it runs with when a set gives none.
#[derive(Clone, Copy, Debug)]
pub struct BuiltIn {
    /// The component binary.
    pub wasm: &'static [u8],
    /// Configuration used when the policy set's entry has no `config`.
    pub default_config: &'static str,
}

/// The built-in table: name → component.
#[derive(Clone, Debug, Default)]
pub struct BuiltIns {
    by_name: BTreeMap<&'static str, BuiltIn>,
}

impl BuiltIns {
    /// No built-ins: every `builtin:` source is refused with the message of an unknown name.
    pub fn none() -> BuiltIns {
        BuiltIns::default()
    }

    /// Add (or replace) `name`.
    pub fn with(mut self, name: &'static str, wasm: &'static [u8], default_config: &'static str) -> BuiltIns {
        self.by_name.insert(name, BuiltIn { wasm, default_config });
        self
    }

    /// The built-in `name`, or an error that lists the ones there are.
    pub fn get(&self, name: &str) -> Result<BuiltIn, String> {
        self.by_name.get(name).copied().ok_or_else(|| {
            let names: Vec<&str> = self.by_name.keys().copied().collect();
            match names.is_empty() {
                true => format!("no built-in plugin {name:?} (this binary has none)"),
                false => format!("no built-in plugin {name:?} (built-ins: {})", names.join(", ")),
            }
        })
    }
}

impl FromIterator<(&'static str, &'static [u8], &'static str)> for BuiltIns {
    fn from_iter<I: IntoIterator<Item = (&'static str, &'static [u8], &'static str)>>(iter: I) -> BuiltIns {
        iter.into_iter().fold(BuiltIns::none(), |t, (name, wasm, config)| t.with(name, wasm, config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_name_lists_what_there_is() {
        let table = BuiltIns::none().with("b", b"\0asm", "").with("a", b"\0asm", "{}");
        assert_eq!(table.get("a").unwrap().default_config, "{}");
        assert_eq!(table.get("c").unwrap_err(), "no built-in plugin \"c\" (built-ins: a, b)");
        assert!(BuiltIns::none().get("a").unwrap_err().contains("has none"));
    }
}
