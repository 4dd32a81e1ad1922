//! The candidates of a filter or score call, looked up in the guest's node mirror.
// Used by the component glue, which exists only on Wasm targets; tested natively.
#![cfg_attr(not(target_family = "wasm"), allow(dead_code))]

use std::cell::Cell;
use std::sync::OnceLock;

use wasmsched_api::Node;

/// The candidates' nodes, lazily, in one pass: filters and scores walk them once (a vector of
/// them first was a second pass and an allocation per call; checking every slot before the walk
/// was another pass, 1-2 ns a node in the guest). A slot the mirror does not hold — the host and
/// the mirror disagree, which the host repairs by resending — yields an empty node and is
/// remembered in `missing`; the caller then fails the call with [`missing_slot`], whatever the
/// plugin answered.
pub(crate) fn resolved<'a, 's>(
    nodes: &'a [Option<Node>],
    slots: &'s [u32],
    missing: &'s Cell<Option<u32>>,
) -> impl ExactSizeIterator<Item = &'a Node> + use<'a, 's> {
    static EMPTY: OnceLock<Node> = OnceLock::new();
    slots.iter().map(move |&slot| match nodes.get(slot as usize) {
        Some(Some(node)) => node,
        _ => {
            // The first one is reported.
            missing.set(Some(missing.get().unwrap_or(slot)));
            EMPTY.get_or_init(Node::default)
        }
    })
}

/// The error of a call that named a slot the mirror does not hold ([`resolved`]).
pub(crate) fn missing_slot(missing: &Cell<Option<u32>>, generation: u64) -> Result<(), String> {
    match missing.get() {
        Some(slot) => Err(format!("node slot {slot} is not in the mirror (generation {generation})")),
        None => Ok(()),
    }
}

/// [`resolved`], collected: for stages that look at nodes more than once.
pub(crate) fn resolve<'a>(nodes: &'a [Option<Node>], slots: &[u32], generation: u64) -> Result<Vec<&'a Node>, String> {
    let missing = Cell::new(None);
    let resolved: Vec<&Node> = resolved(nodes, slots, &missing).collect();
    missing_slot(&missing, generation).map(|()| resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> Node {
        Node { name: name.into(), ..Node::default() }
    }

    #[test]
    fn candidates_resolve_in_one_pass_and_a_slot_the_mirror_lacks_fails_the_call() {
        let mirror = vec![Some(node("a")), None, Some(node("c"))];
        let missing = Cell::new(None);
        let names: Vec<&str> = resolved(&mirror, &[2, 0, 2], &missing).map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["c", "a", "c"]);
        assert_eq!(missing_slot(&missing, 4), Ok(()));

        // An empty slot and one past the end: every candidate still yields a node (so the batch
        // keeps its length), and the first slot missing is the one reported.
        let missing = Cell::new(None);
        let walked = resolved(&mirror, &[0, 1, 9, 2], &missing);
        assert_eq!(walked.len(), 4);
        let names: Vec<&str> = walked.map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a", "", "", "c"]);
        assert_eq!(missing_slot(&missing, 4), Err("node slot 1 is not in the mirror (generation 4)".into()));
        assert_eq!(
            resolve(&mirror, &[2, 9], 5).err().as_deref(),
            Some("node slot 9 is not in the mirror (generation 5)")
        );
        assert_eq!(resolve(&mirror, &[2, 0], 5).map(|v| v.len()), Ok(2));
    }
}
