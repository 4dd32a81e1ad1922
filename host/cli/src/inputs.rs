//! Trace inputs shared by `simulate` and `replay`: a given openb file, or the embedded default.

use std::path::Path;

use wasmsched_api::Node;
use wasmsched_sim::trace::{self, TraceError, TracePod};

const DEFAULT_NODES: &str = include_str!("../../../examples/traces/openb/openb_node_list_gpu_node.csv");
const DEFAULT_PODS: &str = include_str!("../../../examples/traces/openb/openb_pod_list_default.csv");

/// The node list at `path`, or the embedded openb GPU nodes.
pub fn nodes(path: Option<&Path>) -> Result<Vec<Node>, TraceError> {
    match path {
        Some(p) => trace::load_nodes(p),
        None => trace::parse_nodes("embedded openb_node_list_gpu_node.csv", DEFAULT_NODES),
    }
}

/// The pod list at `path`, or the embedded openb default trace; with `lenient`, malformed rows
/// are skipped and returned.
pub fn pods(path: Option<&Path>, lenient: bool) -> Result<(Vec<TracePod>, Vec<TraceError>), TraceError> {
    match path {
        Some(p) => trace::load_pods_lenient(p, lenient),
        None => trace::parse_pods_lenient("embedded openb_pod_list_default.csv", DEFAULT_PODS, lenient),
    }
}
