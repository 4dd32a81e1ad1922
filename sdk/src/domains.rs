//! Topology beyond the node from the host: the cluster's levels (NVLink clique, rack, block —
//! node labels, innermost first) and the capacity of each domain of each level.
//!
//! The host keeps each domain's free GPUs as placements change, so a score asks about a
//! candidate's domain instead of summing the mirror's nodes. A [`Lookup`] made for one call names
//! each candidate's domain from its labels and asks the host once per distinct domain. In a
//! component the questions go through the `domains` import; natively (tests, the host's own
//! baseline) they read the view the host installed for the call. With no levels configured there
//! is no domain, so a plugin must have an answer for that case (usually: score every node alike).
//!
//! ```
//! use wasmsched_sdk::{Node, domains};
//!
//! fn breaks_a_whole_clique(lookup: &mut domains::Lookup, node: &Node) -> bool {
//!     lookup.of(node, 0).is_some_and(|d| d.is_whole())
//! }
//! # assert!(!breaks_a_whole_clique(&mut domains::Lookup::new(), &Node::default()));
//! ```

use crate::Node;
pub use wasmsched_api::domains::{Domain, domain_name, domain_name_into};

/// The levels' node labels, innermost first; empty when the host has none configured.
pub fn levels() -> Vec<String> {
    #[cfg(target_family = "wasm")]
    {
        crate::__private::levels()
    }
    #[cfg(not(target_family = "wasm"))]
    {
        wasmsched_api::domains::current().map(|v| v.levels()).unwrap_or_default()
    }
}

/// The domain of level `level` (an index into [`levels`]) named `name`; None when no node is in it.
pub fn domain(level: u32, name: &str) -> Option<Domain> {
    #[cfg(target_family = "wasm")]
    {
        crate::__private::domain(level, name)
    }
    #[cfg(not(target_family = "wasm"))]
    {
        wasmsched_api::domains::current()?.domain(level, name)
    }
}

/// Domain answers for one call: the levels asked once, each domain asked once. Answers hold for
/// the call they were made in (the host's sums move with every placement), so make a new one per
/// call.
#[derive(Debug, Default)]
pub struct Lookup {
    levels: Option<Vec<String>>,
    /// Per level, each domain name asked about → its answer in `answers`.
    known: Vec<ahash::AHashMap<String, usize>>,
    answers: Vec<Option<Domain>>,
    /// The name being looked up: no allocation per node once its domain is known.
    name: String,
}

impl Lookup {
    /// Nothing asked yet.
    pub fn new() -> Lookup {
        Lookup::default()
    }

    /// The levels' labels, innermost first.
    pub fn levels(&mut self) -> &[String] {
        self.levels.get_or_insert_with(levels)
    }

    /// The domain of level `level` that `node` is in; None when the node lacks that level's
    /// label or there is no such level.
    pub fn of(&mut self, node: &Node, level: u32) -> Option<&Domain> {
        let levels = self.levels.get_or_insert_with(levels);
        let labels = levels.get(level as usize..)?;
        if !domain_name_into(node, labels, &mut self.name) {
            return None;
        }
        if self.known.len() < levels.len() {
            self.known.resize_with(levels.len(), Default::default);
        }
        let known = &mut self.known[level as usize];
        // One hash per node once its domain is known.
        let at = match known.get(self.name.as_str()) {
            Some(&at) => at,
            None => {
                self.answers.push(domain(level, &self.name));
                known.insert(self.name.clone(), self.answers.len() - 1);
                self.answers.len() - 1
            }
        };
        self.answers[at].as_ref()
    }
}
