//! A filter written against raw bindings of a world without the optional `mirror-usage` export —
//! what a component built in another language before that export existed looks like. Its filter
//! passes a slot only if its mirror holds the node with a whole GPU free, so it sees a device taken
//! only if the host sends usage changes to it as full upserts. Its fair share, from a world without
//! the optional `fair-share-delta` export, gives each queue what it requests, in list order: the
//! host must send it every queue on every call. Natively this crate is empty.
#![cfg_attr(not(target_family = "wasm"), allow(unused))]
// Raw wit-bindgen output declares exported `unsafe extern` functions.
#![allow(unsafe_code)]

#[cfg(target_family = "wasm")]
mod component {
    wit_bindgen::generate!({
        path: "../../../wit",
        inline: r#"
            package local:legacy;
            world legacy {
                import wasmsched:policy/host@0.2.0;
                import wasmsched:policy/topology@0.2.0;
                export wasmsched:policy/plugin@0.2.0;
                export wasmsched:policy/mirror@0.2.0;
                export wasmsched:policy/filter@0.2.0;
                export wasmsched:policy/fair-share@0.2.0;
            }
        "#,
        world: "local:legacy/legacy",
        generate_all,
    });

    use exports::wasmsched::policy::{fair_share, filter, mirror, plugin};
    use wasmsched::policy::types::{Node, Rejection, Resources, Stage, Task};

    /// Per slot: whether the mirrored node has a whole GPU free.
    static mut FREE: Vec<Option<bool>> = Vec::new();

    #[allow(static_mut_refs)]
    fn free() -> &'static mut Vec<Option<bool>> {
        // SAFETY: single-threaded guest; no reference outlives the export call using it.
        unsafe { &mut FREE }
    }

    struct Legacy;

    impl plugin::Guest for Legacy {
        fn init(_config: String) -> Result<plugin::PluginInfo, String> {
            Ok(plugin::PluginInfo {
                name: "legacy-mirror".into(),
                stages: vec![Stage::Filter, Stage::FairShare],
                sdk_version: "raw-bindings".into(),
            })
        }
    }

    impl mirror::Guest for Legacy {
        fn reset(_: u64, slots: u32) {
            *free() = vec![None; slots as usize];
        }
        fn upsert(_: u64, nodes: Vec<(u32, Node)>) {
            for (slot, node) in nodes {
                let slot = slot as usize;
                if slot >= free().len() {
                    free().resize(slot + 1, None);
                }
                free()[slot] = Some(node.gpus.iter().any(|g| g.free_milli >= 1000));
            }
        }
        fn remove(_: u64, slots: Vec<u32>) {
            for s in slots {
                if let Some(e) = free().get_mut(s as usize) {
                    *e = None;
                }
            }
        }
    }

    impl filter::Guest for Legacy {
        fn filter(_task: Task, candidates: Vec<u32>) -> Result<filter::FilterResult, String> {
            let codes = candidates.iter().map(|s| u16::from(free().get(*s as usize) != Some(&Some(true)))).collect();
            Ok(filter::FilterResult {
                codes,
                reasons: vec![Rejection { reason: "no whole GPU".into(), unresolvable: false }],
            })
        }
    }

    impl fair_share::Guest for Legacy {
        fn compute(queues: Vec<fair_share::QueueState>, _: Resources) -> Result<fair_share::ShareDecision, String> {
            Ok(fair_share::ShareDecision {
                order: (0..queues.len() as u32).collect(),
                deserved: queues.into_iter().map(|q| q.request).collect(),
            })
        }
    }

    export!(Legacy);
}
