//! Compiles the built-in policies to components; `src/lib.rs` embeds them.

const PLUGINS: [&str; 8] = [
    "wasmsched-plugin-resource-fit",
    "wasmsched-plugin-allocation-score",
    "wasmsched-plugin-node-affinity",
    "wasmsched-plugin-fair-share",
    "wasmsched-plugin-priority-preempt",
    "wasmsched-plugin-gpu-share-score",
    "wasmsched-plugin-gpu-topology",
    "wasmsched-plugin-domain-packing",
];

fn main() {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
    for (package, wasm) in wasmsched_guest_build::build(&PLUGINS) {
        let name = package.trim_start_matches("wasmsched-plugin-");
        std::fs::copy(&wasm, out.join(format!("{name}.wasm")))
            .unwrap_or_else(|e| panic!("copy {}: {e}", wasm.display()));
    }
}
